package prefix

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// A Fill is a transfer into reserved blocks that something other than this
// process's stores writes (a network transfer: the node uplink's cluster
// fetch), as one transaction owned here, so that its rules have one home:
//
//   - it holds the client's gate (tier.Hold) from BeginFill until Commit or
//     Close, so the mapping stays under the transfer whatever closes;
//   - Blocks checks the lease right before it says where to write: a block
//     of a client that was reaped may be another's;
//   - Commit checks the lease again, checks each filled block against the
//     checksum it must match, flushes and publishes the good ones and aborts
//     the others; any failure aborts what was not published;
//   - Close aborts whatever was not committed.
//
// A fill neither committed nor closed keeps its client open: Client.Close
// waits for it (bounded by the client's CloseWait).
type Fill struct {
	s    *Store
	held tier.Hold
	res  []Reservation

	mu    sync.Mutex
	over  bool          // committed or closed
	pacer kernels.Pacer // the link's turns for the commit's checks; nil: none

	// flush, in tests, stands in for the payload flush (tier.Region.Publish).
	flush func(off tier.Offset, n int64) error
}

// BeginFill reserves a block of sizes[i] bytes for each key, as Reserve
// does, and starts a fill of them. Statuses says which keys got a block.
func (s *Store) BeginFill(keys []Key, sizes []int64) (*Fill, error) {
	held, err := s.hold("begin fill")
	if err != nil {
		return nil, err
	}
	res, err := s.Reserve(keys, sizes)
	if res == nil {
		held.Done()
		return nil, err
	}
	f := &Fill{s: s, held: held, res: res, flush: s.flushData}
	return f, err
}

// Pace makes the commit take a turn of p for each page before it reads it
// (its check, and a keyed index's copy to sign): a fill's check reads
// every byte the transfer wrote, bulk traffic on the node's link (the
// tier's memory), which gives way while another transfer's deadline is
// due as the engines' block calls do (tier/link). A page is the piece: a
// deadline waits for at most one page's check on each core. Call it
// before Commit; nil stops pacing.
func (f *Fill) Pace(p kernels.Pacer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pacer = p
}

// Statuses is each key's reservation status (Reserved: it has a block).
func (f *Fill) Statuses() []Status { return Statuses(f.res) }

// Blocks is where each reserved key's payload goes, in place in the tier
// mapping (nil for a key without a block), valid until Commit or Close.
// It checks the lease first: call it right before the transfer starts.
func (f *Fill) Blocks() ([][]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.over {
		return nil, ErrFillOver
	}
	if err := f.held.Fenced(); err != nil {
		return nil, fmt.Errorf("prefix: %q: fill: %w", f.s.name, err)
	}
	out := make([][]byte, len(f.res))
	for i, r := range f.res {
		if r.Status != Reserved {
			continue
		}
		b, err := f.s.r.Slice(r.Offset, r.Len)
		if err != nil {
			return nil, fmt.Errorf("prefix: %q: %v: %w", f.s.name, r.Key, err)
		}
		out[i] = b
	}
	return out, nil
}

// Slack is, for each reserved key whose block has room for n bytes after
// its payload, those n bytes as the transfer left them (where a one-piece
// transfer put the page's trailer); nil for the others. Valid until Commit
// or Close.
func (f *Fill) Slack(n int) ([][]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.over {
		return nil, ErrFillOver
	}
	out := make([][]byte, len(f.res))
	for i, r := range f.res {
		if r.Status != Reserved || r.Len+int64(n) > f.s.g.BlockStride {
			continue
		}
		b, err := f.s.payload(r.Offset+tier.Offset(r.Len), int64(n))
		if err != nil {
			return nil, fmt.Errorf("prefix: %q: %v: %w", f.s.name, r.Key, err)
		}
		out[i] = b
	}
	return out, nil
}

// Check judges the payload a transfer wrote for key i of a fill: nil and
// the payload's WireChecksum if it is the page it should be, an error
// (damaged, unauthenticated) if not. It reads the payload once.
type Check func(i int, payload []byte) (uint32, error)

// WantChecksums is the Check of pages that must match known checksums.
func WantChecksums(keys func(i int) Key, want []uint32) Check {
	return func(i int, payload []byte) (uint32, error) {
		if got := WireChecksum(keys(i), payload); got != want[i] {
			return 0, fmt.Errorf("%w: %#x, want %#x", ErrChecksum, got, want[i])
		}
		return want[i], nil
	}
}

