// cxltier top-k planning kernels: one decode step of one layer of the
// sparse-attention buffer (SGLang HiSparse's swap-in rules, see package
// topk), resolved on the GPU against slot tables kept in device memory, and
// the step's copies fetched from the tier, in two launches on one stream:
//
//   cxl_topk_check  every selection in [-1, length); the first bad one is
//                   recorded and the plan kernel then changes nothing
//                   (small batches: each plan block checks the whole batch
//                   itself, and this launch is skipped)
//   cxl_topk_plan   one block per request: the slot of every selection,
//                   the new slot table and LRU order, then the block's
//                   copies, tier → slot rows, as soon as its plan is done
//
// Built to PTX by scripts/genptx.sh; the PTX is committed and embedded.
// The Go twin of cxl_topk_plan is twinPlanner (twin.go): the CPU engine runs
// it, and the tests hold both to the package's host planner.
//
// Layouts (all little endian, the Go side's engineLayout in layout.go):
//   state, per request and layer, one region of region_bytes:
//     int32 tokens[S+1]  the token each slot holds for SGLang (slot S: newest)
//     int32 loaded[S+1]  the token whose bytes are really in the slot, -1 none
//     int32 lru[S]       slot numbers, least recently used first
//     (padding to 8)
//     u64   extents[max_ext]  tier Addr of each extent of extent_entries entries
//   step (u64 words, in page-locked host memory the kernels read and write
//     through its device mapping, so a step needs no copy either way):
//     [0] first bad selection (b*k+i), ~0 when none; [1, 1+batch) request |
//     length<<32; [1+batch+2b] hits | misses<<32, [2+batch+2b] fills |
//     newest<<32.
//   mark (one u64 in device memory): the check kernel's verdict, epoch<<40
//     | (2^40-1 - first bad index); an older epoch means none, so the word
//     never needs clearing between steps.
//   ops: u64 pairs (tier Addr, destination row) of the step's copies,
//     request b's from b*k on.

#ifndef __NVCC__
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ __attribute__((always_inline)) inline
#include <__clang_cuda_builtin_vars.h>
#endif

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#ifdef __NVCC__
#define SYNC() __syncthreads()
#define BALLOT(p) __ballot_sync(0xffffffffu, (p))
#define SHFL_UP(v, d) __shfl_up_sync(0xffffffffu, (v), (d))
#define SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define POPC(x) __popc(x)
#define ATOM_CAS64(p, c, v) atomicCAS((p), (c), (v))
#define ATOM_MIN64(p, v) atomicMin((p), (v))
#define ATOM_MAX64(p, v) atomicMax((p), (v))
#define ATOM_ADD32(p, v) atomicAdd((p), (v))
#else
#define SYNC() __syncthreads()
#define BALLOT(p) __nvvm_vote_ballot_sync(0xffffffffu, (p))
#define SHFL_UP(v, d) __nvvm_shfl_sync_up_i32(0xffffffffu, (v), (d), 0)
#define SHFL(v, l) __nvvm_shfl_sync_idx_i32(0xffffffffu, (v), (l), 0x1f)
#define POPC(x) __builtin_popcount(x)
#define ATOM_CAS64(p, c, v) __nvvm_atom_cas_gen_ll((i64 *)(p), (i64)(c), (i64)(v))
#define ATOM_MIN64(p, v) __nvvm_atom_min_gen_ull((p), (v))
#define ATOM_MAX64(p, v) __nvvm_atom_max_gen_ull((p), (v))
#define ATOM_ADD32(p, v) __nvvm_atom_add_gen_i((int *)(p), (int)(v))
#endif

#define ADDR_RANGE_SHIFT 56
#define ADDR_OFFSET_MASK ((1ull << ADDR_RANGE_SHIFT) - 1)
#define NONE ~0ull
#define NO_SLOT 0xffffull
#define LOAD_UNROLL 4

static __device__ __forceinline__ char *resolve_addr(const u64 *bases, u64 addr) {
  return (char *)(bases[addr >> ADDR_RANGE_SHIFT] + (addr & ADDR_OFFSET_MASK));
}

#define MARK_SHIFT 40
#define MARK_INDEX ((1ull << MARK_SHIFT) - 1)

