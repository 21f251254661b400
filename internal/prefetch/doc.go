// Package prefetch issues CPU cache prefetch hints. It is its own package
// because Go assembly cannot live in a package that uses cgo (the CUDA
// engine's package does).
package prefetch
