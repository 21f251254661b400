package ptxsim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// Config is one launch: a one-dimensional grid of one-dimensional blocks.
type Config struct {
	Grid, Block int
	Shared      int      // bytes of dynamic shared memory per block
	Params      []uint64 // one 8-byte value per kernel parameter
	// Seed 0 runs the deterministic schedule; any other value a schedule
	// shuffled by it (the same seed gives the same schedule).
	Seed uint64
	// RaceCheck reports conflicting shared-memory accesses between
	// barriers (slower: every shared access is recorded).
	RaceCheck bool
	// MaxSteps caps the lane-instructions of the launch (0: 1<<31), so a
	// spin that never ends is reported instead of hanging.
	MaxSteps uint64
	// Resident is how many blocks run interleaved (0: 4); the next block
	// starts when one finishes, as on a GPU with room for that many.
	Resident int
}

const maxBlockThreads = 1024

type machine struct {
	k      *Kernel
	space  *Space
	cfg    Config
	params []byte
	rng    *rand.Rand // nil: deterministic
	steps  uint64     // warp steps, the clock of lastRun
	lanes  uint64     // lane-instructions, held to limit
	limit  uint64
	race   bool // Config.RaceCheck: blocks keep a shadow of their shared memory
}

type block struct {
	id        int
	threads   []thread
	shared    []byte
	live      int // threads not exited
	running   int // threads neither exited nor waiting
	barWait   int
	epoch     uint32   // bar.sync releases so far
	warpEpoch []uint32 // warp-collective releases so far, per warp
	picks     []uint32 // steps taken, per warp
	shadow    []cell   // race check
}

// Launch runs k to completion on the memory of s.
func (s *Space) Launch(k *Kernel, c Config) error {
	if c.Grid < 1 || c.Block < 1 || c.Block > maxBlockThreads || c.Shared < 0 || c.Shared > 1<<30 {
		return fmt.Errorf("%w: %d blocks of %d threads with %d bytes of shared memory", ErrLaunch, c.Grid, c.Block, c.Shared)
	}
	if len(c.Params) != k.nparams {
		return fmt.Errorf("%w: %s takes %d parameters, given %d", ErrLaunch, k.Name, k.nparams, len(c.Params))
	}
	m := &machine{k: k, space: s, cfg: c, params: make([]byte, 8*len(c.Params)), limit: c.MaxSteps}
	for i, p := range c.Params {
		writeLE(m.params[8*i:8*i+8], p)
	}
	if m.limit == 0 {
		m.limit = 1 << 31
	}
	if c.Seed != 0 {
		m.rng = rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	}
	if c.RaceCheck {
		m.race = true
	}
	err := m.run()
	s.Instructions += m.lanes
	return err
}

func (m *machine) run() error {
	resident := m.cfg.Resident
	if resident <= 0 {
		resident = 4
	}
	var live []*block
	next := 0
	for {
		for len(live) < resident && next < m.cfg.Grid {
			live = append(live, m.newBlock(next))
			next++
		}
		if len(live) == 0 {
			return nil
		}
		if m.rng != nil {
			m.rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
		}
		for _, bk := range live {
			if err := m.round(bk); err != nil {
				return err
			}
		}
		live = slices.DeleteFunc(live, func(bk *block) bool { return bk.live == 0 })
		if m.lanes > m.limit {
			return m.stuck(live[0], ErrStepLimit, fmt.Sprintf("%d lane-instructions and still running", m.lanes))
		}
	}
}

func (m *machine) newBlock(id int) *block {
	n := m.cfg.Block
	warps := (n + 31) / 32
	bk := &block{id: id, threads: make([]thread, n), live: n, running: n,
		shared: make([]byte, m.k.dynOffset+m.cfg.Shared), warpEpoch: make([]uint32, warps), picks: make([]uint32, warps)}
	if m.cfg.Shared == 0 {
		bk.shared = bk.shared[:m.k.staticShared]
	}
	regs := make([]uint64, n*m.k.regs)
	local := make([]byte, n*m.k.local)
	for i := range bk.threads {
		t := &bk.threads[i]
		t.tid = int32(i)
		t.regs = regs[i*m.k.regs : (i+1)*m.k.regs : (i+1)*m.k.regs]
		t.local = local[i*m.k.local : (i+1)*m.k.local : (i+1)*m.k.local]
	}
	if m.race {
		bk.shadow = make([]cell, len(bk.shared))
	}
	return bk
}