// cxl_topk_check: a block per batch row (the row's length read once, from
// host memory, for the whole block).
extern "C" __global__ void cxl_topk_check(const int *sel, const u64 *rows, u64 *mark, u64 batch, u64 k, u64 epoch) {
  for (u64 b = blockIdx.x; b < batch; b += gridDim.x) {
    const i64 len = (i64)(rows[b] >> 32);
    for (u64 i = threadIdx.x; i < k; i += blockDim.x) {
      const int p = sel[b * k + i];
      if (p < -1 || (i64)p >= len) ATOM_MAX64(mark, epoch << MARK_SHIFT | (MARK_INDEX - (b * k + i)));
    }
  }
}

// Shared memory of cxl_topk_plan, carved from the dynamic allocation.
// hash: open addressing over the step's selected tokens; an entry is
// token<<32 | first selection index<<16 | NO_SLOT, ~0 when empty.
// atomicMin on an entry with the same token keeps the smallest index, so
// duplicates find their first occurrence. An entry's slot lives apart, in
// slot[h]: it is written while other threads probe the hash words, which
// must not change under them.
struct plan_smem {
  u64 *hash;
  u16 *slot;      // H: the slot of hash[h]'s token, NO_SLOT until known
  int *tok;       // S: the request's slot tokens at entry
  int *have;      // S: what the slots hold at entry
  u16 *miss_sel; // k: selection index of the m-th miss
  u16 *lru;      // S: the request's LRU order at entry
  u8 *hit;       // S: slot holds a selected token
  u32 *warp;     // 33: per-warp counts for the block scan, [32] the total
  u32 *vars;     // 8: scan carry, newest selected, copies, hits
  u32 bits;
};

static __device__ __forceinline__ u32 hash_home(int tok, u32 bits) { return ((u32)tok * 2654435769u) >> (32 - bits); }

static __device__ void hash_insert(plan_smem &m, int tok, u32 i) {
  const u32 mask = (1u << m.bits) - 1;
  const u64 want = (u64)(u32)tok << 32 | (u64)i << 16 | NO_SLOT;
  for (u32 h = hash_home(tok, m.bits);; h = (h + 1) & mask) {
    u64 cur = m.hash[h];
    if (cur == NONE) {
      cur = ATOM_CAS64(&m.hash[h], NONE, want);
      if (cur == NONE) return;
    }
    if ((u32)(cur >> 32) == (u32)tok) {
      ATOM_MIN64(&m.hash[h], want);
      return;
    }
  }
}

// hash_find returns the entry's index, or -1 when tok was not selected.
static __device__ int hash_find(const plan_smem &m, int tok) {
  const u32 mask = (1u << m.bits) - 1;
  for (u32 h = hash_home(tok, m.bits);; h = (h + 1) & mask) {
    const u64 cur = m.hash[h];
    if (cur == NONE) return -1;
    if ((u32)(cur >> 32) == (u32)tok) return (int)h;
  }
}

// block_rank returns the number of threads before this one, in this round
// and the rounds before (vars[0]), whose flag is set, and sets *total to
// the running count including this round. Every thread must call it the
// same number of times.
static __device__ u32 block_rank(plan_smem &m, bool flag, u32 *total) {
  const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const u32 ballot = BALLOT(flag);
  if (lane == 0) m.warp[w] = POPC(ballot);
  SYNC();
  if (w == 0) {
    const u32 x = lane < nw ? m.warp[lane] : 0;
    u32 inc = x;
    for (u32 d = 1; d < 32; d <<= 1) {
      const u32 t = SHFL_UP(inc, d);
      if (lane >= d) inc += t;
    }
    m.warp[lane] = inc - x;
    if (lane == 31) m.warp[32] = inc;
  }
  SYNC();
  const u32 carry = m.vars[0];
  const u32 r = carry + m.warp[w] + POPC(ballot & ((1u << lane) - 1));
  *total = carry + m.warp[32];
  SYNC();
  if (threadIdx.x == 0) m.vars[0] = *total;
  return r;
}

static __device__ __forceinline__ void reset_rank(plan_smem &m) {
  SYNC();
  if (threadIdx.x == 0) m.vars[0] = 0;
  SYNC();
}

struct plan_args {
  const u64 *rows;
  const int *sel;
  int *out;
  char *state;
  u64 *ops;
  u64 batch, k, slots, region, ext_off, ext_entries, entry_bytes, layers, layer;
};

