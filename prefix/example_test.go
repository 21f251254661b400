package prefix_test

import (
	"fmt"
	"log"

	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// An index of KV pages by SGLang page key: one process stores a page's
// payload, any process mapping the tier finds it.
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
	s, err := prefix.Create(c, prefix.Config{Name: "llama", Blocks: 16, BlockBytes: 4096})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	keys, _ := prefix.PageKeys(nil, []int64{1, 2, 3, 4, 5, 6, 7, 8}, 4) // two pages of 4 tokens
	st, _ := s.Set(keys, [][]byte{[]byte("page one"), []byte("page two")})
	dst := [][]byte{make([]byte, 4096), make([]byte, 4096)}
	n, _ := s.Get(keys, dst)
	fmt.Println(len(keys), st[0], n, string(dst[1][:8]))
	// Output: 2 reserved 2 page two
}