// round gives every warp of bk with a running lane a turn.
func (m *machine) round(bk *block) error {
	warps := len(bk.warpEpoch)
	start := 0
	if m.rng != nil {
		start = m.rng.IntN(warps)
	}
	for i := range warps {
		w := (start + i) % warps
		turns := 16
		if m.rng != nil {
			// Mostly short turns, now and then a long one, so that one warp
			// can run far ahead of the others (as one that is never
			// descheduled does on a GPU).
			turns = 1 + m.rng.IntN(8)
			if m.rng.IntN(16) == 0 {
				turns = 64 + m.rng.IntN(512)
			}
		}
		if err := m.stepWarp(bk, w, turns); err != nil {
			return err
		}
	}
	if bk.live > 0 && bk.running == 0 {
		return m.stuck(bk, ErrDeadlock, "every live thread waits")
	}
	return nil
}

// stepWarp runs up to turns instructions for the lanes of warp w that
// stand at the program counter the schedule picks, for as long as they
// stay together.
func (m *machine) stepWarp(bk *block, w, turns int) error {
	ts := bk.threads[w*32 : min(w*32+32, len(bk.threads))]
	pc := m.pick(bk, w, ts)
	if pc < 0 {
		return nil
	}
	var group [32]int
	n := 0
	for i := range ts {
		if ts[i].state == running && ts[i].pc == pc {
			group[n] = i
			n++
		}
	}
	for range turns {
		m.steps++
		if int(pc) >= len(m.k.insts) {
			return &Fault{Kernel: m.k.Name, Block: bk.id, Reason: "a thread ran past the end of the kernel", Kind: ErrFault}
		}
		in := &m.k.insts[pc]
		m.lanes += uint64(n)
		act := group[:0:32]
		var skipped bool
		for _, i := range group[:n] {
			t := &ts[i]
			t.lastRun = m.steps
			if in.guard >= 0 && (t.regs[in.guard] != 0) == in.guardNeg {
				t.pc++
				skipped = true
				continue
			}
			act = append(act, i)
		}
		if len(act) == 0 {
			pc++
			continue
		}
		if in.op.collective() {
			return m.arrive(bk, w, ts, act, in)
		}
		if m.rng != nil && (in.op == opAtom || in.op == opSt || in.op == opLd) {
			m.rng.Shuffle(len(act), func(i, j int) { act[i], act[j] = act[j], act[i] })
		}
		for _, i := range act {
			if err := m.exec(bk, &ts[i], in); err != nil {
				if f, ok := err.(*Fault); ok {
					return f
				}
				return m.fault(bk, &ts[i], in, ErrFault, err.Error())
			}
		}
		if skipped {
			return nil // the group split
		}
		// Go on while every lane still runs at one program counter.
		pc = ts[group[0]].pc
		for _, i := range group[:n] {
			if ts[i].state != running || ts[i].pc != pc {
				return nil
			}
		}
	}
	return nil
}

// pick is the program counter warp w runs next: the lowest (so lanes that
// diverged meet again), every eighth step the one of the lane that waited
// longest (so a lane spinning on a lock another lane holds cannot starve
// it); with a seed, one of the warp's distinct program counters at random.
func (m *machine) pick(bk *block, w int, ts []thread) int32 {
	bk.picks[w]++
	fair := bk.picks[w]%8 == 0
	var pcs [32]int32
	n := 0
	best := -1
	for i := range ts {
		t := &ts[i]
		if t.state != running {
			continue
		}
		switch {
		case m.rng != nil:
			if !slices.Contains(pcs[:n], t.pc) {
				pcs[n] = t.pc
				n++
			}
		case best < 0:
			best = i
		case fair:
			if t.lastRun < ts[best].lastRun {
				best = i
			}
		case t.pc < ts[best].pc:
			best = i
		}
	}
	if m.rng != nil {
		if n == 0 {
			return -1
		}
		return pcs[m.rng.IntN(n)]
	}
	if best < 0 {
		return -1
	}
	return ts[best].pc
}