// push appends a copy of token tok of the request into slot s to the
// block's list (ops from b*k on): one shared atomic per warp. Every lane of
// the warp must call it.
static __device__ void push(const plan_args &a, u32 *n, const u64 *ext, u64 req, bool want, int tok, u32 s) {
  const u32 lane = threadIdx.x & 31;
  const u32 ballot = BALLOT(want);
  if (ballot == 0) return;
  u32 base = 0;
  if (lane == 0) base = (u32)ATOM_ADD32(n, POPC(ballot));
  base = SHFL(base, 0);
  if (want) {
    const u64 at = blockIdx.x * a.k + base + POPC(ballot & ((1u << lane) - 1));
    const u64 t = (u64)tok;
    a.ops[2 * at] = ext[t / a.ext_entries] + (t % a.ext_entries) * a.entry_bytes;
    a.ops[2 * at + 1] = req * (a.slots + 1) + s;
  }
}

static __device__ __forceinline__ u64 rounds(u64 n) { return (n + blockDim.x - 1) / blockDim.x; }

static __device__ void plan_short(plan_args &a, plan_smem &m, u64 req, const int *sel, int *out, int *loaded, const u64 *ext,
                                  u32 *hits, u32 *fills) {
  for (u64 r = 0; r < rounds(a.k); r++) {
    const u64 i = r * blockDim.x + threadIdx.x;
    const int p = i < a.k ? sel[i] : -1;
    bool fill = false;
    if (p >= 0) {
      out[i] = p;
      const int h = hash_find(m, p);
      if ((u32)(m.hash[h] >> 16 & 0xffff) == i) {
        ATOM_ADD32(hits, 1);
        if (loaded[p] != p) {
          loaded[p] = p;
          fill = true;
          ATOM_ADD32(fills, 1);
        }
      }
    } else if (i < a.k) {
      out[i] = -1;
    }
    push(a, &m.vars[2], ext, req, fill, p, (u32)p);
  }
}

static __device__ void plan_long(plan_args &a, plan_smem &m, u64 req, int newest, const int *sel, int *out, int *tokens,
                                 int *loaded, int *lru, const u64 *ext, u32 *counts) {
  const u64 S = a.slots;
  // Hits: slots whose token was selected; a hit whose slot lacks the bytes
  // the table promises is filled.
  // The tables go to shared memory first, LOAD_UNROLL slots per thread at
  // a time, so that the loads' latencies overlap instead of adding up.
  for (u32 s0 = threadIdx.x; s0 < S; s0 += LOAD_UNROLL * blockDim.x) {
    int t[LOAD_UNROLL], h[LOAD_UNROLL], l[LOAD_UNROLL];
#pragma unroll
    for (u32 u = 0; u < LOAD_UNROLL; u++) {
      const u32 s = s0 + u * blockDim.x;
      if (s < S) t[u] = tokens[s], h[u] = loaded[s], l[u] = lru[s];
    }
#pragma unroll
    for (u32 u = 0; u < LOAD_UNROLL; u++) {
      const u32 s = s0 + u * blockDim.x;
      if (s < S) m.tok[s] = t[u], m.have[s] = h[u], m.lru[s] = (u16)l[u];
    }
  }
  SYNC();
  u32 fills = 0;
  for (u64 r = 0; r < rounds(S); r++) {
    const u64 s = r * blockDim.x + threadIdx.x;
    int t = -1, h = -1;
    bool fill = false;
    if (s < S) {
      t = m.tok[s];
      const int have = m.have[s];
      h = t >= 0 ? hash_find(m, t) : -1;
      m.hit[s] = h >= 0;
      if (h >= 0) {
        m.slot[h] = (u16)s;
        ATOM_ADD32(&m.vars[3], 1);
        if (have != t) {
          loaded[s] = t;
          fill = true;
        }
      }
    }
    fills += POPC(BALLOT(fill)) * ((threadIdx.x & 31) == 0);
    push(a, &m.vars[2], ext, req, fill, t, (u32)s);
  }
  if ((threadIdx.x & 31) == 0) ATOM_ADD32(&counts[2], fills);
  reset_rank(m);
  // Misses in top-k order, first occurrences only.
  u32 misses = 0;
  for (u64 r = 0; r < rounds(a.k); r++) {
    const u64 i = r * blockDim.x + threadIdx.x;
    const int p = i < a.k ? sel[i] : -1;
    bool miss = false;
    if (p >= 0 && p != newest) {
      const int h = hash_find(m, p);
      miss = (u32)(m.hash[h] >> 16 & 0xffff) == i && m.slot[h] == NO_SLOT;
    }
    const u32 rank = block_rank(m, miss, &misses);
    if (miss) m.miss_sel[rank] = (u16)i;
  }
  // One pass over the LRU order: the m-th evictable slot takes the m-th
  // miss, and every slot gets its place in the new order: unused evictable
  // slots, then the misses, then the hits.
  const u32 evictable = (u32)S - m.vars[3];
  reset_rank(m);
  u32 seen = 0;
  for (u64 r = 0; r < rounds(S); r++) {
    const u64 j = r * blockDim.x + threadIdx.x;
    const u32 s = j < S ? m.lru[j] : 0;
    const bool ev = j < S && !m.hit[s];
    const u32 rank = block_rank(m, ev, &seen);
    const bool take = ev && rank < misses;
    int p = -1;
    if (take) {
      p = sel[m.miss_sel[rank]];
      const int h = hash_find(m, p);
      m.slot[h] = (u16)s;
      tokens[s] = p;
      loaded[s] = p;
    }
    if (j < S) {
      const u64 pos = ev ? (rank >= misses ? rank - misses : evictable - misses + rank) : evictable + (j - rank);
      lru[pos] = (int)s;
    }
    push(a, &m.vars[2], ext, req, take, p, s);
  }
  // Outputs. Other warps gave misses their slots in the last round above:
  // wait for them.
  SYNC();
  for (u64 r = 0; r < rounds(a.k); r++) {
    const u64 i = r * blockDim.x + threadIdx.x;
    if (i < a.k) {
      const int p = sel[i];
      if (p < 0) {
        out[i] = -1;
      } else if (p == newest) {
        out[i] = (int)S;
        ATOM_ADD32(&m.vars[1], 1); // duplicates of it all count
      } else {
        out[i] = (int)m.slot[hash_find(m, p)];
      }
    }
  }
  SYNC();
  bool newest_fill = false;
  if (threadIdx.x == 0 && m.vars[1] && loaded[S] != newest) {
    loaded[S] = newest;
    newest_fill = true;
    counts[3] = 1;
  }
  if (threadIdx.x < 32) push(a, &m.vars[2], ext, req, newest_fill, newest, (u32)S);
  if (threadIdx.x == 0) {
    counts[0] = (u32)(S - evictable);
    counts[1] = misses;
  }
}

