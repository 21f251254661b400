package kernels

import (
	"bytes"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// nicePacer records the nice value of each thread that takes a turn: the
// CPU engine's copying threads take the turns, so it sees where a call's
// bytes were copied.
type nicePacer struct {
	mu    sync.Mutex
	nices []int32
}

func (p *nicePacer) Turn(int64) {
	a, err := unix.SchedGetAttr(0, 0)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.nices = append(p.nices, -100)
		return
	}
	p.nices = append(p.nices, a.Nice)
}

func (p *nicePacer) take() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.nices
	p.nices = nil
	return n
}

func TestBackgroundCallsCopyOnLoweredThreads(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("threads are lowered on Linux")
	}
	cpu := NewCPU(2)
	defer cpu.Close()
	if got := cpu.Background(); got != PriorityNormal {
		t.Fatalf("a new engine's background is %v", got)
	}
	if err := cpu.SetBackground(PriorityLow); err != nil {
		t.Fatal(err)
	}
	if got := cpu.Background(); got != PriorityLow {
		t.Fatalf("background %v after SetBackground(PriorityLow)", got)
	}
	pacer := &nicePacer{}
	cpu.SetPacer(pacer, 64<<10)
	const chunk, nblocks = 64 << 10, 24
	f := newFixture(t, cpu, 11, nblocks*chunk)
	src, dst := alloc(t, cpu, nblocks*chunk), alloc(t, cpu, nblocks*chunk)
	want := make([]byte, nblocks*chunk)
	for i := range want {
		want[i] = byte(i*7 + i>>9)
	}
	if err := cpu.Upload(src, 0, want); err != nil {
		t.Fatal(err)
	}
	blocks := func(buf Buffer, background bool) Blocks {
		b := Blocks{ChunkBytes: chunk, Chunks: []Span{{Buf: buf}}, CRCs: make([]uint32, nblocks), Background: background}
		for i := range nblocks {
			b.Tier, b.Pages = append(b.Tier, At(f.ids[0], int64(i)*chunk)), append(b.Pages, int64(i))
		}
		return b
	}
	for _, tc := range []struct {
		name       string
		background bool
		nice       int32
	}{{"background", true, 19}, {"not background", false, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			store, load := blocks(src, tc.background), blocks(dst, tc.background)
			for _, c := range []struct {
				call func(Blocks) (Handle, error)
				b    Blocks
			}{{cpu.ScatterBlocks, store}, {cpu.GatherBlocks, load}} {
				if h, err := c.call(c.b); err != nil || h.Wait() != nil {
					t.Fatal(err)
				}
			}
			got := make([]byte, len(want))
			if err := cpu.Download(got, dst, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) || !bytes.Equal(f.bytesAt(At(f.ids[0], 0), int64(len(want))), want) {
				t.Fatal("the bytes did not go round")
			}
			if !slices.Equal(store.CRCs, load.CRCs) || store.CRCs[0] == 0 {
				t.Fatalf("checksums stored %x, loaded %x", store.CRCs[:2], load.CRCs[:2])
			}
			nices := pacer.take()
			if len(nices) != 2*nblocks {
				t.Fatalf("%d turns, want %d", len(nices), 2*nblocks)
			}
			for _, n := range nices {
				if n != tc.nice {
					t.Fatalf("a piece copied at nice %d, want %d (all: %v)", n, tc.nice, nices)
				}
			}
		})
	}
	// Back to normal: background calls copy as any other.
	if err := cpu.SetBackground(PriorityNormal); err != nil {
		t.Fatal(err)
	}
	if h, err := cpu.ScatterBlocks(blocks(src, true)); err != nil || h.Wait() != nil {
		t.Fatal(err)
	}
	for _, n := range pacer.take() {
		if n != 0 {
			t.Fatalf("a background piece copied at nice %d after SetBackground(PriorityNormal)", n)
		}
	}
}

func TestSetBackgroundOnAClosedEngine(t *testing.T) {
	cpu := NewCPU(2)
	cpu.Close()
	if err := cpu.SetBackground(PriorityLow); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetBackground after Close: %v, want ErrClosed", err)
	}
	if got := cpu.Background(); got != PriorityNormal {
		t.Fatalf("a closed engine kept background threads at %v", got)
	}
}

func TestParsePriority(t *testing.T) {
	for in, want := range map[string]Priority{"": PriorityLow, "low": PriorityLow, "idle": PriorityIdle, "normal": PriorityNormal} {
		if got, err := ParsePriority(in); err != nil || got != want {
			t.Errorf("ParsePriority(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParsePriority("high"); err == nil {
		t.Error(`ParsePriority("high"): no error`)
	}
}

func alloc(t *testing.T, e Engine, n int64) Buffer {
	t.Helper()
	b, err := e.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}