func (m *machine) fault(bk *block, t *thread, in *inst, kind error, reason string) error {
	return &Fault{Kernel: m.k.Name, Line: in.line, Inst: in.text, Block: bk.id, Thread: int(t.tid), Reason: reason, Kind: kind}
}

// exit retires t; threads waiting for it at a barrier may now go on.
func (m *machine) exit(bk *block, t *thread) error {
	t.state = exited
	bk.live--
	bk.running--
	if bk.barWait > 0 && bk.barWait == bk.live {
		if err := m.releaseBar(bk); err != nil {
			return err
		}
	}
	return m.tryWarp(bk, int(t.tid)/32)
}

// arrive parks the lanes of group at a collective and releases whoever
// can go on.
func (m *machine) arrive(bk *block, w int, ts []thread, group []int, in *inst) error {
	state := waitWarp
	if in.op == opBarSync {
		state = waitBar
	}
	for _, i := range group {
		ts[i].state = state
	}
	bk.running -= len(group)
	if in.op != opBarSync {
		return m.tryWarp(bk, w)
	}
	bk.barWait += len(group)
	if bk.barWait == bk.live {
		return m.releaseBar(bk)
	}
	return nil
}

// releaseBar lets every thread waiting at bar.sync go on, once they all
// wait at the same barrier.
func (m *machine) releaseBar(bk *block) error {
	var first *thread
	for i := range bk.threads {
		t := &bk.threads[i]
		if t.state != waitBar {
			continue
		}
		if first == nil {
			first = t
			continue
		}
		a, b := &m.k.insts[first.pc], &m.k.insts[t.pc]
		if t.pc != first.pc || m.val(bk, t, b.args[0]) != m.val(bk, first, a.args[0]) {
			return m.fault(bk, t, b, ErrFault, fmt.Sprintf("threads wait at different barriers: thread %d at line %d, thread %d at line %d",
				first.tid, a.line, t.tid, b.line))
		}
	}
	for i := range bk.threads {
		if t := &bk.threads[i]; t.state == waitBar {
			t.state = running
			t.pc++
		}
	}
	bk.running += bk.barWait
	bk.barWait = 0
	bk.epoch++
	return nil
}

// tryWarp runs the warp collectives of warp w whose member lanes have all
// arrived.
func (m *machine) tryWarp(bk *block, w int) error {
	ts := bk.threads[w*32 : min(w*32+32, len(bk.threads))]
	for i := range ts {
		t := &ts[i]
		if t.state != waitWarp {
			continue
		}
		in := &m.k.insts[t.pc]
		mask := uint32(m.val(bk, t, in.args[len(in.args)-1]))
		if mask&(1<<i) == 0 {
			return m.fault(bk, t, in, ErrFault, fmt.Sprintf("lane %d is not in its own member mask %#x", i, mask))
		}
		var part uint32
		ready := true
		for j := range ts {
			u := &ts[j]
			if mask&(1<<j) == 0 || u.state == exited {
				continue
			}
			part |= 1 << j
			if u.state != waitWarp {
				ready = false
			}
		}
		if !ready {
			continue
		}
		for j := range ts {
			u := &ts[j]
			if part&(1<<j) == 0 {
				continue
			}
			if u.pc != t.pc {
				return m.fault(bk, u, &m.k.insts[u.pc], ErrFault, fmt.Sprintf(
					"lanes of mask %#x wait at different warp collectives: lane %d at line %d, lane %d at line %d",
					mask, i, in.line, j, m.k.insts[u.pc].line))
			}
			if um := uint32(m.val(bk, u, in.args[len(in.args)-1])); um != mask {
				return m.fault(bk, u, in, ErrFault, fmt.Sprintf("lane %d uses member mask %#x, lane %d %#x", i, mask, j, um))
			}
		}
		if err := m.collective(bk, ts, part, in); err != nil {
			return err
		}
		for j := range ts {
			if part&(1<<j) != 0 {
				ts[j].state = running
				ts[j].pc++
				bk.running++
			}
		}
		bk.warpEpoch[w]++
	}
	return nil
}

