package ptxsim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

// kernel wraps body in a module with one entry k taking nparams 8-byte
// parameters and plenty of registers.
func kernel(t testing.TB, nparams int, decls, body string) *Kernel {
	t.Helper()
	var b strings.Builder
	b.WriteString(".version 7.0\n.target sm_80\n.address_size 64\n\n.visible .entry k(\n")
	for i := range nparams {
		sep := ","
		if i == nparams-1 {
			sep = ""
		}
		fmt.Fprintf(&b, "\t.param .u64 k_param_%d%s\n", i, sep)
	}
	b.WriteString(")\n{\n\t.reg .pred %p<16>;\n\t.reg .b16 %rs<8>;\n\t.reg .b32 %r<32>;\n\t.reg .b64 %rd<32>;\n")
	b.WriteString(decls)
	b.WriteString(body)
	b.WriteString("}\n")
	m, err := Parse(b.String())
	if err != nil {
		t.Fatal(err)
	}
	k, err := m.Kernel("k")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// seeds are the schedules every behaviour is checked under.
var seeds = []uint64{0, 1, 2, 3}

func TestWarpCollectives(t *testing.T) {
	k := kernel(t, 1, "", `
	ld.param.u64 %rd1, [k_param_0];
	mov.u32 %r1, %tid.x;
	and.b32 %r9, %r1, 31;
	mul.lo.s32 %r2, %r1, 10;
	shfl.sync.up.b32 %r3, %r2, 1, 0, -1;
	and.b32 %r4, %r1, 1;
	setp.eq.s32 %p1, %r4, 1;
	vote.sync.ballot.b32 %r5, %p1, -1;
	mov.u32 %r6, 31;
	sub.s32 %r7, %r6, %r9;
	shfl.sync.idx.b32 %r8, %r1, %r7, 31, -1;
	bar.warp.sync -1;
	mul.wide.u32 %rd2, %r1, 16;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r3;
	st.global.u32 [%rd3+4], %r5;
	st.global.u32 [%rd3+8], %r8;
	ret;
`)
	for _, seed := range seeds {
		s := NewSpace()
		out := make([]byte, 64*16)
		dev, _ := s.Map(out)
		if err := s.Launch(k, Config{Grid: 1, Block: 64, Params: []uint64{dev}, Seed: seed}); err != nil {
			t.Fatal(err)
		}
		for tid := range 64 {
			lane := tid % 32
			up := uint32(tid * 10)
			if lane > 0 {
				up = uint32((tid - 1) * 10)
			}
			want := []uint32{up, 0xaaaaaaaa, uint32(tid - lane + 31 - lane)}
			for j, w := range want {
				if got := binary.LittleEndian.Uint32(out[tid*16+4*j:]); got != w {
					t.Fatalf("seed %d thread %d result %d: got %#x, want %#x", seed, tid, j, got, w)
				}
			}
		}
	}
}

// TestArithmetic holds each operation to Go's result on values at the
// edges of their types.
func TestArithmetic(t *testing.T) {
	cases := []struct {
		inst string
		a, b uint64
		want uint64
	}{
		{"add.s32 %r3, %r1, %r2", 0x7fffffff, 1, 0x80000000},
		{"sub.s64 %rd3, %rd1, %rd2", 1, 2, ^uint64(0)},
		{"mul.lo.s32 %r3, %r1, %r2", 0x10000, 0x10000, 0},
		{"mul.wide.u32 %rd3, %r1, %r2", 0xffffffff, 2, 0x1fffffffe},
		{"mul.wide.s32 %rd3, %r1, %r2", 0xffffffff, 2, ^uint64(1)},
		{"div.s64 %rd3, %rd1, %rd2", uint64(1<<64 - 7), 2, uint64(1<<64 - 3)},
		{"div.u32 %r3, %r1, %r2", 0xffffffff, 16, 0x0fffffff},
		{"rem.u64 %rd3, %rd1, %rd2", 17, 5, 2},
		{"shl.b64 %rd3, %rd1, %r2", 1, 64, 0},
		{"shr.u32 %r3, %r1, %r2", 0x80000000, 31, 1},
		{"max.u64 %rd3, %rd1, %rd2", 5, ^uint64(0), ^uint64(0)},
		{"bfe.u64 %rd3, %rd1, %r2, 16", 0x123456789a, 8, 0x5678},
		{"cvt.s64.s32 %rd3, %r1", 0xfffffffe, 0, ^uint64(1)},
		{"cvt.u16.u32 %rs3, %r1", 0x12345, 0, 0x2345},
		{"popc.b32 %r3, %r1", 0xf0f0, 0, 8},
		{"neg.s64 %rd3, %rd1", 1, 0, ^uint64(0)},
		{"not.b32 %r3, %r1", 0, 0, 0xffffffff},
	}
	for _, c := range cases {
		t.Run(c.inst, func(t *testing.T) {
			dst := strings.Fields(strings.ReplaceAll(c.inst, ",", " "))[1]
			wide := strings.HasPrefix(dst, "%rd")
			store := "st.global.u64 [%rd10], " + dst
			if !wide {
				store = "st.global.u32 [%rd10], " + dst
				if strings.HasPrefix(dst, "%rs") {
					store = "st.global.u16 [%rd10], " + dst
				}
			}
			k := kernel(t, 3, "", fmt.Sprintf(`
	ld.param.u64 %%rd10, [k_param_0];
	ld.param.u64 %%rd1, [k_param_1];
	ld.param.u64 %%rd2, [k_param_2];
	ld.param.u32 %%r1, [k_param_1];
	ld.param.u32 %%r2, [k_param_2];
	%s;
	%s;
	ret;
`, c.inst, store))
			s := NewSpace()
			out := make([]byte, 8)
			dev, _ := s.Map(out)
			if err := s.Launch(k, Config{Grid: 1, Block: 1, Params: []uint64{dev, c.a, c.b}}); err != nil {
				t.Fatal(err)
			}
			if got := binary.LittleEndian.Uint64(out); got != c.want {
				t.Fatalf("got %#x, want %#x", got, c.want)
			}
		})
	}
}

// TestSpinLockMakesProgress: lanes of one warp take a lock in turn. With
// the warp in lockstep the holder would never run while the others spin;
// with a program counter per thread every lane gets through.
func TestSpinLockMakesProgress(t *testing.T) {
	k := kernel(t, 1, "", `
	ld.param.u64 %rd1, [k_param_0];
LOOP:
	atom.global.cas.b32 %r1, [%rd1], 0, 1;
	setp.ne.s32 %p1, %r1, 0;
	@%p1 bra LOOP;
	ld.volatile.global.u64 %rd2, [%rd1+8];
	add.s64 %rd3, %rd2, 1;
	st.global.u64 [%rd1+8], %rd3;
	membar.gl;
	atom.global.exch.b32 %r2, [%rd1], 0;
	ret;
`)
	for _, seed := range seeds {
		s := NewSpace()
		mem := make([]byte, 16)
		dev, _ := s.Map(mem)
		if err := s.Launch(k, Config{Grid: 3, Block: 64, Params: []uint64{dev}, Seed: seed, MaxSteps: 1 << 24}); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if got := binary.LittleEndian.Uint64(mem[8:]); got != 3*64 {
			t.Fatalf("seed %d: %d increments, want %d", seed, got, 3*64)
		}
	}
}

// TestFaults: every kind of failure is reported, as its kind, naming the
// instruction and its PTX line, and never a panic.
func TestFaults(t *testing.T) {
	host := make([]byte, 64)
	hostAddr := uint64(uintptr(unsafe.Pointer(&host[0])))
	cases := []struct {
		name   string
		decls  string
		body   string
		block  int
		param  func(dev uint64) uint64
		kind   error
		reason string
	}{
		{"misaligned", "", "ld.global.u64 %rd2, [%rd1+4];\n\tret;", 1, nil, ErrFault, "misaligned 8-byte access"},
		{"past the end", "", "ld.global.u32 %rd2, [%rd1+64];\n\tret;", 1, nil, ErrFault, "in no allocation"},
		{"before the start", "", "ld.global.u32 %rd2, [%rd1+-4];\n\tret;", 1, nil, ErrFault, "in no allocation"},
		{"shared before the start", "\t.shared .align 4 .b8 buf[16];\n", "st.shared.u32 [buf+-4], %r1;\n\tret;", 1, nil, ErrFault, "outside the 16 bytes of shared memory"},
		{"local before the start", "\t.local .align 8 .b8 __local_depot0[8];\n", "mov.u64 %rd2, __local_depot0;\n\tst.local.u64 [%rd2+-8], %rd1;\n\tret;", 1, nil, ErrFault, "outside the 8 bytes of local memory"},
		{"host pointer", "", "ld.global.u32 %rd2, [%rd1];\n\tret;", 1, func(uint64) uint64 { return hostAddr }, ErrFault, "in no allocation"},
		{"null", "", "ld.global.u32 %rd2, [%rd1+1856];\n\tret;", 1, func(uint64) uint64 { return 0 }, ErrFault, "address 0x740"},
		{"shared bounds", "\t.shared .align 4 .b8 buf[16];\n", "st.shared.u32 [buf+16], %r1;\n\tret;", 1, nil, ErrFault, "outside the 16 bytes of shared memory"},
		{"local bounds", "\t.local .align 8 .b8 __local_depot0[8];\n", "mov.u64 %rd2, __local_depot0;\n\tst.local.u64 [%rd2+8], %rd1;\n\tret;", 1, nil, ErrFault, "outside the 8 bytes of local memory"},
		{"division by zero", "", "div.u64 %rd2, %rd1, 0;\n\tret;", 1, nil, ErrFault, "division by zero"},
		{"divergent barrier", "", `mov.u32 %r1, %tid.x;
	setp.lt.u32 %p1, %r1, 32;
	@%p1 bra A;
	bar.sync 0;
	ret;
A:
	bar.sync 0;
	ret;`, 64, nil, ErrFault, "threads wait at different barriers"},
		{"divergent shuffle", "", `mov.u32 %r1, %tid.x;
	setp.lt.u32 %p1, %r1, 16;
	@%p1 bra A;
	shfl.sync.idx.b32 %r2, %r1, 0, 31, -1;
	ret;
A:
	shfl.sync.idx.b32 %r2, %r1, 1, 31, -1;
	ret;`, 32, nil, ErrFault, "wait at different warp collectives"},
		{"deadlock", "", `mov.u32 %r1, %tid.x;
	setp.eq.s32 %p1, %r1, 0;
	@%p1 bra A;
	bar.sync 0;
	ret;
A:
	shfl.sync.idx.b32 %r2, %r1, 0, 31, -1;
	bar.sync 0;
	ret;`, 64, nil, ErrDeadlock, "threads 1-63 wait at line"},
		{"endless loop", "", "L:\n\tbra.uni L;", 32, nil, ErrStepLimit, "threads 0-31 run at line"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := kernel(t, 1, c.decls, "\tld.param.u64 %rd1, [k_param_0];\n\t"+c.body+"\n")
			for _, seed := range seeds {
				s := NewSpace()
				dev, _ := s.Map(make([]byte, 64))
				p := dev
				if c.param != nil {
					p = c.param(dev)
				}
				err := s.Launch(k, Config{Grid: 1, Block: c.block, Params: []uint64{p}, Seed: seed, MaxSteps: 1 << 16})
				var f *Fault
				if !errors.Is(err, c.kind) || !errors.As(err, &f) || !strings.Contains(err.Error(), c.reason) {
					t.Fatalf("seed %d: got %v, want %v saying %q", seed, err, c.kind, c.reason)
				}
				if f.Kernel != "k" || (c.kind == ErrFault && (f.Line == 0 || f.Inst == "")) {
					t.Fatalf("seed %d: the fault does not say where: %+v", seed, f)
				}
			}
		})
	}
}

