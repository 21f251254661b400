package engram

import "math/bits"

// This file reproduces exactly the part of numpy's random module that
// Engram's reference uses to draw its hash multipliers:
//
//	numpy.random.default_rng(seed).integers(0, bound, size=n, dtype=int64)
//
// that is SeedSequence (entropy → PCG64 state), PCG64 (128-bit LCG with the
// XSL-RR output) and the bounded 64-bit draw (Lemire's multiply-shift with
// rejection; 32-bit draws below 2^32). Check values produced by numpy itself
// are in testdata/vectors.json.

// SeedSequence constants (numpy/random/bit_generator.pyx).
const (
	ssPoolSize = 4
	ssInitA    = 0x43b0d7e5
	ssMultA    = 0x931e8875
	ssInitB    = 0x8b51f9dd
	ssMultB    = 0x58f38ded
	ssMixMultL = 0xca01f9dd
	ssMixMultR = 0x4973f715
	ssXShift   = 16
)

// seedWords splits a non-negative seed into little-endian 32-bit words,
// as numpy coerces an int entropy (0 is one zero word).
func seedWords(seed uint64) []uint32 {
	if seed == 0 {
		return []uint32{0}
	}
	var w []uint32
	for ; seed > 0; seed >>= 32 {
		w = append(w, uint32(seed))
	}
	return w
}

// seedPool is SeedSequence's mixed entropy pool for an int seed with no
// spawn key.
func seedPool(seed uint64) [ssPoolSize]uint32 {
	entropy := seedWords(seed)
	var pool [ssPoolSize]uint32
	hashConst := uint32(ssInitA)
	hashmix := func(v uint32) uint32 {
		v ^= hashConst
		hashConst *= ssMultA
		v *= hashConst
		return v ^ v>>ssXShift
	}
	mix := func(x, y uint32) uint32 {
		r := ssMixMultL*x - ssMixMultR*y
		return r ^ r>>ssXShift
	}
	for i := range pool {
		var e uint32
		if i < len(entropy) {
			e = entropy[i]
		}
		pool[i] = hashmix(e)
	}
	for src := range pool {
		for dst := range pool {
			if src != dst {
				pool[dst] = mix(pool[dst], hashmix(pool[src]))
			}
		}
	}
	for src := ssPoolSize; src < len(entropy); src++ {
		for dst := range pool {
			pool[dst] = mix(pool[dst], hashmix(entropy[src]))
		}
	}
	return pool
}

// generateState is SeedSequence.generate_state(n, uint64).
func generateState(pool [ssPoolSize]uint32, n int) []uint64 {
	words := make([]uint32, 2*n)
	hashConst := uint32(ssInitB)
	for i := range words {
		v := pool[i%ssPoolSize]
		v ^= hashConst
		hashConst *= ssMultB
		v *= hashConst
		words[i] = v ^ v>>ssXShift
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(words[2*i]) | uint64(words[2*i+1])<<32
	}
	return out
}

// pcg64 is numpy's PCG64 bit generator: a 128-bit LCG stepped before each
// output, XSL-RR output, with numpy's 32-bit buffering.
type pcg64 struct {
	hi, lo       uint64 // state
	incHi, incLo uint64
	has32        bool
	buf32        uint32
}

const (
	pcgMultHi = 0x2360ED051FC65DA4
	pcgMultLo = 0x4385DF649FCCF645
)

// newNumpyRNG is numpy.random.default_rng(seed).
func newNumpyRNG(seed uint64) *pcg64 {
	st := generateState(seedPool(seed), 4)
	r := &pcg64{}
	// pcg_setseq_128_srandom_r(initstate = st[0]:st[1], initseq = st[2]:st[3])
	r.incHi = st[2]<<1 | st[3]>>63
	r.incLo = st[3]<<1 | 1
	r.step()
	r.hi, r.lo = add128(r.hi, r.lo, st[0], st[1])
	r.step()
	return r
}

func add128(ah, al, bh, bl uint64) (uint64, uint64) {
	lo, c := bits.Add64(al, bl, 0)
	hi, _ := bits.Add64(ah, bh, c)
	return hi, lo
}

func (r *pcg64) step() {
	// state = state * mult + inc, mod 2^128
	h, l := bits.Mul64(r.lo, pcgMultLo)
	h += r.hi*pcgMultLo + r.lo*pcgMultHi
	r.hi, r.lo = add128(h, l, r.incHi, r.incLo)
}

func (r *pcg64) next64() uint64 {
	r.step()
	rot := r.hi >> 58
	return bits.RotateLeft64(r.hi^r.lo, -int(rot))
}

func (r *pcg64) next32() uint32 {
	if r.has32 {
		r.has32 = false
		return r.buf32
	}
	n := r.next64()
	r.has32, r.buf32 = true, uint32(n>>32)
	return uint32(n)
}

// integers is Generator.integers(0, high, size=n, dtype=int64) for
// high >= 1: numpy's random_bounded_uint64_fill without masking.
func (r *pcg64) integers(high int64, n int) []int64 {
	out := make([]int64, n)
	rng := uint64(high - 1) // inclusive range
	switch {
	case rng == 0:
		// all zero
	case rng <= 0xFFFFFFFF:
		for i := range out {
			if rng == 0xFFFFFFFF {
				out[i] = int64(r.next32())
			} else {
				out[i] = int64(r.lemire32(uint32(rng)))
			}
		}
	default:
		for i := range out {
			out[i] = int64(r.lemire64(rng))
		}
	}
	return out
}

func (r *pcg64) lemire64(rng uint64) uint64 {
	excl := rng + 1
	hi, lo := bits.Mul64(r.next64(), excl)
	if lo < excl {
		threshold := (^uint64(0) - rng) % excl
		for lo < threshold {
			hi, lo = bits.Mul64(r.next64(), excl)
		}
	}
	return hi
}

func (r *pcg64) lemire32(rng uint32) uint32 {
	excl := rng + 1
	m := uint64(r.next32()) * uint64(excl)
	if uint32(m) < excl {
		threshold := (^uint32(0) - rng) % excl
		for uint32(m) < threshold {
			m = uint64(r.next32()) * uint64(excl)
		}
	}
	return uint32(m >> 32)
}