// collective executes a warp collective for the lanes in part, reading
// every lane's operands before writing any result.
func (m *machine) collective(bk *block, ts []thread, part uint32, in *inst) error {
	switch in.op {
	case opBarWarp:
		return nil
	case opVote:
		var ballot uint32
		for j := range ts {
			if part&(1<<j) != 0 && m.val(bk, &ts[j], in.args[0]) != 0 {
				ballot |= 1 << j
			}
		}
		var r uint64
		switch in.cmp {
		case "ballot":
			r = uint64(ballot)
		case "any":
			r = b2u(ballot != 0)
		case "all":
			r = b2u(ballot == part)
		}
		for j := range ts {
			if part&(1<<j) != 0 {
				ts[j].regs[in.dst[0]] = r
			}
		}
		return nil
	}
	var vals [32]uint64
	for j := range ts {
		if part&(1<<j) != 0 {
			vals[j] = in.typ.norm(m.val(bk, &ts[j], in.args[0]))
		}
	}
	var out [32]uint64
	for j := range ts {
		if part&(1<<j) == 0 {
			continue
		}
		t := &ts[j]
		src := shflSource(in.cmp, j, int(m.val(bk, t, in.args[1])&31), m.val(bk, t, in.args[2]))
		if part&(1<<src) == 0 {
			return m.fault(bk, t, in, ErrFault, fmt.Sprintf("lane %d reads lane %d, which is not taking part", j, src))
		}
		out[j] = vals[src]
	}
	for j := range ts {
		if part&(1<<j) != 0 {
			ts[j].regs[in.dst[0]] = out[j]
		}
	}
	return nil
}

// shflSource is the lane whose value lane reads, by the PTX ISA's rule:
// c packs the clamp value (bits 0-4) and the segment mask (bits 8-12).
func shflSource(mode string, lane, b int, c uint64) int {
	clamp, seg := int(c&31), int(c>>8&31)
	maxLane := lane&seg | clamp&^seg
	minLane := lane & seg
	var j int
	var ok bool
	switch mode {
	case "up":
		j = lane - b
		ok = j >= maxLane
	case "down":
		j = lane + b
		ok = j <= maxLane
	case "bfly":
		j = lane ^ b
		ok = j <= maxLane
	default: // idx
		j = minLane | b&^seg
		ok = j <= maxLane
	}
	if !ok {
		return lane
	}
	return j
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// stuck describes where every live thread of bk stands.
func (m *machine) stuck(bk *block, kind error, why string) error {
	type spot struct {
		state uint8
		pc    int32
	}
	var order []spot
	at := map[spot][]int32{}
	for i := range bk.threads {
		t := &bk.threads[i]
		if t.state == exited {
			continue
		}
		s := spot{t.state, t.pc}
		if _, ok := at[s]; !ok {
			order = append(order, s)
		}
		at[s] = append(at[s], t.tid)
	}
	var b strings.Builder
	b.WriteString(why)
	for _, s := range order {
		what := "run"
		if s.state != running {
			what = "wait"
		}
		line, text := 0, "past the end"
		if int(s.pc) < len(m.k.insts) {
			line, text = m.k.insts[s.pc].line, m.k.insts[s.pc].text
		}
		fmt.Fprintf(&b, "; threads %s %s at line %d (%s)", ranges(at[s]), what, line, text)
	}
	return &Fault{Kernel: m.k.Name, Block: bk.id, Reason: b.String(), Kind: kind}
}

// ranges writes 0,1,2,5 as "0-2,5".
func ranges(ids []int32) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ids[i], ids[j])
		} else {
			fmt.Fprintf(&b, "%d", ids[i])
		}
		i = j + 1
	}
	return b.String()
}
