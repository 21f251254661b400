package tier

import "unsafe"

// holdShard picks the gate shard a hold counts in from where the calling
// goroutine's stack is: goroutines' stacks lie apart, so threads running
// different goroutines mostly count on different lines, and a goroutine
// keeps to one line while its stack stays put. A random pick
// (math/rand/v2) cost more than the rest of a hold. The address is only
// hashed, never dereferenced or kept: a stack that moves changes the pick
// of later holds, not the shard a hold in flight gives back (Hold keeps it).
func holdShard() uint32 {
	var mark byte
	a := uint64(uintptr(unsafe.Pointer(&mark))) >> 10 // frames of one call chain share a shard
	return uint32((a*0x9e3779b97f4a7c15)>>32) & (holdShards - 1)
}
