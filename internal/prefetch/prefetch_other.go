//go:build !amd64

package prefetch

func Lines(p *byte, n uintptr) {}
