//go:build cuda

package kernels

// The few driver calls gorgonia.org/cu lacks: page-locking host memory
// that something else mapped (the tier) and finding its device address;
// letting a kernel use more than 48 KiB of dynamic shared memory.

/*
#include <cuda.h>

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

// hostRegister page-locks mem and returns its device address. mem must not
// be Go-heap memory the caller may drop: the engine keeps a reference to it
// until unregister, which is what keeps a Go-heap slice alive.
func hostRegister(mem []byte) (uint64, error) {
	var d C.ulonglong
	if r := C.cxl_host_register(unsafe.Pointer(&mem[0]), C.size_t(len(mem)), &d); r != C.CUDA_SUCCESS {
		return 0, fmt.Errorf("kernels: cuMemHostRegister of %d bytes: %s", len(mem), C.GoString(C.cxl_error_name(r)))
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
