/*
 * cxltier's compatibility shim for gorgonia.org/cu v0.9.6 on CUDA 13.
 *
 * Put this directory first on the include path (CGO_CFLAGS=-I.../cudacompat
 * -I<cuda>/include). It includes the real cuda.h and, on CUDA 13 and newer,
 * points five names back at the older entry points that gorgonia.org/cu was
 * written against. CUDA 13's driver still exports them; only the header
 * moved the names to _v2/_v4 variants with new signatures. On CUDA 11 and
 * 12 it changes nothing.
 */
#ifndef CXLTIER_CUDACOMPAT_H
#define CXLTIER_CUDACOMPAT_H

#include_next <cuda.h>

#if defined(CUDA_VERSION) && CUDA_VERSION >= 13000
#ifdef __cplusplus
extern "C" {
#endif

#undef cuCtxCreate
#define cuCtxCreate cuCtxCreate_v2
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

#undef cuMemAdvise
CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device);

#undef cuMemPrefetchAsync
CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream);

#undef cuGraphAddDependencies
CUresult CUDAAPI cuGraphAddDependencies(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to,
                                        size_t numDependencies);

#undef cuGraphGetEdges
CUresult CUDAAPI cuGraphGetEdges(CUgraph hGraph, CUgraphNode *from, CUgraphNode *to, size_t *numEdges);

#ifdef __cplusplus
}
#endif
#endif /* CUDA_VERSION >= 13000 */

#endif /* CXLTIER_CUDACOMPAT_H */
