package prefetch

// Lines asks the CPU to start loading the lines of [p, p+n) into cache,
// so that the CPU engine keeps many row reads in flight at once instead of
// waiting on each row's DRAM latency in turn.
//
//go:noescape
func Lines(p *byte, n uintptr)