#ifdef __NVCC__
typedef uint4 vec16;
#else
typedef u32 vec16 __attribute__((ext_vector_type(4)));
#endif

#define FETCH_UNROLL 4

// fetch copies the block's n planned rows (entry_bytes, a multiple of 16,
// so both ends of every row are 16-byte aligned) as one stream of 16-byte
// vectors over all the block's threads, each loading FETCH_UNROLL vectors
// before storing any, so that many PCIe reads are in flight per thread.
static __device__ void fetch(const u64 *bases, const u64 *ops, u32 n, u32 vpr, u64 entry_bytes, u64 buf) {
  const u32 total = n * vpr;
  for (u32 v0 = threadIdx.x; v0 < total; v0 += FETCH_UNROLL * blockDim.x) {
    vec16 x[FETCH_UNROLL];
#pragma unroll
    for (u32 u = 0; u < FETCH_UNROLL; u++) {
      const u32 v = v0 + u * blockDim.x;
      if (v < total) x[u] = ((const vec16 *)resolve_addr(bases, ops[2 * (v / vpr)]))[v % vpr];
    }
#pragma unroll
    for (u32 u = 0; u < FETCH_UNROLL; u++) {
      const u32 v = v0 + u * blockDim.x;
      if (v < total) ((vec16 *)(buf + ops[2 * (v / vpr) + 1] * entry_bytes))[v % vpr] = x[u];
    }
  }
}

// batch_valid is cxl_topk_check done by every block on its own, for small
// batches where a second launch costs more than reading the whole batch's
// selections once per block: each block learns on its own whether the
// step is valid, so none changes anything when one selection is bad.
// Block 0 records the first bad one.
#define CHECK_ALL_MAX_BATCH 64
#define CHECK_UNROLL 8

