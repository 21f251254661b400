//go:build !amd64

package tier

import "sync/atomic"

// Portable fallback: without cache-control instructions the best this build
// can do is order its own accesses. Shared (non-coherent) mode on such a CPU
// is refused at open time by requireFlush.
var fenceWord atomic.Uint64

// FlushInstruction names the instruction publish uses on this CPU.
func FlushInstruction() string { return "none" }

func flushLines([]byte)      { storeFence() }
func invalidateLines([]byte) { fullFence() }
func storeFence()            { fenceWord.Add(0) }
func fullFence()             { fenceWord.Add(0) }