// Commit ends the fill: it publishes each reserved block that the transfer
// filled (filled[i]) and whose payload check passes, aborts the others,
// and reports which were published. A lost lease (ErrLost) publishes
// nothing: the reaper has taken the reservations back.
func (f *Fill) Commit(filled []bool, check Check) ([]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.over {
		return nil, ErrFillOver
	}
	f.over = true
	defer f.held.Done()
	if len(filled) != len(f.res) || check == nil {
		err := fmt.Errorf("prefix: %q: fill commit: %d reservations, %d filled flags: %w",
			f.s.name, len(f.res), len(filled), ErrBadConfig)
		return nil, errors.Join(err, f.s.Abort(f.res))
	}
	if err := f.held.Fenced(); err != nil {
		return nil, fmt.Errorf("prefix: %q: fill commit: %w: %w", f.s.name, ErrLost, err)
	}
	for i := range f.res {
		if !filled[i] && f.res[i].Status == Reserved {
			if err := f.s.Abort(f.res[i : i+1]); err != nil {
				return nil, errors.Join(err, f.s.Abort(f.res))
			}
			f.res[i].Status = NoSpace
		}
	}
	return f.s.publishWritten(f.res, check, f.flush, f.pacer)
}

// Close aborts whatever the fill did not commit; after Commit it does
// nothing.
func (f *Fill) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.over {
		return nil
	}
	f.over = true
	defer f.held.Done()
	return f.s.Abort(f.res)
}

// publishWritten publishes the reservations whose blocks, written in place
// by a transfer, pass check, and aborts the others: a damaged, short or
// forged transfer becomes a miss, never an entry. A block that cannot be
// flushed aborts every reservation not yet published.
func (s *Store) publishWritten(res []Reservation, check Check, flush func(tier.Offset, int64) error, pacer kernels.Pacer) ([]bool, error) {
	held, herr := s.hold("publish written")
	if herr != nil {
		return nil, errors.Join(herr, s.Abort(res))
	}
	defer held.Done()
	ok := make([]bool, len(res))
	good, crcs := make([]Reservation, 0, len(res)), make([]uint32, 0, len(res))
	bad := make([]Reservation, 0)
	checked := s.checkWritten(res, check, pacer)
	for i, r := range res {
		if r.Status != Reserved {
			continue
		}
		b, wire, err := checked[i].payload, checked[i].wire, checked[i].err
		if err != nil {
			bad = append(bad, r)
			continue
		}
		if err := flush(r.Offset, r.Len); err != nil {
			err = fmt.Errorf("prefix: %q: %v: flush: %w", s.name, r.Key, err)
			return make([]bool, len(res)), errors.Join(err, s.Abort(res))
		}
		ok[i] = true
		r.mac = checked[i].mac
		good = append(good, r)
		// The tier's own checksum, which differs from the wire's only on
		// layouts before 5.
		if s.wireIsEntry() {
			crcs = append(crcs, wire)
		} else {
			crcs = append(crcs, s.Checksum(r.Key, b))
		}
	}
	aerr := s.Abort(bad)
	if err := s.Publish(good, crcs); err != nil {
		return ok, errors.Join(err, aerr)
	}
	return ok, aerr
}

// written is one reservation's payload as a transfer wrote it, judged.
type written struct {
	payload []byte
	wire    uint32
	mac     [macBytes]byte // a keyed index's signature of what check passed
	err     error
}

// checkWritten runs check over every reserved payload of res, on several
// cores when the batch is megabytes: a check reads each payload once,
// from memory (the transfer wrote it there, not into this core's cache),
// and a fetch of a batch of 2 MiB pages spent as long checking as the
// network took to bring them. Checks touch nothing but their own payload.
func (s *Store) checkWritten(res []Reservation, check Check, pacer kernels.Pacer) []written {
	out := make([]written, len(res))
	var total int64
	for _, r := range res {
		if r.Status == Reserved {
			total += r.Len
		}
	}
	eachInParallel(len(res), total, func(i int) {
		if res[i].Status != Reserved {
			return
		}
		w := &out[i]
		if pacer != nil {
			pacer.Turn(res[i].Len)
		}
		if w.payload, w.err = s.payload(res[i].Offset, res[i].Len); w.err != nil {
			return
		}
		if s.mac == nil {
			w.wire, w.err = check(i, w.payload)
			return
		}
		// A keyed index signs what check passed: a private copy, which a
		// writer racing the fill cannot change between the two (in place,
		// it could have check pass one page and the signature cover another).
		mine := append([]byte(nil), w.payload...)
		if w.wire, w.err = check(i, mine); w.err == nil {
			w.mac = s.sign(&res[i].Key, [][]byte{mine})
		}
	})
	return out
}