static __device__ bool batch_valid(const int *sel, const u64 *rows, u64 *step, u64 batch, u64 k) {
  __shared__ u64 first_bad;
  __shared__ int lens[CHECK_ALL_MAX_BATCH];
  if (threadIdx.x == 0) first_bad = NONE;
  if (threadIdx.x < batch) lens[threadIdx.x] = (int)(rows[threadIdx.x] >> 32); // one round trip to host memory
  SYNC();
  // n ≤ the host's limit (2^16), so 32-bit arithmetic; CHECK_UNROLL loads
  // are issued before any is compared, so their latencies overlap.
  const u32 n = (u32)(batch * k), kk = (u32)k;
  for (u32 i0 = threadIdx.x; i0 < n; i0 += CHECK_UNROLL * blockDim.x) {
    int p[CHECK_UNROLL];
#pragma unroll
    for (u32 u = 0; u < CHECK_UNROLL; u++) {
      const u32 i = i0 + u * blockDim.x;
      p[u] = i < n ? sel[i] : -1;
    }
#pragma unroll
    for (u32 u = 0; u < CHECK_UNROLL; u++) {
      const u32 i = i0 + u * blockDim.x;
      if (p[u] < -1 || (i < n && p[u] >= lens[i / kk])) ATOM_MIN64(&first_bad, (u64)i);
    }
  }
  SYNC();
  if (blockIdx.x == 0 && threadIdx.x == 0) step[0] = first_bad;
  return first_bad == NONE;
}

extern "C" __global__ void cxl_topk_plan(const int *sel, int *out, char *state, u64 *step, const u64 *mark, u64 *ops,
                                         u64 batch, u64 k, u64 slots, u64 region, u64 ext_off, u64 ext_entries,
                                         u64 entry_bytes, u64 layers, u64 layer, u64 hash_bits, const u64 *bases, u64 buf,
                                         u64 check, u64 epoch) {
  const u64 *rows = step + 1;
  const u64 row = rows[blockIdx.x]; // from host memory: issued first, used last
  // check: 0 the selections were checked by the caller, 1 by this block
  // (the whole batch), 2 by cxl_topk_check. Any bad one: change nothing.
  if (check == 1 && !batch_valid(sel, rows, step, batch, k)) return;
  if (check == 2) {
    const u64 v = *mark;
    if (v >> MARK_SHIFT == epoch) {
      if (blockIdx.x == 0 && threadIdx.x == 0) step[0] = MARK_INDEX - (v & MARK_INDEX);
      return;
    }
  }
  plan_args a = {rows, sel, out, state, ops, batch, k, slots, region, ext_off, ext_entries, entry_bytes, layers, layer};
  extern __shared__ u64 smem[];
  plan_smem m;
  m.bits = (u32)hash_bits;
  const u64 H = 1ull << hash_bits;
  m.hash = smem;
  m.warp = (u32 *)(smem + H);
  m.vars = m.warp + 33;
  m.slot = (u16 *)(m.vars + 8);
  m.tok = (int *)(m.slot + H);
  m.have = m.tok + slots;
  m.miss_sel = (u16 *)(m.have + slots);
  m.lru = m.miss_sel + k;
  m.hit = (u8 *)(m.lru + slots);
  __shared__ u32 counts[4];
  const u64 b = blockIdx.x;
  const u64 req = row & 0xffffffffull;
  const i64 len = (i64)(row >> 32);
  char *reg = state + (req * layers + layer) * region;
  int *tokens = (int *)reg, *loaded = tokens + slots + 1, *lru = loaded + slots + 1;
  const u64 *ext = (const u64 *)(reg + ext_off);
  const int *s = sel + b * k;
  int *o = out + b * k;
  for (u64 h = threadIdx.x; h < H; h += blockDim.x) m.hash[h] = NONE, m.slot[h] = (u16)NO_SLOT;
  if (threadIdx.x < 8) m.vars[threadIdx.x] = 0;
  if (threadIdx.x < 4) counts[threadIdx.x] = 0;
  SYNC();
  const bool longseq = len > (i64)slots;
  const int newest = (int)(len - 1);
  for (u64 i = threadIdx.x; i < k; i += blockDim.x) {
    const int p = s[i];
    if (p >= 0 && !(longseq && p == newest)) hash_insert(m, p, (u32)i);
  }
  SYNC();
  if (longseq)
    plan_long(a, m, req, newest, s, o, tokens, loaded, lru, ext, counts);
  else
    plan_short(a, m, req, s, o, loaded, ext, &counts[0], &counts[2]);
  SYNC();
  if (threadIdx.x == 0) {
    step[1 + batch + 2 * b] = (u64)counts[0] | (u64)counts[1] << 32;
    step[2 + batch + 2 * b] = (u64)counts[2] | (u64)counts[3] << 32;
  }
  fetch(bases, ops + 2 * b * k, m.vars[2], (u32)(entry_bytes / 16), entry_bytes, buf);
}

