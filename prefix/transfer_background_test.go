package prefix

import (
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cxltier/cxltier/kernels"
)

// nicePacer records the nice value of the threads that take its turns:
// a CPU engine's copying threads.
type nicePacer struct {
	mu    sync.Mutex
	nices map[int32]int
}

func (p *nicePacer) Turn(int64) {
	nice := int32(-100)
	if a, err := unix.SchedGetAttr(0, 0); err == nil {
		nice = a.Nice
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nices[nice]++
}

func (p *nicePacer) take() map[int32]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.nices
	p.nices = map[int32]int{}
	return n
}

// A store is a background call (nobody waits on it soon) unless it is a
// first-token one; a load never is. On a CPU engine with background
// threads a store's bytes are copied at nice 19, a load's at the
// caller's priority.
func TestAMoversStoresAreBackgroundCalls(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("threads are lowered on Linux")
	}
	const layers, pages, chunk = 2, 8, 4096
	_, c := testTier(t, 1)
	s := testStore(t, c, 16, 2*layers*chunk)
	eng := kernels.NewCPU(2)
	defer eng.Close()
	if err := eng.SetBackground(kernels.PriorityLow); err != nil {
		t.Fatal(err)
	}
	pacer := &nicePacer{nices: map[int32]int{}}
	eng.SetPacer(pacer, chunk)
	l, _ := enginePool(t, eng, layers, pages, chunk)
	m, err := NewMover(s, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	perPage := 2 * layers // turns: a piece is a chunk
	keys := keysN(4)
	expect := func(what string, want map[int32]int) {
		t.Helper()
		got := pacer.take()
		if len(got) != len(want) {
			t.Fatalf("%s: pieces by nice %v, want %v", what, got, want)
		}
		for nice, n := range want {
			if got[nice] != n {
				t.Fatalf("%s: pieces by nice %v, want %v", what, got, want)
			}
		}
	}
	if _, err := m.Put(keys[:2], l, []int64{0, 1}); err != nil {
		t.Fatal(err)
	}
	expect("a store", map[int32]int{19: 2 * perPage})
	if n, err := m.Get(keys[:2], l, []int64{2, 3}); n != 2 || err != nil {
		t.Fatalf("Get = %d, %v", n, err)
	}
	expect("a load", map[int32]int{0: 2 * perPage})
	ld, err := m.StartLoad(keys[:2], l, 2, []int64{4, 5})
	if err != nil {
		t.Fatal(err)
	}
	for layer := range layers {
		if err := ld.Layer(layer); err != nil {
			t.Fatal(err)
		}
	}
	if err := ld.Close(); err != nil {
		t.Fatal(err)
	}
	expect("a layer-wise load", map[int32]int{0: 2 * perPage})

	// A prefill's stores for its decode are first-token transfers: at the
	// caller's priority, through the first-token pacer.
	first := &nicePacer{nices: map[int32]int{}}
	m.FirstToken = func() (kernels.Pacer, func()) { return first, func() {} }
	m.FirstTokenStores = true
	if _, err := m.Put(keys[2:], l, []int64{6, 7}); err != nil {
		t.Fatal(err)
	}
	expect("the engine's pacer, for a first-token store", map[int32]int{})
	if got := first.take(); got[0] != 2*perPage || len(got) != 1 {
		t.Fatalf("a first-token store: pieces by nice %v, want %d at 0", got, 2*perPage)
	}
}