// TestMappingIsBoundByItsLength: memory mapped from a slice whose capacity
// runs on past its length (a range registered inside a larger mapping)
// ends at its length: the last word reads, the next one faults.
func TestMappingIsBoundByItsLength(t *testing.T) {
	k := kernel(t, 1, "", "\tld.param.u64 %rd1, [k_param_0];\n\tld.global.u32 %rd2, [%rd1];\n\tret;\n")
	s := NewSpace()
	dev, err := s.Map(make([]byte, 4096)[:32])
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Launch(k, Config{Grid: 1, Block: 1, Params: []uint64{dev + 28}, MaxSteps: 1 << 10}); err != nil {
		t.Fatalf("the last word: %v", err)
	}
	if err := s.Launch(k, Config{Grid: 1, Block: 1, Params: []uint64{dev + 32}, MaxSteps: 1 << 10}); !errors.Is(err, ErrFault) {
		t.Fatalf("the word past the length: %v, want a fault", err)
	}
}

// TestRaceCheck: unordered shared accesses are reported with both lines;
// a barrier between them, or atomics on both sides, are not races.
func TestRaceCheck(t *testing.T) {
	decls := "\t.shared .align 8 .b8 buf[8];\n"
	cases := []struct {
		name string
		body string
		race bool
	}{
		{"every thread writes", "st.shared.u32 [buf], %r1;", true},
		{"one writes, others read", `setp.eq.s32 %p1, %r1, 0;
	@!%p1 bra R;
	st.shared.u32 [buf], %r1;
R:
	ld.shared.u32 %r2, [buf];`, true},
		{"a barrier between", `setp.eq.s32 %p1, %r1, 0;
	@!%p1 bra R;
	st.shared.u32 [buf], %r1;
R:
	bar.sync 0;
	ld.shared.u32 %r2, [buf];`, false},
		{"atomics", "atom.shared.add.u32 %r2, [buf], 1;", false},
		{"atomic and plain write", `atom.shared.add.u32 %r2, [buf], 1;
	setp.eq.s32 %p1, %r1, 40;
	@%p1 st.shared.u32 [buf], %r1;`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := kernel(t, 0, decls, "\tmov.u32 %r1, %tid.x;\n\t"+c.body+"\n\tret;\n")
			for _, seed := range seeds {
				err := NewSpace().Launch(k, Config{Grid: 1, Block: 64, Seed: seed, RaceCheck: true})
				if c.race != errors.Is(err, ErrRace) {
					t.Fatalf("seed %d: race %v, got %v", seed, c.race, err)
				}
				if c.race && strings.Count(err.Error(), "line") < 2 {
					t.Fatalf("seed %d: the report does not name both lines: %v", seed, err)
				}
				if err := NewSpace().Launch(k, Config{Grid: 1, Block: 64, Seed: seed}); err != nil {
					t.Fatalf("seed %d without the check: %v", seed, err)
				}
			}
		})
	}
}

