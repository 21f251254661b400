package topk_test

import (
	"fmt"
	"log"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

// A sparse-attention pool: a sequence's KV entries live in the tier, and
// each decode step makes the selected positions resident in the request's
// slots of the layer's buffer, fetching only what the slots lack.
func Example() {
	anon, _ := tier.ParseBacking("anon")
	g := tier.DefaultGeometry()
	g.DeviceSize, g.ChunkSize, g.Stripe = 32<<20, 256<<10, 256<<10
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{anon}, Geometry: g})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	c, _ := r.Attach(tier.ClientOptions{Name: "example"})
	defer c.Close()
	eng := kernels.NewCPU(0)
	defer eng.Close()
	p, err := topk.New(c, eng, nil, topk.Config{Layers: 1, EntryBytes: 64, Slots: 8, TopK: 4, MaxRequests: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	if err := p.Register(0, topk.Sequence{Layers: 1, EntryBytes: 64, Capacity: 100}); err != nil {
		log.Fatal(err)
	}
	if err := p.Append(0, 0, make([]byte, 100*64)); err != nil { // 100 tokens' entries
		log.Fatal(err)
	}
	slots := make([]int32, 4)
	for _, sel := range [][]int32{{3, 50, 99, -1}, {3, 50, 70, 99}} {
		st, err := p.Resolve(0, []int{0}, []int64{100}, sel, slots)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(slots, st.Hits, st.Misses)
	}
	// A new request's slot s holds token s (as SGLang starts it), so 3 hits
	// in slot 3; 50 takes the least recently used slot; the newest token
	// (99) has the reserved slot 8; -1 is padding.

	// Output:
	// [3 0 8 -1] 1 1
	// [3 0 1 8] 2 1
}
