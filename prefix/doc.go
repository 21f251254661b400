// Package prefix keeps the KV blocks of dense models and their prefix index
// in the tier, TraCT-style: every worker on every host that maps the tier
// publishes and reuses prefixes with no network hop and no metadata server.
//
// An index ("namespace", one per model or tenant) is two runs of shared
// chunks found through the root directory as "prefix/<name>":
//
//   - metadata: a 4 KiB header (immutable geometry with a CRC-32C, and one
//     line of lock-guarded state per shard), the open-addressing table of
//     128-byte entries, the block-owner table (from version 4 one run of
//     whole lines per shard) and one pin table per client
//     lease slot (a header line, a line of that client's counters, and
//     the pin records);
//   - payload: fixed-size blocks, none crossing a stripe boundary, so every
//     block is one contiguous engine address.
//
// Shards. From layout version 3 an index is split into a power-of-two
// number of shards by key hash: each has its own run of entries (probes
// stay in it), its own blocks, LRU list and counts, and its own tier lock,
// so inserts from several processes mostly take different locks. An index
// of an older version is one shard.
//
// Concurrency. Mutations (reserve, publish, abort, delete, evict, reclaim)
// run under their shard's lock (a process mutex, then the tier lock) and
// mark the shard dirty while they work, so a holder that dies
// mid-mutation leaves a flag the next holder repairs from. A Set of small
// payloads writes them under the same hold that reserves and publishes
// them; a writer killed mid-copy leaves a reservation for the reaper, as
// one killed between two holds does. Lookups never
// take a lock (lessons.md: batch lookups must not contend with eviction):
// they probe with a seqlock-style read of the entry's state word and pin
// by claiming a record of their own client's pin table with a
// compare-and-swap, then re-reading that word. An evictor marks the entry
// evicting before it scans the pin tables, so one of the two always sees
// the other (both sides use sequentially consistent atomics). Pins belong
// to a lease, not to a timer: a dead client's pin table is ignored as soon
// as its lease is reaped, and its unfinished reservations are reclaimed.
//
// An entry becomes ready only after its payload is written and its CRC-32C
// recorded (computed in the same pass as the copy); readers verify the
// checksum on every hit unless told not to (VerifyReads) and drop an entry
// that fails it. From layout version 5 the checksum starts from the key's
// (it covers the key's 32 bytes, then the payload), so an entry whose
// length, block and CRC words came from another key's entry fails it
// rather than serving that key's payload. A checksum stops damage, not a
// writer: from layout 6 an index with a tenant key also signs each page
// (HMAC-SHA256 of key and payload), and its readers refuse a page the key
// did not sign, whatever VerifyReads says (mac.go).
package prefix
