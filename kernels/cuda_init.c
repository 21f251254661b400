//go:build cuda

// The driver binding (gorgonia.org/cu) calls cuInit in its package init and
// ends the process with os.Exit(1) when it fails. Loaded into a Python
// process on a machine whose driver does not work, the CUDA build of
// libcxltier would take that process down with it. This file defines
// cuInit for this binary alone (hidden, so every reference inside the
// binary binds here and nothing outside sees it): it calls the driver's
// cuInit, keeps its result, and reports success, so the binding's init goes
// on; NewCUDA then returns the kept result as ErrNoDevice.

#define _GNU_SOURCE
#include <dlfcn.h>

typedef int cxl_result; // CUresult: CUDA_SUCCESS is 0

static cxl_result init_result = 0;

__attribute__((visibility("hidden"))) cxl_result cuInit(unsigned int flags) {
	cxl_result (*driver)(unsigned int) = (cxl_result(*)(unsigned int))dlsym(RTLD_NEXT, "cuInit");
	init_result = driver ? driver(flags) : 3; // 3: CUDA_ERROR_NOT_INITIALIZED
	return 0;
}

cxl_result cxl_init_result(void) { return init_result; }
