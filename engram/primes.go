package engram

import "math/bits"

// isPrime is a deterministic Miller-Rabin test for 64-bit n: the first
// twelve primes as bases are a proven witness set below 3.3·10^24.
func isPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	small := [...]uint64{2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}
	for _, p := range small {
		if n%p == 0 {
			return n == p
		}
	}
	d, s := n-1, 0
	for d%2 == 0 {
		d, s = d/2, s+1
	}
	for _, a := range small {
		x := powMod(a, d, n)
		if x == 1 || x == n-1 {
			continue
		}
		composite := true
		for range s - 1 {
			x = mulMod(x, x, n)
			if x == n-1 {
				composite = false
				break
			}
		}
		if composite {
			return false
		}
	}
	return true
}

func mulMod(a, b, m uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	_, rem := bits.Div64(hi%m, lo, m)
	return rem
}

func powMod(b, e, m uint64) uint64 {
	r := uint64(1)
	b %= m
	for ; e > 0; e >>= 1 {
		if e&1 == 1 {
			r = mulMod(r, b, m)
		}
		b = mulMod(b, b, m)
	}
	return r
}

// nextPrime is the smallest prime greater than after that is not in seen.
// ok is false if none fits below 2^63.
func nextPrime(after int64, seen map[int64]bool) (int64, bool) {
	for c := after + 1; c > after; c++ {
		if isPrime(uint64(c)) && !seen[c] {
			return c, true
		}
	}
	return 0, false
}
