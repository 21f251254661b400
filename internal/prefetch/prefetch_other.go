//go:build !amd64 && !arm64

package prefetch

func Lines(p *byte, n uintptr) {}

func Line(p *byte) {}
