// Package engram serves DeepSeek Engram conditional-memory tables from the
// tier: the geometry of a model's tables, the N-gram hashing of token ids
// into table rows (bit-exact with DeepSeek's reference, including numpy's
// random multipliers), tables loaded into or generated in the tier, and the
// prefetch of a batch's rows into a device buffer through the gather engine
// with per-layer deadline accounting and a hot-row cache.
package engram
