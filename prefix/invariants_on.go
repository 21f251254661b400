//go:build invariants || race

package prefix

// invariants is on in race builds and with -tags invariants: every
// mutation of a shard found sound when its lock was taken is checked
// (Check's invariants, payloads aside) before the lock is let go, and a
// violation panics with what broke. The soak and the race tests run so.
const invariants = true
