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
// and prefix build the row lists. The one exception is the top-k planner
// (TopKPlanner, topkplan.go, topk.cu): to plan a sparse-attention step where
// the selections already are, an engine keeps package topk's slot tables
// in its own memory in a layout defined here, and plans and fetches a step
// itself; the CPU engine runs a Go twin of the CUDA kernels. The CPU engine is always built; the CUDA
// engine is built with the tag "cuda" (see cuda.go) because its driver
// binding links libcuda and exits a process that has no driver.
package kernels
