// Package tier owns the shared memory region that every cxltier process maps:
// its backings (shm, file, hugetlbfs, devdax, anonymous), the on-media format
// (a versioned, checksummed header followed by fixed areas), device-independent
// offsets and striping across devices, the global chunk allocator and the
// per-process heaps carved from it, the flush/fence primitives for
// non-coherent memory, the two-tier lock, the root directory and client leases.
//
// The region is the API: processes (and, on CXL, hosts) cooperate through the
// structures in it and never through pointers. Every structure is addressed by
// an Offset from the start of the logical region, is cache-line aligned, and
// every cache line is written by one party at a time, so that a flush of a line
// on a non-coherent host never overwrites another host's newer data.
//
// Layout of device 0 (other devices carry a copy of the header only):
//
//	header page · lease table · lock area · root directory · chunk bitmap ·
//	chunk owners · (pad to stripe) · data
//
// The package knows nothing about KV caches, Engram tables or GPUs.
package tier
