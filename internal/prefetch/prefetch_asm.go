//go:build amd64 || arm64

package prefetch

// Lines asks the CPU to start loading the lines of [p, p+n) into cache,
// so that a caller keeps many reads in flight at once (the CPU engine's
// rows, the prefix index's probes) instead of waiting on each one's
// latency in turn. It returns at once and never faults.
//
//go:noescape
func Lines(p *byte, n uintptr)

// Line is Lines of the one line holding p, for callers that hint one line
// at a time (a probe's home entry) and want no loop around it.
//
//go:noescape
func Line(p *byte)
