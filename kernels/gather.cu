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
#define __shared__ __attribute__((shared))
#define __forceinline__ __attribute__((always_inline)) inline
#include <__clang_cuda_builtin_vars.h>
#endif

#ifdef __NVCC__
#define SYNC() __syncthreads()
#define SHFL_XOR(mask, v, w) __shfl_xor_sync((mask), (v), (w))
#else
#define SYNC() __syncthreads()
#define SHFL_XOR(mask, v, w) ((u32)__nvvm_shfl_sync_bfly_i32((mask), (int)(v), (int)(w), 0x1f))
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

// ---- Blocks moved with their CRC-32C ----
//
// cxl_blocks_crc moves what cxl_blocks moves and checksums each chunk as
// it goes, from the registers that carry it: no byte is read twice. out[r]
// is the raw CRC-32C register of row r (block r / nchunks, chunk r %
// nchunks) computed from 0 with no inversions; the host joins a block's
// chunks, and its seed, with the CRC shift (kernels/checksum.go). The
// checksum is the one every reader of the tier verifies.
//
// A group's lanes copy a chunk's 16-byte vectors interleaved (lane l takes
// vectors l, l + lanes, ...), so that their loads stay coalesced. Each lane
// folds its vectors into a register of its own (Horner: the register times
// x^(128·lanes), the gap to its next vector, plus that vector's CRC), then
// the lanes' registers are joined pairwise (a butterfly over the warp: at
// level j, the lower of two partners times x^(128·2^j) plus the upper).
// The chunk is taken as padded at its front with zero vectors up to a
// whole number of rounds, which a CRC from 0 does not see, so every lane
// ends its chain at the same round. A tail of under 16 bytes is copied and
// folded by lane 0; a chunk whose ends are not 16-byte aligned is copied
// and checksummed byte by byte by lane 0 (slow, and correct).

#define CRC_POLY 0x82f63b78u // Castagnoli, reflected

// crc_tab: slices 0-15 give the CRC from 0 of byte b followed by j zero
// bytes (slice j); slices 19 down to 16 multiply a register by
// x^(128·lanes), its bytes 0 to 3 each, so that crc_word reads them as it
// reads a data word's.
typedef u32 crc_tab[20][256];

static __device__ __forceinline__ u32 gf_mul(u32 a, u32 b) {
  u32 p = 0;
  for (int i = 0; i < 32; i++) {
    if (a & 0x80000000u) p ^= b; // bit 31 is x^0
    a <<= 1;
    b = (b >> 1) ^ (CRC_POLY & (0u - (b & 1u)));
  }
  return p;
}

// crc_tables fills the block's tables; every thread of the block calls it.
static __device__ void crc_tables(crc_tab &tab, u32 k_lanes) {
  for (u32 b = threadIdx.x; b < 256; b += blockDim.x) {
    u32 r = b;
    for (int i = 0; i < 8; i++) r = (r >> 1) ^ (CRC_POLY & (0u - (r & 1u)));
    tab[0][b] = r;
  }
  SYNC();
  for (u32 b = threadIdx.x; b < 256; b += blockDim.x) {
    u32 r = tab[0][b];
    for (int j = 1; j < 16; j++) {
      r = (r >> 8) ^ tab[0][r & 0xff];
      tab[j][b] = r;
    }
    for (int k = 0; k < 4; k++) tab[19 - k][b] = gf_mul(b << (8 * k), k_lanes); // byte k of a register
  }
  SYNC();
}

static __device__ __forceinline__ u32 crc_word(const crc_tab &tab, u32 w, int slice) {
  return tab[slice][w & 0xff] ^ tab[slice - 1][(w >> 8) & 0xff] ^ tab[slice - 2][(w >> 16) & 0xff] ^
         tab[slice - 3][w >> 24];
}

// crc_vec is the CRC from 0 of the 16 bytes of v (byte i in slice 15 - i).
static __device__ __forceinline__ u32 crc_vec(const crc_tab &tab, vec16 v) {
  return crc_word(tab, v.x, 15) ^ crc_word(tab, v.y, 11) ^ crc_word(tab, v.z, 7) ^ crc_word(tab, v.w, 3);
}

// fold is the register r, followed by the gap to this lane's next vector,
// then v.
static __device__ __forceinline__ u32 fold(const crc_tab &tab, u32 r, vec16 v) {
  return crc_word(tab, r, 19) ^ crc_vec(tab, v);
}

