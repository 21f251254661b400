// cxltier Engram kernel: one prefetch call of one Engram layer in one
// launch. Every row a batch's tokens hash to is computed here from the
// tokens' id windows, looked up in a set-associative cache of rows kept in
// device memory, and the rows the cache lacks are copied from the tier
// (registered host memory) into their slots, so the host does no hashing,
// no cache bookkeeping and no per-row work.
//
// Built to PTX by scripts/genptx.sh; the PTX is committed and embedded.
// The Go twin is twinStepper (twin.go): it runs the same steps one row at a
// time with the host's own hash and victim rule, and the package's tests
// hold both to the host cache (hotset.go).
//
// Layouts (little endian; layout.go's engineLayout):
//   params (u64 words): max_n, heads, row_bytes, sets, spill slots, protect,
//     first, per_stripe, stripe, stripe0, control, n_devices, base Addr,
//     (pad to 16), device range ids[n_devices], multipliers[max_n],
//     moduli[R], offsets[R]; R = (max_n-1)*heads rows per token, order-major.
//   windows: per token max_n ids, the token first (i64).
//   tags: sets*8 u64, (row+1)<<16 | stamp, 0 empty; then a u32 lock per set.
//   out: u64 hits, fetched, spilled, without room; then an i32 slot per row.
//
// A warp takes 32 consecutive rows: each lane hashes and probes its row,
// then the warp copies the lanes' misses eight rows at a time, all 32
// lanes on each row, every lane loading its words of the eight rows before
// storing any, so the reads of host memory overlap.
//
// The cache probe is lock-free for hits: a lane that finds its row
// refreshes the way's stamp with a compare-and-swap. A miss takes its
// set's lock (one u32, spun on; sm_70+ schedules diverged lanes
// independently, so the holder progresses), looks again, and claims the
// victim way with a compare-and-swap too. A way stamped by this call is
// never a victim (protect >= 1), so a row found or inserted by one lane
// stays where it is for the rest of the launch; duplicates of a missing row
// wait for the lock, then find the row their first occurrence inserted.
// Its bytes arrive during this launch, which is all the reader needs: the
// rows are read after the launch completes (stream order).

#ifndef __NVCC__
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __forceinline__ __attribute__((always_inline)) inline
#include <__clang_cuda_builtin_vars.h>
#endif

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;

#ifdef __NVCC__
#define BALLOT(p) __ballot_sync(0xffffffffu, (p))
#define SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define POPC(x) __popc(x)
#define FFS(x) __ffs(x)
#define ATOM_CAS64(p, c, v) atomicCAS((p), (c), (v))
#define ATOM_CAS32(p, c, v) atomicCAS((p), (c), (v))
#define ATOM_EXCH32(p, v) atomicExch((p), (v))
#define ATOM_ADD64(p, v) atomicAdd((p), (v))
#define ATOM_SUB64(p, v) atomicAdd((p), (u64)0 - (v))
#define FENCE() __threadfence()
#define SYNCWARP() __syncwarp()
#else
#define BALLOT(p) __nvvm_vote_ballot_sync(0xffffffffu, (p))
#define SHFL(v, l) __nvvm_shfl_sync_idx_i32(0xffffffffu, (v), (l), 0x1f)
#define POPC(x) __builtin_popcount(x)
#define FFS(x) __builtin_ffs(x)
#define ATOM_CAS64(p, c, v) ((u64)__nvvm_atom_cas_gen_ll((i64 *)(p), (i64)(c), (i64)(v)))
#define ATOM_CAS32(p, c, v) ((u32)__nvvm_atom_cas_gen_i((int *)(p), (int)(c), (int)(v)))
#define ATOM_EXCH32(p, v) ((u32)__nvvm_atom_xchg_gen_i((int *)(p), (int)(v)))
#define ATOM_ADD64(p, v) ((u64)__nvvm_atom_add_gen_ll((i64 *)(p), (i64)(v)))
#define ATOM_SUB64(p, v) ((u64)__nvvm_atom_add_gen_ll((i64 *)(p), -(i64)(v)))
#define FENCE() __nvvm_membar_gl()
#define SYNCWARP() __nvvm_bar_warp_sync(0xffffffffu)
#endif

#define ADDR_RANGE_SHIFT 56
#define ADDR_OFFSET_MASK ((1ull << ADDR_RANGE_SHIFT) - 1)
#define WAYS 8
#define STAMP_BITS 16
#define STAMP_MASK ((1ull << STAMP_BITS) - 1)
#define GOLDEN 0x9E3779B97F4A7C15ull

enum { P_MAXN, P_HEADS, P_ROW_BYTES, P_SETS, P_SPILL, P_PROTECT, P_FIRST, P_PER_STRIPE, P_STRIPE, P_STRIPE0,
       P_CONTROL, P_DEVICES, P_BASE, P_HEADER = 16 };
