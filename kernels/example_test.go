package kernels_test

import (
	"fmt"
	"log"

	"github.com/cxltier/cxltier/kernels"
)

// A gather moves rows from registered host memory (a tier's mapping) into
// an engine buffer in one call, however many rows it names. The CPU engine
// runs anywhere; the CUDA engine (-tags cuda) is used the same way.
func Example() {
	e := kernels.NewCPU(0)
	defer e.Close()
	mem := make([]byte, 1<<16) // stands in for a tier device
	for i := range mem {
		mem[i] = byte(i / 64)
	}
	id, err := e.Register(mem)
	if err != nil {
		log.Fatal(err)
	}
	buf, err := e.Alloc(3 * 64)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Free()
	h, err := e.Gather(kernels.Rows{RowBytes: 64, Buf: buf,
		Tier: []kernels.Addr{kernels.At(id, 7*64), kernels.At(id, 2*64), kernels.At(id, 300*64)}})
	if err == nil {
		err = h.Wait()
	}
	if err != nil {
		log.Fatal(err)
	}
	out := make([]byte, 3*64)
	e.Download(out, buf, 0)
	fmt.Println(out[0], out[64], out[128])
	// Output: 7 2 44
}
