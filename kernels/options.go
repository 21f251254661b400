package kernels

import (
	"fmt"

	"github.com/cxltier/cxltier/internal/errkind"
)

// ErrNoCUDA is returned by NewCUDA in a build without the "cuda" tag.
var ErrNoCUDA = errkind.New(errkind.Invalid, "kernels: built without CUDA (rebuild with -tags cuda)")

// CUDAOptions configures the CUDA engine.
type CUDAOptions struct {
	// Device is the GPU ordinal. The engine runs in that device's primary
	// context, the one PyTorch uses, so buffers are shared with it.
	Device int
	// Stream is a CUstream handle to enqueue on (for example torch's
	// torch.cuda.current_stream().cuda_stream); 0 makes a stream of the
	// engine's own. The engine never destroys a stream it was given.
	Stream uintptr
	// MaxBlocks caps the grid of a launch (0: 8 per multiprocessor), so
	// copies leave room for compute running beside them.
	MaxBlocks int
}

// DeviceBuffer is implemented by buffers in GPU memory: their device
// address, for handing to other CUDA code (a torch tensor over it).
type DeviceBuffer interface {
	DevicePtr() uintptr
}

// DeviceNamer is implemented by engines on a device: its model name
// ("NVIDIA H100 80GB HBM3"), for result files.
type DeviceNamer interface {
	DeviceName() string
}

// DeviceWrapper is implemented by engines whose buffers can wrap memory
// allocated elsewhere (a torch tensor's data_ptr on the same device).
type DeviceWrapper interface {
	WrapDevice(ptr uintptr, n int64) (Buffer, error)
}

// HostWrapper is implemented by engines whose buffers are host memory
// (the CPU engine): a buffer over memory allocated elsewhere (a CPU torch
// tensor's storage), which the caller keeps alive and frees.
type HostWrapper interface {
	WrapHost(mem []byte) (Buffer, error)
}

// New returns the engine named by kind: "cpu", "cuda" (device 0), or
// "auto" (CUDA when built with it, else CPU).
//
// A build with the "cuda" tag links libcuda.so.1 and needs it to load;
// where the driver is there but fails, NewCUDA reports ErrNoDevice (see
// cuda_init.c) and "auto" gives the CPU engine.
func New(kind string) (Engine, error) {
	switch kind {
	case "cpu":
		return NewCPU(0), nil
	case "cuda":
		return NewCUDA(CUDAOptions{})
	case "auto", "":
		e, err := NewCUDA(CUDAOptions{})
		if err == nil {
			return e, nil
		}
		return NewCPU(0), nil
	}
	return nil, fmt.Errorf("%w: engine %q (want cpu, cuda or auto)", ErrBadRequest, kind)
}