static __device__ __forceinline__ u32 crc_byte(const crc_tab &tab, u32 r, unsigned char b) {
  return (r >> 8) ^ tab[0][(r ^ b) & 0xff];
}

// copy_crc_vec copies n bytes (dst and src 16-byte aligned) and returns the
// chunk's raw CRC register in lane 0. shifts[1 + j] is x^(128·2^j).
static __device__ __forceinline__ u32 copy_crc_vec(const crc_tab &tab, const u32 *shifts, char *dst, const char *src,
                                                   u64 n, u32 lane, u32 lanes, u32 mask) {
  const u64 nv = n / 16;
  const u64 end = (nv + lanes - 1) / lanes * lanes; // virtual positions, padding first
  const u64 pad = end - nv;
  const vec16 *s = (const vec16 *)src;
  vec16 *d = (vec16 *)dst;
  u32 acc = 0;
  u64 p = lane;
  if (p < end) { // the first round: a zero vector where the padding is
    if (p >= pad) {
      const vec16 v = s[p - pad];
      d[p - pad] = v;
      acc = crc_vec(tab, v);
    }
    p += lanes;
  }
  for (; p + 3ull * lanes < end; p += 4ull * lanes) {
    const u64 i = p - pad;
    const vec16 a = s[i], b = s[i + lanes], c = s[i + 2ull * lanes], e = s[i + 3ull * lanes];
    d[i] = a;
    d[i + lanes] = b;
    d[i + 2ull * lanes] = c;
    d[i + 3ull * lanes] = e;
    acc = fold(tab, fold(tab, fold(tab, fold(tab, acc, a), b), c), e);
  }
  for (; p < end; p += lanes) {
    const vec16 v = s[p - pad];
    d[p - pad] = v;
    acc = fold(tab, acc, v);
  }
  for (u32 j = 0, w = 1; w < lanes; j++, w <<= 1) {
    const u32 other = SHFL_XOR(mask, acc, w);
    const u32 lo = (lane & w) ? other : acc, hi = (lane & w) ? acc : other;
    acc = gf_mul(lo, shifts[1 + j]) ^ hi;
  }
  if (lane == 0) {
    for (u64 j = nv * 16; j < n; j++) {
      const char b = src[j];
      dst[j] = b;
      acc = crc_byte(tab, acc, (unsigned char)b);
    }
  }
  return acc;
}

// copy_crc_bytes is the unaligned case: lane 0 alone, a byte at a time.
static __device__ __forceinline__ u32 copy_crc_bytes(const crc_tab &tab, char *dst, const char *src, u64 n, u32 lane) {
  u32 acc = 0;
  if (lane == 0) {
    for (u64 j = 0; j < n; j++) {
      const char b = src[j];
      dst[j] = b;
      acc = crc_byte(tab, acc, (unsigned char)b);
    }
  }
  return acc;
}

// cxl_blocks_crc is cxl_blocks, and out[r] the raw CRC register of row r.
// shifts: x^(128·lanes), then x^(128·2^j) for j = 0..4 (from the host's
// arithmetic, the one source of these constants).
extern "C" __global__ void cxl_blocks_crc(const u64 *bases, const u64 *tier, const u64 *pages, const u64 *chunk_bases,
                                          u64 nblocks, u64 nchunks, u64 chunk_bytes, u64 page_stride,
                                          u64 lanes_per_row, u64 to_tier, u32 *out, const u32 *shifts) {
  __shared__ crc_tab tab;
  crc_tables(tab, shifts[0]);
  const u32 lanes = (u32)lanes_per_row;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u32 lane = (u32)(tid % lanes);
  const u64 groups = ((u64)gridDim.x * blockDim.x) / lanes;
  const u64 nrows = nblocks * nchunks;
  const u32 first = (threadIdx.x % 32) & ~(lanes - 1); // the group's first lane in its warp
  const u32 mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1) << first;
  for (u64 r = tid / lanes; r < nrows; r += groups) {
    const u64 k = r / nchunks, c = r % nchunks;
    char *t = resolve(bases, tier[k]) + c * chunk_bytes;
    char *g = (char *)(chunk_bases[c] + pages[k] * page_stride);
    char *dst = to_tier ? t : g;
    const char *src = to_tier ? g : t;
    const u32 crc = ((((u64)dst | (u64)src) & 15) == 0)
                        ? copy_crc_vec(tab, shifts, dst, src, chunk_bytes, lane, lanes, mask)
                        : copy_crc_bytes(tab, dst, src, chunk_bytes, lane);
    if (lane == 0) out[r] = crc;
  }
}