// TestExitedThreadsPassBarriers: a barrier waits for the threads still
// running, not for those that returned.
func TestExitedThreadsPassBarriers(t *testing.T) {
	k := kernel(t, 1, "", `
	ld.param.u64 %rd1, [k_param_0];
	mov.u32 %r1, %tid.x;
	setp.ge.u32 %p1, %r1, 40;
	@%p1 bra DONE;
	bar.sync 0;
	atom.global.add.u32 %r2, [%rd1], 1;
DONE:
	ret;
`)
	s := NewSpace()
	mem := make([]byte, 8)
	dev, _ := s.Map(mem)
	if err := s.Launch(k, Config{Grid: 2, Block: 64, Params: []uint64{dev}}); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint32(mem); got != 80 {
		t.Fatalf("%d threads passed the barrier, want 80", got)
	}
}

func TestLaunchRefusals(t *testing.T) {
	k := kernel(t, 1, "", "\tret;\n")
	s := NewSpace()
	for _, c := range []Config{
		{Grid: 0, Block: 1, Params: []uint64{0}},
		{Grid: 1, Block: 2048, Params: []uint64{0}},
		{Grid: 1, Block: 1},
		{Grid: 1, Block: 1, Shared: -1, Params: []uint64{0}},
	} {
		if err := s.Launch(k, c); !errors.Is(err, ErrLaunch) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if err := s.Unmap(12345); !errors.Is(err, ErrLaunch) {
		t.Errorf("unmap of nothing: %v", err)
	}
}

// TestParseRefuses: PTX the interpreter cannot run fails to parse, naming
// the line, rather than running wrongly.
func TestParseRefuses(t *testing.T) {
	head := ".version 7.0\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\t.reg .b64 %rd<4>;\n\t.reg .f32 %f<2>;\n"
	for _, c := range []struct{ body, want string }{
		{"\tadd.f32 %f1, %f1, %f1;\n", "line 8"},
		{"\ttex.1d.v4.s32.s32 %rd1, [t, %rd2];\n", "unsupported instruction tex"},
		{"\tbra NOWHERE;\n", "unknown label"},
		{"\tadd.s64 %rd1, %rd9, 1;\n", "unknown operand"},
		{"\tadd.s64 %rd1, %rd2, 1\n", "without ';'"},
		{"\tld.global.u64 %rd1, %rd2;\n", "bad address"},
	} {
		_, err := Parse(head + c.body + "}\n")
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.body, err, c.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(".version 7.0\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\t.reg .b64 %rd<4>;\n\tld.param.u64 %rd1, [k_param_0];\n\tret;\n}\n")
	f.Add(".extern .shared .align 8 .b8 smem[];\n.visible .entry k()\n{\n\t.shared .align 4 .b8 x[16];\n\tbar.sync 0;\n}\n")
	f.Fuzz(func(t *testing.T, src string) {
		m, err := Parse(src)
		if err != nil {
			return
		}
		// Whatever parses runs to an end: done, a fault or the step limit.
		for _, k := range m.kernels {
			params := make([]uint64, k.nparams)
			err := NewSpace().Launch(k, Config{Grid: 1, Block: 33, Params: params, MaxSteps: 1 << 12})
			var fault *Fault
			if err != nil && !errors.As(err, &fault) && !errors.Is(err, ErrLaunch) {
				t.Fatalf("launch: %v", err)
			}
		}
	})
}

// BenchmarkInterpreter runs a loop of loads, arithmetic and stores over
// 256 threads and reports thread-instructions per second.
func BenchmarkInterpreter(b *testing.B) {
	k := kernel(b, 1, "", `
	ld.param.u64 %rd1, [k_param_0];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd2, %r1, 8;
	add.s64 %rd3, %rd1, %rd2;
	mov.u32 %r2, 0;
L:
	ld.global.u64 %rd4, [%rd3];
	add.s64 %rd5, %rd4, 3;
	xor.b64 %rd6, %rd5, %rd2;
	st.global.u64 [%rd3], %rd6;
	add.s32 %r2, %r2, 1;
	setp.lt.u32 %p1, %r2, 100;
	@%p1 bra L;
	ret;
`)
	s := NewSpace()
	dev, _ := s.Map(make([]byte, 256*8))
	b.ResetTimer()
	for range b.N {
		if err := s.Launch(k, Config{Grid: 1, Block: 256, Params: []uint64{dev}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(s.Instructions)/b.Elapsed().Seconds(), "thread-inst/s")
}

// TestAccessesEndingPastTheirAllocation: an access that starts inside an
// allocation and ends outside it faults, in global, shared and local
// memory (a check of the start alone lets it read or write past the end).
func TestAccessesEndingPastTheirAllocation(t *testing.T) {
	for _, c := range []struct {
		name, decls, body, reason string
	}{
		{"global", "", "ld.global.u32 %r2, [%rd1+28];\n\tret;", "run 2 bytes past the end of the allocation"},
		{"shared", "\t.shared .align 4 .b8 buf[30];\n", "ld.shared.u32 %r2, [buf+28];\n\tret;", "outside the 30 bytes of shared memory"},
		{"local", "\t.local .align 8 .b8 __local_depot0[12];\n", "mov.u64 %rd2, __local_depot0;\n\tld.local.u64 %rd3, [%rd2+8];\n\tret;", "outside the 12 bytes of local memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := kernel(t, 1, c.decls, "\tld.param.u64 %rd1, [k_param_0];\n\t"+c.body+"\n")
			s := NewSpace()
			dev, err := s.Map(make([]byte, 64)[:30])
			if err != nil {
				t.Fatal(err)
			}
			err = s.Launch(k, Config{Grid: 1, Block: 1, Params: []uint64{dev}, MaxSteps: 1 << 10})
			if !errors.Is(err, ErrFault) || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("a 4- or 8-byte access at the last bytes: %v, want a fault saying %q", err, c.reason)
			}
		})
	}
}
