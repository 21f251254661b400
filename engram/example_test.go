package engram_test

import (
	"fmt"
	"log"

	"github.com/cxltier/cxltier/engram"
)

// The hash of DeepSeek V4.1-Flash's Engram layer 1: every position of the
// ids hashes to (MaxNgram-1) × Heads rows, order-major, bit-exact with
// the reference.
func Example() {
	g, err := engram.Preset("v4.1-flash")
	if err != nil {
		log.Fatal(err)
	}
	h, err := engram.NewHasher(g)
	if err != nil {
		log.Fatal(err)
	}
	rows, err := h.Hash(nil, 1, nil, []int64{17, 4, 99})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(rows), g.HashesPerToken())
	// Output: 72 24
}
