package tier_test

import (
	"fmt"
	"log"

	"github.com/cxltier/cxltier/tier"
)

// A process formats a tier (anonymous memory here; shm:NAME, file:PATH or
// dax:/dev/daxN.M in service), attaches as a client, takes chunks and
// names an object in the root directory for other processes to find.
func Example() {
	anon, _ := tier.ParseBacking("anon")
	g := tier.DefaultGeometry()
	g.DeviceSize = 16 << 20
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{anon}, Geometry: g})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	c, err := r.Attach(tier.ClientOptions{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	off, err := c.AllocChunks(2)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.ShareChunks(off, 2); err != nil { // outlives this client
		log.Fatal(err)
	}
	if err := c.DirPut(tier.DirEntry{Name: "my/object", Kind: 1, Offset: off, Size: 2 * r.ChunkSize()}); err != nil {
		log.Fatal(err)
	}
	e, _ := r.DirLookup("my/object")
	fmt.Println(e.Name, e.Size == 2*r.ChunkSize(), r.Usage().UsedChunks, len(r.Audit()))
	// Output: my/object true 2 0
}
