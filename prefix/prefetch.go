//go:build amd64 || arm64

package prefix

// prefetch asks the core to bring p's cache line into its caches and
// returns at once (prefetch_*.s). Touch-ahead uses it rather than a load:
// a load that misses holds its place in the reorder window until the data
// comes, so a run of them stalls the core after a handful of keys, where
// prefetches retire at once and the misses overlap. Measured on the
// 2-core Zen 4 VM, 60k keys in a 16 MiB index: 2.5-3x faster probes
// than touching each home with a load. A hint only: it never faults, so an
// address need not be checked beyond what made it.
//
//go:noescape
func prefetch(p *uint64)
