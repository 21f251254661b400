package crccopy

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"reflect"
	"testing"

	"golang.org/x/sys/cpu"
)

// namedKernel is a fused kernel and its name, for tests and benchmarks.
type namedKernel struct {
	name string
	k    fused
}

// kernelsOnThisCore are the fused kernels this core can run.
func kernelsOnThisCore() []namedKernel {
	ks := []namedKernel{{"copyCRC3", copyCRC3}, {"copyCRC3T", copyCRC3T}}
	if cpu.X86.HasAVX2 {
		ks = append(ks, namedKernel{"copyCRC3L", copyCRC3L})
	}
	return ks
}

// Every fused kernel the core can run copies and checksums exactly at
// every page offset its stores allow, whichever copyCRC would pick there.
func TestFusedKernelsAtEveryOffset(t *testing.T) {
	if !cpu.X86.HasSSE42 {
		t.Skip("no CRC32 instruction: copyCRC takes the portable path")
	}
	const seg = 4 << 10
	src := pageAligned(3*seg, 0)
	for i := range src {
		src[i] = byte(i*13 + i>>7)
	}
	ra0, rb0, rc0 := ^crc32.Update(0, Table, src[:seg]), ^crc32.Update(^uint32(0), Table, src[seg:2*seg]), ^crc32.Update(^uint32(0), Table, src[2*seg:])
	for _, nk := range kernelsOnThisCore() {
		name, kernel := nk.name, nk.k
		for _, off := range []int{0, 16, 48, 64, 80, 128, 2048, 4080, 3, 8} {
			if off%16 != 0 && name != "copyCRC3T" {
				continue // non-temporal stores need a 16-byte aligned destination
			}
			t.Run(fmt.Sprintf("%s/dst+%d", name, off), func(t *testing.T) {
				buf := pageAligned(3*seg+64, off)
				ra, rb, rc := kernel(&buf[0], &src[0], seg, ^uint32(0))
				if ra != ra0 || rb != rb0 || rc != rc0 {
					t.Errorf("registers %#x %#x %#x, want %#x %#x %#x", ra, rb, rc, ra0, rb0, rc0)
				}
				if !bytes.Equal(buf[:3*seg], src) || bytes.ContainsFunc(buf[3*seg:], func(r rune) bool { return r != 0 }) {
					t.Error("the copy differs from the source, or wrote past it")
				}
			})
		}
	}
}

// copyCRC picks the lagged kernel just past the source's page offset, the
// ordinary stores where the lag does not reach or dst is unaligned, and
// plain non-temporal stores elsewhere.
func TestFusedKernelChoice(t *testing.T) {
	if !cpu.X86.HasSSE42 {
		t.Skip("no CRC32 instruction")
	}
	lagged := "copyCRC3T"
	if cpu.X86.HasAVX2 {
		lagged = "copyCRC3L"
	}
	src := pageAligned(1<<16, 0)
	for _, tc := range []struct {
		off  int
		want string
	}{{0, "copyCRC3"}, {3, "copyCRC3T"}, {16, lagged}, {64, lagged}, {80, "copyCRC3T"}, {240, "copyCRC3T"},
		{256, "copyCRC3"}, {2048, "copyCRC3"}, {4080, "copyCRC3"}} {
		dst := pageAligned(1<<16, tc.off)
		got := "?"
		for _, nk := range kernelsOnThisCore() {
			if reflect.ValueOf(nk.k).Pointer() == reflect.ValueOf(fusedKernel(dst, src)).Pointer() {
				got = nk.name
			}
		}
		if got != tc.want {
			t.Errorf("dst+%d: %s, want %s", tc.off, got, tc.want)
		}
	}
}

// BenchmarkFusedKernels is each fused kernel the core can run over 2 MiB
// and 64 KiB blocks (the source at a page, as a tier block is) into
// destinations at the page offsets where the choice between them is
// made, beside the plain copy: copyCRC picks by these figures.
func BenchmarkFusedKernels(b *testing.B) {
	kernels := kernelsOnThisCore()
	for _, size := range []int{2 << 20, 64 << 10} {
		n := max(32, (64<<20)/size)
		src, dst := make([][]byte, n), make([][]byte, n)
		for i := range src {
			src[i] = pageAligned(size, 0)
		}
		for _, off := range []int{0, 16, 64, 128, 2048} {
			for i := range dst {
				dst[i] = pageAligned(size, off)
				copy(dst[i], src[i])
			}
			b.Run(fmt.Sprintf("%dKiB/dst+%d/copy", size>>10, off), func(b *testing.B) {
				b.SetBytes(int64(size))
				for i := 0; b.Loop(); i++ {
					copy(dst[i%n], src[i%n])
				}
			})
			for _, k := range kernels {
				b.Run(fmt.Sprintf("%dKiB/dst+%d/%s", size>>10, off, k.name), func(b *testing.B) {
					b.SetBytes(int64(size))
					for i := 0; b.Loop(); i++ {
						copyCRCWith(k.k, 0, dst[i%n], src[i%n])
					}
				})
			}
		}
	}
}
