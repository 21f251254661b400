// Package kernels is cxltier's gather engine: it moves rows and paged KV
// blocks between registered host memory (the tier's mappings, one range per
// tier device) and engine buffers (GPU memory, or host memory for the CPU
// engine).
//
// Every call is one batch however many rows it names: the CUDA engine runs
// it as one kernel launch on its stream, the CPU engine as one parallel copy.
// Calls on one engine complete in the order they were made, like work on a
// CUDA stream, and each returns a Handle to wait on.
//
// Every row is checked against the registered ranges and the buffer before
// anything is launched: a bad row is an error, never a fault. The request's
// slices are read during the call and may be reused as soon as it returns.
//
// The package knows nothing of requests, sequences or hashes; topk, engram
// and prefix build the row lists. The exceptions are the planners, which
// let an engine decide the rows itself where its inputs already are: the
// top-k planner (TopKPlanner, topkplan.go, topk.cu) keeps package topk's
// slot tables in engine memory and plans and fetches a sparse-attention
// step; the Engram planner (EngramPlanner, engram.go, engram.cu) hashes a
// call's token windows with package engram's constants, probes a
// set-associative row cache whose tags live in engine memory and fetches
// the misses. Their layouts are defined here; the CPU engine runs a Go twin
// of each CUDA kernel. The CPU engine is always built; the CUDA
// engine is built with the tag "cuda" (see cuda.go) because its driver
// binding links libcuda and exits a process that has no driver.
package kernels
