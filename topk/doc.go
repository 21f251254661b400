// Package topk keeps the full KV cache of sparse-attention sequences
// (DeepSeek DSA, SGLang HiSparse) in the tier and resolves each decode
// step's top-k selection against a small per-request buffer in engine (GPU)
// memory, so that only misses cross the bus.
//
// Layout. A sequence is registered under a request index (SGLang's
// req_pool_indices). Each of its layers is a list of extents, one tier chunk
// each, holding consecutive token entries: a step's top-k of one layer
// falls in a compact address range, and extents spread over the tier's
// devices as chunks do. Entries are appended from host bytes or scattered
// from engine memory.
//
// Buffer. Per layer the pool owns one engine buffer with Slots+1 entry rows
// per request: Slots rows managed in LRU order and one reserved row for the
// newest token. Resolve reproduces SGLang's HiSparse swap-in exactly
// (load_cache_to_device_buffer_kernel): a sequence no longer than Slots is
// fully resident with token p in slot p; otherwise the newest token
// (seq_len-1) always maps to the reserved slot, other selected tokens found
// in the slot table are hits, the i-th miss (in top-k order) takes the i-th
// least recently used slot not selected this step, and the LRU order
// becomes [unused evictable slots, miss slots, hit slots]. Where SGLang's
// kernel leaves behaviour to chance, the package decides: duplicate
// positions in one step count once and share a slot; -1 padding maps to
// slot -1 and counts nothing.
//
// SGLang's bookkeeping assumes a slot holds its token's bytes once the
// table says so (prefill wrote them to the device). Here every slot also
// records which token's bytes it really holds, and Resolve copies whatever
// the table promises but the slot lacks ("fills"), so the slot tables stay
// identical to SGLang's while the bytes are always right. All copies of a
// batch go to the engine as one gather.
//
// Planning. With PlanHost the slot tables live in host memory and Go plans
// each request (a batch spread over goroutines); only the copies run on the
// engine. With PlanEngine (the default on a GPU engine) the tables live in
// engine memory and the engine plans: on the GPU, the kernels of
// topk.cu (run through the kernels package's launch API), one block per request with the step's selections in a
// shared-memory hash, block scans built on warp ballots, and the block's
// copies fetched by the same block as soon as its plan is done; on the CPU
// engine, their Go twin. ResolveIn takes selections and returns slots in
// engine memory (a GPU tensor), so nothing crosses the bus but the misses;
// a bad selection is then found on the device and still changes nothing.
// Tests hold both planners to the host planner on random traces, table for
// table and byte for byte.
package topk
