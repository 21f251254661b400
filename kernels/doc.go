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
// Every row is checked against the registered ranges and the buffer under
// the engine's lock, before anything is launched: a bad row is an error,
// never a fault, and no Unregister can come between the check and the copy.
// The request's slices are read during the call and may be reused as soon
// as it returns.
//
// The package knows nothing of requests, sequences or hashes. Packages that
// own a kernel (topk's planner, engram's) embed its PTX and run it through
// the launch API (launch.go): an engine that implements Launcher lends them,
// inside Run and under its lock, module loading, staging, checks against its
// ranges and launches on its stream. Only this package talks to the CUDA
// driver. The CPU engine is always built; the CUDA engine is built with the
// tag "cuda" (see cuda.go) because its driver binding links libcuda and
// exits a process that has no driver.
package kernels