enum { C_HITS, C_FETCHED, C_SPILLED, C_NO_ROOM, C_WORDS };

// layer is the params block unpacked.
struct layer {
  i64 maxn, heads, per_tok;
  u64 row_bytes, sets, protect, first, per_stripe, stripe, stripe0, control, ndev, base;
  const u64 *dev;
  const i64 *mult, *mod, *off;
};

static __device__ layer unpack(const u64 *p) {
  layer l;
  l.maxn = (i64)p[P_MAXN];
  l.heads = (i64)p[P_HEADS];
  l.per_tok = (l.maxn - 1) * l.heads;
  l.row_bytes = p[P_ROW_BYTES];
  l.sets = p[P_SETS];
  l.protect = p[P_PROTECT];
  l.first = p[P_FIRST];
  l.per_stripe = p[P_PER_STRIPE];
  l.stripe = p[P_STRIPE];
  l.stripe0 = p[P_STRIPE0];
  l.control = p[P_CONTROL];
  l.ndev = p[P_DEVICES];
  l.base = p[P_BASE];
  l.dev = p + P_HEADER;
  l.mult = (const i64 *)(l.dev + l.ndev);
  l.mod = l.mult + l.maxn;
  l.off = l.mod + l.per_tok;
  return l;
}

// hash is row r of the token whose window is w: order r/heads + 2, head
// r%heads; the modulus is unsigned, so no id could index outside the table.
static __device__ __forceinline__ u64 hash(const layer &l, const i64 *w, i64 r) {
  const i64 o = r / l.heads;
  i64 mix = w[0] * l.mult[0];
  for (i64 k = 1; k <= o + 1; k++) mix ^= w[k] * l.mult[k];
  return (u64)mix % (u64)l.mod[r] + (u64)l.off[r];
}

// row_addr is TableMap.Addr: where row lies in registered memory.
static __device__ __forceinline__ const char *row_addr(const layer &l, const u64 *bases, u64 row) {
  u64 a;
  if (row < l.first) {
    a = l.base + row * l.row_bytes;
  } else {
    const u64 j = row - l.first, g = l.stripe0 + j / l.per_stripe;
    a = l.dev[g % l.ndev] << ADDR_RANGE_SHIFT | (l.control + (g / l.ndev) * l.stripe + (j % l.per_stripe) * l.row_bytes);
  }
  return (const char *)(bases[a >> ADDR_RANGE_SHIFT] + (a & ADDR_OFFSET_MASK));
}

// find looks for want in a set's line: its way, stamped now (refreshed by
// compare-and-swap), or -1. A swap that fails means another lane changed
// the way (stamped it, or evicted it): look again.
static __device__ int find(u64 *line, u64 want, u64 now) {
  for (;;) {
    bool again = false;
    for (int w = 0; w < WAYS; w++) {
      const u64 tag = ((volatile u64 *)line)[w];
      if (tag >> STAMP_BITS != want) continue;
      if ((tag & STAMP_MASK) == now || ATOM_CAS64(&line[w], tag, want << STAMP_BITS | now) == tag) return w;
      again = true;
      break;
    }
    if (!again) return -1;
  }
}

// claim takes a victim way for want (the caller holds the set's lock):
// an empty way first, else the least recently used way no protected call
// used. Hits may refresh ways meanwhile, so the swap can fail: choose again.
static __device__ int claim(u64 *line, u64 want, u64 now, u64 protect) {
  for (;;) {
    int victim = -1;
    u64 oldest = 0, old = 0;
    for (int w = 0; w < WAYS; w++) {
      const u64 tag = ((volatile u64 *)line)[w];
      u64 age = (now - tag) & STAMP_MASK;
      if (tag == 0) {
        age = STAMP_MASK + 1;
      } else if (age < protect) {
        continue;
      }
      if (age > oldest) victim = w, oldest = age, old = tag;
    }
    if (victim < 0) return -1;
    if (ATOM_CAS64(&line[victim], old, want << STAMP_BITS | now) == old) return victim;
  }
}

