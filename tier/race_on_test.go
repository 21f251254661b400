//go:build race

package tier

// raceEnabled: the race detector slows the multi-process tests several
// times over; they then do less of the same work.
const raceEnabled = true
