// cxltier gather kernels: rows and paged blocks between registered host
// memory (the tier) and GPU buffers, one launch per call.
//
// Built to PTX for compute_80 (JIT-compiled forward on Hopper) by scripts/genptx.sh;
// the PTX is committed and embedded. Any change here must be followed by
// scripts/genptx.sh, or TestPTXMatchesSource fails.
//
// Rows are copied by groups of `lanes` threads (a power of two up to 32, so
// a group never straddles a warp). A group loads up to four 16-byte vectors
// per lane before storing any, so each lane keeps several PCIe reads in
// flight. Rows whose ends are not 16-byte aligned use 4-byte words or bytes
// for what the vectors do not cover.

#ifndef __NVCC__
// clang builds this without the CUDA headers (-nocudainc).
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __forceinline__ __attribute__((always_inline)) inline
#include <__clang_cuda_builtin_vars.h>
#endif

typedef unsigned long long u64;
typedef unsigned int u32;

#ifdef __NVCC__
typedef uint4 vec16;
#else
typedef u32 vec16 __attribute__((ext_vector_type(4)));
#endif

#define ADDR_RANGE_SHIFT 56
#define ADDR_OFFSET_MASK ((1ull << ADDR_RANGE_SHIFT) - 1)

// resolve turns an Addr (range id << 56 | offset) into a device pointer.
static __device__ __forceinline__ char *resolve(const u64 *bases, u64 addr) {
  return (char *)(bases[addr >> ADDR_RANGE_SHIFT] + (addr & ADDR_OFFSET_MASK));
}

template <typename W>
static __device__ __forceinline__ u64 copy_words(char *dst, const char *src, u64 n, u32 lane, u32 lanes) {
  const u64 nw = n / sizeof(W);
  const W *s = (const W *)src;
  W *d = (W *)dst;
  u64 i = lane;
  for (; i + 3ull * lanes < nw; i += 4ull * lanes) {
    W a = s[i], b = s[i + lanes], c = s[i + 2ull * lanes], e = s[i + 3ull * lanes];
    d[i] = a;
    d[i + lanes] = b;
    d[i + 2ull * lanes] = c;
    d[i + 3ull * lanes] = e;
  }
  for (; i < nw; i += lanes) d[i] = s[i];
  return nw * sizeof(W);
}

static __device__ __forceinline__ void copy_row(char *dst, const char *src, u64 n, u32 lane, u32 lanes) {
  const u64 align = (u64)dst | (u64)src;
  u64 done = 0;
  if ((align & 15) == 0) {
    done = copy_words<vec16>(dst, src, n, lane, lanes);
  } else if ((align & 3) == 0) {
    done = copy_words<u32>(dst, src, n, lane, lanes);
  }
  for (u64 j = done + lane; j < n; j += lanes) dst[j] = src[j];
}

// cxl_rows copies nrows rows of row_bytes. Row r is at tier[r] (an Addr)
// and at buf + slot*stride, where slot is slots[r], or r when slots is 0.
// to_tier chooses the direction (0: gather, 1: scatter).
extern "C" __global__ void cxl_rows(const u64 *bases, const u64 *tier, const u64 *slots, u64 buf, u64 stride,
                                    u64 nrows, u64 row_bytes, u64 lanes_per_row, u64 to_tier) {
  const u32 lanes = (u32)lanes_per_row;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u32 lane = (u32)(tid % lanes);
  const u64 groups = ((u64)gridDim.x * blockDim.x) / lanes;
  for (u64 r = tid / lanes; r < nrows; r += groups) {
    char *t = resolve(bases, tier[r]);
    char *b = (char *)(buf + (slots ? slots[r] : r) * stride);
    if (to_tier)
      copy_row(t, b, row_bytes, lane, lanes);
    else
      copy_row(b, t, row_bytes, lane, lanes);
  }
}

// cxl_blocks copies nblocks paged blocks of nchunks chunks. Chunk c of
// block k is at tier[k] + c*chunk_bytes and at chunk_bases[c] +
// pages[k]*page_stride.
extern "C" __global__ void cxl_blocks(const u64 *bases, const u64 *tier, const u64 *pages, const u64 *chunk_bases,
                                      u64 nblocks, u64 nchunks, u64 chunk_bytes, u64 page_stride, u64 lanes_per_row,
                                      u64 to_tier) {
  const u32 lanes = (u32)lanes_per_row;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u32 lane = (u32)(tid % lanes);
  const u64 groups = ((u64)gridDim.x * blockDim.x) / lanes;
  const u64 nrows = nblocks * nchunks;
  for (u64 r = tid / lanes; r < nrows; r += groups) {
    const u64 k = r / nchunks, c = r % nchunks;
    char *t = resolve(bases, tier[k]) + c * chunk_bytes;
    char *g = (char *)(chunk_bases[c] + pages[k] * page_stride);
    if (to_tier)
      copy_row(t, g, chunk_bytes, lane, lanes);
    else
      copy_row(g, t, chunk_bytes, lane, lanes);
  }
}
