//go:build !cuda

package kernels

// NewCUDA reports ErrNoCUDA: this build has no CUDA engine.
func NewCUDA(CUDAOptions) (Engine, error) { return nil, ErrNoCUDA }
