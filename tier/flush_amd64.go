package tier

import "unsafe"

// The assembly routines take a line-aligned start address and a line count.
// Invariant: the range lies inside a live mapping (callers pass slices of
// the region), so the flush instructions never touch unmapped memory.

//go:noescape
func cpuidFlushFeatures() (clflushopt, clwb bool)

//go:noescape
func clflushRange(addr uintptr, lines uintptr)

//go:noescape
func clflushoptRange(addr uintptr, lines uintptr)

//go:noescape
func clwbRange(addr uintptr, lines uintptr)

func sfence()
func mfence()

var hasCLFLUSHOPT, hasCLWB = cpuidFlushFeatures()

// FlushInstruction names the instruction publish uses on this CPU.
func FlushInstruction() string {
	switch {
	case hasCLWB:
		return "clwb"
	case hasCLFLUSHOPT:
		return "clflushopt"
	}
	return "clflush"
}

func lineRange(b []byte) (uintptr, uintptr) {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b))) &^ (LineSize - 1)
	end := uintptr(unsafe.Pointer(unsafe.SliceData(b))) + uintptr(len(b))
	return start, (end - start + LineSize - 1) / LineSize
}

// flushLines writes back the lines; clwb keeps them cached, which suits a
// writer that will touch them again.
func flushLines(b []byte) {
	addr, n := lineRange(b)
	switch {
	case hasCLWB:
		clwbRange(addr, n)
	case hasCLFLUSHOPT:
		clflushoptRange(addr, n)
	default:
		clflushRange(addr, n)
	}
}

// invalidateLines must evict (clwb would not), so it uses clflushopt/clflush.
func invalidateLines(b []byte) {
	addr, n := lineRange(b)
	if hasCLFLUSHOPT {
		clflushoptRange(addr, n)
	} else {
		clflushRange(addr, n)
	}
}

func storeFence() { sfence() }
func fullFence()  { mfence() }
