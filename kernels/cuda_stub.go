//go:build !cuda

package kernels

// NewCUDA reports ErrNoCUDA: this build has no CUDA engine.
func NewCUDA(CUDAOptions) (Engine, error) { return nil, ErrNoCUDA }

// StreamDevice reports ErrNoCUDA: this build has no CUDA engine.
func StreamDevice(uintptr) (int, error) { return 0, ErrNoCUDA }

// CurrentDevice reports no device: this build has no CUDA engine.
func CurrentDevice() (int, bool) { return 0, false }
