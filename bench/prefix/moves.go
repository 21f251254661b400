package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/cxltier/cxltier/prefix"
)

// MoveResult is one batch of block moves against a plain copy of the same
// bytes: -move-blocks blocks, each from its own source buffer into its own
// destination (no buffer reused within a round, so no block is served from
// a cache the previous one warmed), every buffer written once before the
// clock starts so page faults are not measured on either side.
type MoveResult struct {
	Op         string  `json:"op"`         // put, get (verified), get-unverified
	DstOffset  int     `json:"dst_offset"` // where the get's destinations start past a page
	Blocks     int     `json:"blocks"`
	BlockBytes int64   `json:"block_bytes"`
	Rounds     int     `json:"rounds"`
	MinMs      float64 `json:"min_ms"`
	MedianMs   float64 `json:"median_ms"`
	MaxMs      float64 `json:"max_ms"`
	CopyMs     float64 `json:"copy_median_ms"` // the plain copy of the same bytes, same rounds
	GBps       float64 `json:"gb_per_s"`       // bytes / median
	VsCopy     float64 `json:"vs_copy"`        // copy median / this median: 1 is memory speed
	// The same copy split over every core (GOMAXPROCS goroutines), as the
	// store splits a batch of megabytes: what one core's copy leaves unused.
	CoresCopyMs float64 `json:"cores_copy_median_ms"`
	VsCoresCopy float64 `json:"vs_cores_copy"`
	// On a get: its median over the unverified get's, same destinations.
	VerifiedOverUnverified float64 `json:"verified_over_unverified,omitempty"`
}

// moveCases times put, get and unverified get of a batch of blocks, each
// round beside a plain copy of the same bytes between the same buffers,
// once for each destination offset past a page (-move-dst-offsets: a
// verified get's speed depends on it; numpy, torch and malloc buffers
// usually start 16 bytes past a page).
func moveCases(o options, log io.Writer) ([]MoveResult, error) {
	if o.moveBlocks == 0 {
		return nil, nil
	}
	n, size := o.moveBlocks, o.moveBytes
	dev := fmt.Sprintf("shm:cxltier-bench-prefix-mv-%d", os.Getpid())
	r, c, err := formatShm(dev, int64(n)*size+size*4+32<<20)
	if err != nil {
		return nil, err
	}
	defer removeShm(r, c, dev)
	s, err := prefix.Create(c, prefix.Config{Name: "moves", Blocks: int64(n), BlockBytes: size})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	src, keys := make([][]byte, n), make([]prefix.Key, n)
	for i := range src {
		src[i], keys[i] = randomBlock(size, uint64(i)+100), benchKey(11, uint64(i))
	}
	var out []MoveResult
	for _, off := range o.moveOffsets {
		fmt.Fprintf(log, "block moves: %d × %d KiB into destinations %d bytes past a page, %d rounds...\n",
			n, size>>10, off, o.moveRounds)
		rows, err := moveCasesAt(o, s, keys, src, off)
		if err != nil {
			return nil, fmt.Errorf("destinations +%d: %w", off, err)
		}
		out = append(out, rows...)
	}
	return out, nil
}

// moveCasesAt is moveCases for destinations off bytes past a page.
func moveCasesAt(o options, s *prefix.Store, keys []prefix.Key, src [][]byte, off int) ([]MoveResult, error) {
	dst := make([][]byte, len(src))
	for i := range dst {
		dst[i] = pagePlus(len(src[i]), off) // faulted in now, not inside a timed round
	}
	var put, get, raw, plain, cores []time.Duration
	for round := range o.moveRounds + 1 { // round 0 warms the tier's pages
		if _, err := s.Delete(keys); err != nil {
			return nil, err
		}
		t0 := time.Now()
		st, err := s.Set(keys, src)
		putTime := time.Since(t0)
		if err != nil || slices.ContainsFunc(st, func(x prefix.Status) bool { return x != prefix.Reserved }) {
			return nil, fmt.Errorf("put: %v %v", st, err)
		}
		getTime, err := timedGet(s, keys, dst, true)
		if err != nil {
			return nil, err
		}
		for i := range src {
			if !bytes.Equal(src[i], dst[i]) {
				return nil, fmt.Errorf("round %d: block %d came back different", round, i)
			}
			clear(dst[i])
		}
		rawTime, err := timedGet(s, keys, dst, false)
		if err != nil {
			return nil, err
		}
		t0 = time.Now()
		for i := range src {
			copy(dst[i], src[i])
		}
		copyTime := time.Since(t0)
		coresTime := coresCopy(dst, src)
		if round > 0 {
			put, get, raw, plain = append(put, putTime), append(get, getTime), append(raw, rawTime), append(plain, copyTime)
			cores = append(cores, coresTime)
		}
	}
	copyMs, coresMs := median(plain), median(cores)
	var out []MoveResult
	for _, m := range []struct {
		op string
		d  []time.Duration
	}{{"put", put}, {"get", get}, {"get-unverified", raw}} {
		res := MoveResult{Op: m.op, DstOffset: off, Blocks: len(src), BlockBytes: int64(len(src[0])), Rounds: len(m.d),
			MinMs: ms(slices.Min(m.d)), MedianMs: median(m.d), MaxMs: ms(slices.Max(m.d)), CopyMs: copyMs,
			CoresCopyMs: coresMs}
		res.GBps = float64(int64(len(src))*res.BlockBytes) / (res.MedianMs * 1e6)
		res.VsCopy = copyMs / res.MedianMs
		res.VsCoresCopy = coresMs / res.MedianMs
		out = append(out, res)
	}
	out[1].VerifiedOverUnverified = out[1].MedianMs / out[2].MedianMs
	return out, nil
}

// pagePlus is size zeroed bytes starting off bytes past a 4 KiB boundary.
func pagePlus(size, off int) []byte {
	buf := make([]byte, size+off+4096)
	skip := (4096 - int(uintptr(unsafe.Pointer(&buf[0]))%4096)) % 4096
	return buf[skip+off : skip+off+size]
}

// coresCopy copies src to dst on GOMAXPROCS goroutines, each a run of the
// blocks, and returns how long it took.
func coresCopy(dst, src [][]byte) time.Duration {
	workers := min(runtime.GOMAXPROCS(0), len(src))
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w * len(src) / workers; i < (w+1)*len(src)/workers; i++ {
				copy(dst[i], src[i])
			}
		})
	}
	wg.Wait()
	return time.Since(t0)
}

// timedGet gets keys into dst, checking payloads against their checksums
// or not, and returns how long it took.
func timedGet(s *prefix.Store, keys []prefix.Key, dst [][]byte, verify bool) (time.Duration, error) {
	s.VerifyReads(verify)
	defer s.VerifyReads(true)
	t0 := time.Now()
	got, err := s.Get(keys, dst)
	d := time.Since(t0)
	if err != nil || got != len(keys) {
		return 0, fmt.Errorf("get (verify %v): %d of %d, %v", verify, got, len(keys), err)
	}
	return d, nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func median(d []time.Duration) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return ms(s[len(s)/2])
}
