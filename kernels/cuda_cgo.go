//go:build cuda

package kernels

// The few driver calls gorgonia.org/cu lacks: page-locking host memory
// that something else mapped (the tier) and finding its device address;
// letting a kernel use more than 48 KiB of dynamic shared memory.

/*
#cgo LDFLAGS: -ldl
#include <cuda.h>

CUresult cxl_init_result(void); // cuda_init.c

static CUresult cxl_host_register(void *p, size_t n, unsigned long long *dptr) {
	CUresult r = cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	if (r != CUDA_SUCCESS) return r;
	CUdeviceptr d = 0;
	r = cuMemHostGetDevicePointer(&d, p, 0);
	if (r != CUDA_SUCCESS) {
		cuMemHostUnregister(p);
		return r;
	}
	*dptr = (unsigned long long)d;
	return CUDA_SUCCESS;
}

static CUresult cxl_host_unregister(void *p) { return cuMemHostUnregister(p); }

static CUresult cxl_max_shared_optin(int dev, int *bytes) {
	return cuDeviceGetAttribute(bytes, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, (CUdevice)dev);
}

static CUresult cxl_func_max_shared(CUfunction f, int bytes) {
	return cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}

// The device of a stream's context: push the context, ask, pop it.
static CUresult cxl_stream_device(CUstream s, int *dev) {
	CUcontext ctx = 0, popped = 0;
	CUresult r = cuStreamGetCtx(s, &ctx);
	if (r != CUDA_SUCCESS) return r;
	if ((r = cuCtxPushCurrent(ctx)) != CUDA_SUCCESS) return r;
	CUdevice d = 0;
	r = cuCtxGetDevice(&d);
	cuCtxPopCurrent(&popped);
	if (r == CUDA_SUCCESS) *dev = (int)d;
	return r;
}

// The device of the calling thread's current context (torch makes its
// device's primary context current on the threads that use it).
static CUresult cxl_current_device(int *dev) {
	CUcontext ctx = 0;
	CUresult r = cuCtxGetCurrent(&ctx);
	if (r != CUDA_SUCCESS) return r;
	if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
	CUdevice d = 0;
	if ((r = cuCtxGetDevice(&d)) == CUDA_SUCCESS) *dev = (int)d;
	return r;
}

static const char *cxl_error_name(CUresult r) {
	const char *s = 0;
	if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == 0) return "unknown CUDA error";
	return s;
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// initError is the driver's answer to cuInit, which cuda_init.c kept from
// the binding's init.
func initError() error {
	if r := C.cxl_init_result(); r != C.CUDA_SUCCESS {
		return fmt.Errorf("%w: the CUDA driver did not start: cuInit: %s (%d)", ErrNoDevice, C.GoString(C.cxl_error_name(r)), int(r))
	}
	return nil
}

// StreamDevice is the ordinal of the device whose context stream (a
// CUstream handle) belongs to.
func StreamDevice(stream uintptr) (int, error) {
	if err := initError(); err != nil {
		return 0, err
	}
	// A CUstream is a pointer-sized handle: read stream's bits as one.
	s := *(*C.CUstream)(unsafe.Pointer(&stream))
	var d C.int
	if r := C.cxl_stream_device(s, &d); r != C.CUDA_SUCCESS {
		return 0, fmt.Errorf("%w: the device of stream %#x: %s", ErrBadRequest, stream, C.GoString(C.cxl_error_name(r)))
	}
	return int(d), nil
}

// CurrentDevice is the ordinal of the device of the calling OS thread's
// current CUDA context; false when the thread has none.
func CurrentDevice() (int, bool) {
	if initError() != nil {
		return 0, false
	}
	var d C.int
	if C.cxl_current_device(&d) != C.CUDA_SUCCESS {
		return 0, false
	}
	return int(d), true
}

// hostRegister page-locks mem and returns its device address. mem must not
// be Go-heap memory the caller may drop: the engine keeps a reference to it
// until unregister, which is what keeps a Go-heap slice alive.
func hostRegister(mem []byte) (uint64, error) {
	var d C.ulonglong
	if r := C.cxl_host_register(unsafe.Pointer(&mem[0]), C.size_t(len(mem)), &d); r != C.CUDA_SUCCESS {
		err := fmt.Errorf("kernels: cuMemHostRegister of %d bytes: %s", len(mem), C.GoString(C.cxl_error_name(r)))
		if hint := pinHint(mem); hint != "" {
			err = fmt.Errorf("%w (%s)", err, hint)
		}
		return 0, err
	}
	return uint64(d), nil
}

func hostUnregister(mem []byte) error {
	if r := C.cxl_host_unregister(unsafe.Pointer(&mem[0])); r != C.CUDA_SUCCESS {
		return fmt.Errorf("kernels: cuMemHostUnregister: %s", C.GoString(C.cxl_error_name(r)))
	}
	return nil
}

// maxSharedOptin is the most shared memory a block of dev may ask for.
func maxSharedOptin(dev cu.Device) (int, error) {
	var n C.int
	if r := C.cxl_max_shared_optin(C.int(dev), &n); r != C.CUDA_SUCCESS {
		return 0, fmt.Errorf("kernels: shared memory limit: %s", C.GoString(C.cxl_error_name(r)))
	}
	return int(n), nil
}

// setMaxShared lets fn's launches ask for up to bytes of dynamic shared
// memory. cu.Function is a struct holding exactly one CUfunction (a
// pointer-sized handle), which this reads through unsafe.
func setMaxShared(fn cu.Function, bytes int) error {
	f := *(*C.CUfunction)(unsafe.Pointer(&fn))
	if r := C.cxl_func_max_shared(f, C.int(bytes)); r != C.CUDA_SUCCESS {
		return fmt.Errorf("kernels: allow %d bytes of shared memory: %s", bytes, C.GoString(C.cxl_error_name(r)))
	}
	return nil
}
