// Package prefix keeps the KV blocks of dense models and their prefix index
// in the tier, TraCT-style: every worker on every host that maps the tier
// publishes and reuses prefixes with no network hop and no metadata server.
//
// An index ("namespace", one per model or tenant) is two runs of shared
// chunks found through the root directory as "prefix/<name>":
//
//   - metadata: a 4 KiB header (immutable geometry with a CRC-32C, one line
//     of lock-guarded state, one line of counters), the open-addressing table
//     of 128-byte entries, the block-owner table and one pin table per
//     client lease slot;
//   - payload: fixed-size blocks, none crossing a stripe boundary, so every
//     block is one contiguous engine address.
//
// Concurrency. Mutations (reserve, publish, abort, delete, evict, reclaim)
// run under one tier lock per index and mark the header dirty while they
// work, so a holder that dies mid-mutation leaves a flag the next holder
// repairs from. Lookups never take the lock (lessons.md: batch lookups must
// not contend with eviction): they probe with a seqlock-style read of the
// entry's state word and pin by writing a record into their own client's
// pin table and re-reading that word. An evictor marks the entry evicting
// before it scans the pin tables, so one of the two always sees the other
// (both sides use sequentially consistent atomics). Pins belong to a lease,
// not to a timer: a dead client's pin table is ignored as soon as its lease
// is reaped, and its unfinished reservations are reclaimed.
//
// An entry becomes ready only after its payload is written and its CRC-32C
// recorded; readers verify the checksum on every hit and drop an entry that
// fails it.
package prefix
