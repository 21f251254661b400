package kernels

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// The launches of gather.cu's kernels, in one home for every engine that
// runs them (the CUDA engine and the PTX interpreter engine), so the
// parameters the kernels read cannot drift between them.

// threadsPerBlock is the block size of cxl_rows and cxl_blocks.
const threadsPerBlock = 256

// launchRows queues cxl_rows for r inside a Run: the row addresses (and
// slots) are staged, and lanesPerRow lanes copy each row. buf is the
// device address of r.Buf's byte 0; toTier is 1 for a scatter. The
// caller has checked r.
func launchRows(l Launch, fn Function, r *Rows, buf, toTier uint64) error {
	n := len(r.Tier)
	if n == 0 {
		return nil
	}
	words := asWords(r.Tier)
	if r.Slots != nil {
		words = append(append(make([]uint64, 0, 2*n), words...), asWords(r.Slots)...)
	}
	dev, err := l.Stage(words)
	if err != nil {
		return err
	}
	slots := uint64(0)
	if r.Slots != nil {
		slots = dev + uint64(n)*8
	}
	lanes := lanesPerRow(r.RowBytes)
	return queue(l, fn, n*lanes, l.Bases(), dev, slots, buf+uint64(r.BufOffset),
		uint64(r.SlotStride), uint64(n), uint64(r.RowBytes), uint64(lanes), toTier)
}

// launchBlocks queues cxl_blocks for b inside a Run; chunks are the device
// addresses of each chunk's first page. The caller has checked b.
func launchBlocks(l Launch, fn Function, b *Blocks, chunks []uint64, toTier uint64) error {
	n, nc := len(b.Tier), len(chunks)
	if n == 0 {
		return nil
	}
	words := make([]uint64, 0, 2*n+nc)
	words = append(append(append(words, asWords(b.Tier)...), asWords(b.Pages)...), chunks...)
	dev, err := l.Stage(words)
	if err != nil {
		return err
	}
	lanes := lanesPerRow(b.ChunkBytes)
	return queue(l, fn, n*nc*lanes, l.Bases(), dev, dev+uint64(n)*8, dev+uint64(2*n)*8,
		uint64(n), uint64(nc), uint64(b.ChunkBytes), uint64(b.PageStride), uint64(lanes), toTier)
}

// runRows and runBlocks are an engine's Gather/Scatter and
// GatherBlocks/ScatterBlocks: in one Run, the request is checked against the
// registered ranges (so no Unregister can come between) and launched.
func runRows(e Launcher, ranges *rangeTable, fn Function, r *Rows, buf, toTier uint64) (Handle, error) {
	return e.Run(func(l Launch) error {
		if err := ranges.checkRows(r); err != nil {
			return err
		}
		return launchRows(l, fn, r, buf, toTier)
	})
}

func runBlocks(e Launcher, ranges *rangeTable, fns blockKernels, b *Blocks, chunks []uint64, toTier uint64, shifts *shiftCache) (Handle, error) {
	return e.Run(func(l Launch) error {
		if err := ranges.checkBlocks(b); err != nil {
			return err
		}
		if b.CRCs != nil {
			return launchBlocksCRC(l, fns.crc, b, chunks, toTier, shifts)
		}
		return launchBlocks(l, fns.plain, b, chunks, toTier)
	})
}

// launchBlocksCRC queues cxl_blocks_crc for b inside a Run, and the read
// of its chunk registers, which are joined onto b.CRCs when the Run's
// Handle is waited for: the next Run can be queued before this one ends
// (a layer-wise load queues layer i+1 before it waits for layer i). The
// caller has checked b.
func launchBlocksCRC(l Launch, fn Function, b *Blocks, chunks []uint64, toTier uint64, shifts *shiftCache) error {
	n, nc := len(b.Tier), len(chunks)
	if n == 0 {
		return nil
	}
	rows := n * nc
	lanes := lanesPerRow(b.ChunkBytes)
	consts := crcShiftWords(lanes)
	words := make([]uint64, 0, 2*n+nc+len(consts)+(rows+1)/2)
	words = append(append(append(append(words, asWords(b.Tier)...), asWords(b.Pages)...), chunks...), consts...)
	words = append(words, make([]uint64, (rows+1)/2)...) // the kernel's output, a word for two rows
	dev, err := l.Stage(words)
	if err != nil {
		return err
	}
	constsDev := dev + uint64(2*n+nc)*8
	out := constsDev + uint64(len(consts))*8
	if err := queue(l, fn, rows*lanes, l.Bases(), dev, dev+uint64(n)*8, dev+uint64(2*n)*8,
		uint64(n), uint64(nc), uint64(b.ChunkBytes), uint64(b.PageStride), uint64(lanes), toTier, out, constsDev); err != nil {
		return err
	}
	crcs, shift := b.CRCs, shifts.get(b.ChunkBytes)
	err = l.ReadLater(out, 4*rows, func(raw []byte) {
		regs := make([]uint32, rows)
		for r := range regs {
			regs[r] = binary.LittleEndian.Uint32(raw[4*r:])
		}
		joinChunks(crcs, regs, nc, shift)
	})
	if err != nil {
		return fmt.Errorf("kernels: read %d chunk checksums: %w", rows, err)
	}
	return nil
}

// queue launches fn over threads threads, the grid capped by the engine
// (the kernels loop over the rest).
func queue(l Launch, fn Function, threads int, params ...uint64) error {
	blocks := min((threads+threadsPerBlock-1)/threadsPerBlock, l.MaxBlocks())
	if err := l.Kernel(fn, blocks, threadsPerBlock, 0, params...); err != nil {
		return fmt.Errorf("kernels: launch: %w", err)
	}
	return nil
}

// asWords views a slice of 8-byte integers as the uint64 words the kernels
// read: Addr and int64 have uint64's size and alignment, and the kernels
// interpret the bits exactly as Go stores them (two's complement, little
// endian), so no per-element conversion is needed.
func asWords[T Addr | int64](v []T) []uint64 {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&v[0])), len(v))
}
