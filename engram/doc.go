// Package engram serves DeepSeek Engram conditional-memory tables from the
// tier: the geometry of a model's tables, the N-gram hashing of token ids
// into table rows (bit-exact with DeepSeek's reference, including numpy's
// random multipliers), tables loaded into or generated in the tier, and the
// prefetch of a batch's rows into a device buffer through the gather engine
// with per-layer deadline accounting and an optional hot-row cache.
//
// By default the hot-row cache is managed on the host, one lookup per row
// of every call, so its bookkeeping is on the critical path: it is 8-way
// set associative with a set's tags in one cache line (hotset.go), and a
// call that does not fit is undone rather than left half-recorded. Even so
// it measured slower on a GPU than fetching every row at every hit rate
// tried (README, "Engram"), so it is off unless PrefetchOptions.Cache asks
// for it.
//
// PrefetchOptions.Planner = PlanEngine moves hashing and the cache's tags
// to the engine (engineplan.go): the host checks the ids and lays out each
// token's window of ids, and one engine call hashes, probes and fetches; on
// a GPU that is one launch of engram.cu, which has not yet run on one. The engine follows the host cache's rules
// in the same layout, so on the CPU engine (its Go twin) every row gets
// the slot host planning gives it; the tests hold them to that. A call
// that runs out of room differs: the host refuses it and changes nothing,
// the engine places what fits and Wait reports the rest (slot -1).
//
// Raw tokenizer ids become the compressed ids the hash takes through the
// geometry's lookup table (Compressor).
package engram