// probe gives row a slot: a hit's, a claimed way's or a spill slot (then
// *fetch), or -1 when this call's spill bank is used up.
static __device__ int probe(const layer &l, u64 *tags, u32 *locks, u64 *counts, u64 row, u64 now, u64 bank_lo,
                            u64 bank_size, bool *fetch) {
  const u64 set = (row * GOLDEN >> 32) & (l.sets - 1);
  u64 *line = tags + set * WAYS;
  const u64 want = row + 1;
  *fetch = false;
  for (;;) {
    int w = find(line, want, now);
    if (w >= 0) return (int)(set * WAYS + w);
    if (ATOM_CAS32(&locks[set], 0u, 1u) != 0u) continue; // an insert is under way: look again
    w = find(line, want, now);
    if (w < 0) {
      w = claim(line, want, now, l.protect);
      *fetch = w >= 0;
    }
    FENCE();
    ATOM_EXCH32(&locks[set], 0u);
    if (w >= 0) return (int)(set * WAYS + w);
    const u64 n = ATOM_ADD64(&counts[C_SPILLED], 1);
    if (n < bank_size) {
      *fetch = true;
      return (int)(bank_lo + n);
    }
    // Keeps the count at bank_size: every add past it is taken back.
    ATOM_SUB64(&counts[C_SPILLED], 1);
    ATOM_ADD64(&counts[C_NO_ROOM], 1);
    return -1;
  }
}

#define FETCH_GROUP 8

// copy_words: the warp copies m (<= FETCH_GROUP) rows of nw words of type
// W at once, each lane loading its words of every row before storing any,
// so that a lane keeps m reads of host memory in flight rather than one.
template <typename W>
static __device__ __forceinline__ void copy_words(char *const *dst, const char *const *src, int m, u64 nw, u32 lane) {
  for (u64 i = lane; i < nw; i += 32) {
    W v[FETCH_GROUP];
#pragma unroll
    for (int j = 0; j < FETCH_GROUP; j++)
      if (j < m) v[j] = ((const W *)src[j])[i];
#pragma unroll
    for (int j = 0; j < FETCH_GROUP; j++)
      if (j < m) ((W *)dst[j])[i] = v[j];
  }
}

// fetch_rows copies the warp's rows to fetch (the lanes set in todo), a group
// at a time: 8-byte words when every end allows, else 4-byte words (rows
// are a multiple of 4 bytes).
static __device__ void fetch_rows(const layer &l, const u64 *bases, u64 cache, u32 todo, u64 row, int slot, u32 lane) {
  while (todo) {
    char *dst[FETCH_GROUP];
    const char *src[FETCH_GROUP];
    u64 align = l.row_bytes;
    int m = 0;
    for (; m < FETCH_GROUP && todo; m++) {
      const int from = FFS(todo) - 1;
      todo &= todo - 1;
      const u64 r = (u64)(u32)SHFL((int)(u32)row, from) | (u64)(u32)SHFL((int)(row >> 32), from) << 32;
      const u64 s = (u64)(u32)SHFL(slot, from);
      dst[m] = (char *)(cache + s * l.row_bytes);
      src[m] = row_addr(l, bases, r);
      align |= (u64)dst[m] | (u64)src[m];
    }
    if ((align & 7) == 0)
      copy_words<u64>(dst, src, m, l.row_bytes / 8, lane);
    else
      copy_words<u32>(dst, src, m, l.row_bytes / 4, lane);
  }
}

extern "C" __global__ void cxl_engram_rows(const u64 *bases, const u64 *params, const i64 *windows, u64 tokens,
                                           u64 *tags, u64 cache, u64 *out, u64 epoch) {
  const layer l = unpack(params);
  const u64 n = tokens * (u64)l.per_tok;
  int *slots = (int *)(out + C_WORDS);
  u32 *locks = (u32 *)(tags + l.sets * WAYS);
  const u64 now = epoch & STAMP_MASK;
  u64 bank_lo = 0, bank_size = 0;
  if (l.sets > 0) {
    const u64 spill = (u64)((const u64 *)params)[P_SPILL], b = epoch % l.protect;
    bank_lo = l.sets * WAYS + spill * b / l.protect;
    bank_size = spill * (b + 1) / l.protect - spill * b / l.protect;
  }
  const u32 lane = threadIdx.x & 31;
  const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  for (u64 first = warp * 32; first < n; first += warps * 32) {
    const u64 i = first + lane;
    u64 row = 0;
    int slot = -1;
    bool fetch = false;
    if (i < n) {
      row = hash(l, windows + (i / l.per_tok) * l.maxn, (i64)(i % l.per_tok));
      if (l.sets == 0) {
        slot = (int)i;
        fetch = true;
      } else {
        slot = probe(l, tags, locks, out, row, now, bank_lo, bank_size, &fetch);
      }
      slots[i] = slot;
    }
    SYNCWARP();
    u32 todo = BALLOT(fetch);
    const u32 hits = BALLOT(i < n && !fetch && slot >= 0);
    if (lane == 0) {
      if (hits) ATOM_ADD64(&out[C_HITS], (u64)POPC(hits));
      if (todo) ATOM_ADD64(&out[C_FETCHED], (u64)POPC(todo));
    }
    fetch_rows(l, bases, cache, todo, row, slot, lane);
  }
}
