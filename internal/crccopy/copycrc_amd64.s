#include "textflag.h"

// One round of the fused loop, 64 bytes of each of three segments (A at
// SI, B at SI+R8, C at SI+R9): load them, run each segment's CRC32 chain
// over them (AX, BX, DX), store them at DI alike.
#define LOAD_192 \
	MOVOU 0(SI), X0; \
	MOVOU 16(SI), X1; \
	MOVOU 32(SI), X2; \
	MOVOU 48(SI), X3; \
	MOVOU 0(SI)(R8*1), X4; \
	MOVOU 16(SI)(R8*1), X5; \
	MOVOU 32(SI)(R8*1), X6; \
	MOVOU 48(SI)(R8*1), X7; \
	MOVOU 0(SI)(R9*1), X8; \
	MOVOU 16(SI)(R9*1), X9; \
	MOVOU 32(SI)(R9*1), X10; \
	MOVOU 48(SI)(R9*1), X11

#define CRC_192 \
	CRC32Q 0(SI), AX; \
	CRC32Q 0(SI)(R8*1), BX; \
	CRC32Q 0(SI)(R9*1), DX; \
	CRC32Q 8(SI), AX; \
	CRC32Q 8(SI)(R8*1), BX; \
	CRC32Q 8(SI)(R9*1), DX; \
	CRC32Q 16(SI), AX; \
	CRC32Q 16(SI)(R8*1), BX; \
	CRC32Q 16(SI)(R9*1), DX; \
	CRC32Q 24(SI), AX; \
	CRC32Q 24(SI)(R8*1), BX; \
	CRC32Q 24(SI)(R9*1), DX; \
	CRC32Q 32(SI), AX; \
	CRC32Q 32(SI)(R8*1), BX; \
	CRC32Q 32(SI)(R9*1), DX; \
	CRC32Q 40(SI), AX; \
	CRC32Q 40(SI)(R8*1), BX; \
	CRC32Q 40(SI)(R9*1), DX; \
	CRC32Q 48(SI), AX; \
	CRC32Q 48(SI)(R8*1), BX; \
	CRC32Q 48(SI)(R9*1), DX; \
	CRC32Q 56(SI), AX; \
	CRC32Q 56(SI)(R8*1), BX; \
	CRC32Q 56(SI)(R9*1), DX

// STORE_192(op) stores the round's 192 bytes with op: MOVNTO
// (non-temporal) or MOVOU (ordinary).
#define STORE_192(op) \
	op X0, 0(DI); \
	op X1, 16(DI); \
	op X2, 32(DI); \
	op X3, 48(DI); \
	op X4, 0(DI)(R8*1); \
	op X5, 16(DI)(R8*1); \
	op X6, 32(DI)(R8*1); \
	op X7, 48(DI)(R8*1); \
	op X8, 0(DI)(R9*1); \
	op X9, 16(DI)(R9*1); \
	op X10, 32(DI)(R9*1); \
	op X11, 48(DI)(R9*1)

// ARGS loads a kernel's arguments: DI dst, SI src, CX seg, and the
// three chains' CRC registers (AX from r, BX and DX from 0); R8 and R9
// are the offsets of segments B and C.
#define ARGS \
	MOVQ	dst+0(FP), DI; \
	MOVQ	src+8(FP), SI; \
	MOVQ	seg+16(FP), CX; \
	MOVL	r+24(FP), AX; \
	XORL	BX, BX; \
	XORL	DX, DX; \
	MOVQ	CX, R8; \
	LEAQ	(CX)(CX*1), R9

// RESULTS returns the three chains' CRC registers.
#define RESULTS \
	MOVL	AX, ra+32(FP); \
	MOVL	BX, rb+36(FP); \
	MOVL	DX, rc+40(FP); \
	RET

// func copyCRC3(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)
//
// Copies 3*seg bytes from src to dst with non-temporal stores and returns
// the raw CRC-32C registers of the three segments: ra from r over
// src[0:seg], rb and rc from 0 over src[seg:2seg] and src[2seg:3seg]. The
// three chains interleave so that the CRC32 instruction's latency is
// hidden; copyCRC joins them. seg is a positive multiple of 64 and dst is
// 16-byte aligned (checked by the caller).
TEXT ·copyCRC3(SB), NOSPLIT, $0-44
	ARGS

	PCALIGN	$64		// the loop at a line: its speed not left to the linker
loop:
	LOAD_192
	CRC_192
	STORE_192(MOVNTO)
	ADDQ	$64, SI
	ADDQ	$64, DI
	SUBQ	$64, CX
	JNZ	loop

	// Non-temporal stores are weakly ordered: fence them before the
	// caller's publish makes the payload visible to other processes.
	SFENCE
	RESULTS

// func copyCRC3T(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)
//
// copyCRC3 with ordinary stores, for a destination whose offset within a
// page is just past the source's, where non-temporal stores would stall
// the loads (aliasWindow in copycrc.go), or that is not 16-byte aligned:
// dst may start anywhere.
TEXT ·copyCRC3T(SB), NOSPLIT, $0-44
	ARGS

	PCALIGN	$64		// the loop at a line: its speed not left to the linker
loop:
	LOAD_192
	CRC_192
	STORE_192(MOVOU)
	ADDQ	$64, SI
	ADDQ	$64, DI
	SUBQ	$64, CX
	JNZ	loop
	RESULTS

// The lagged kernel: AVX2 loads of a round into one set of six YMM
// registers while the previous round is stored from the other set.

// LOADY(a0, a1, b0, b1, c0, c1) loads one round, 64 bytes of each
// segment, into six YMM registers.
#define LOADY(a0, a1, b0, b1, c0, c1) \
	VMOVDQU 0(SI), a0; \
	VMOVDQU 32(SI), a1; \
	VMOVDQU 0(SI)(R8*1), b0; \
	VMOVDQU 32(SI)(R8*1), b1; \
	VMOVDQU 0(SI)(R9*1), c0; \
	VMOVDQU 32(SI)(R9*1), c1

// NT64(y0, x0, y1, x1, o0, o16, o32, o48) stores y0 and y1, 64 bytes,
// with four 16-byte non-temporal stores (the destination need only be
// 16-byte aligned); x0 and x1 are y0's and y1's low halves.
#define NT64(y0, x0, y1, x1, o0, o16, o32, o48) \
	VMOVNTDQ x0, o0; \
	VEXTRACTI128 $1, y0, X12; \
	VMOVNTDQ X12, o16; \
	VMOVNTDQ x1, o32; \
	VEXTRACTI128 $1, y1, X13; \
	VMOVNTDQ X13, o48

// STOREY stores a round held in six YMM registers at DI, DI+R8, DI+R9.
#define STOREY(a0, xa0, a1, xa1, b0, xb0, b1, xb1, c0, xc0, c1, xc1) \
	NT64(a0, xa0, a1, xa1, 0(DI), 16(DI), 32(DI), 48(DI)); \
	NT64(b0, xb0, b1, xb1, 0(DI)(R8*1), 16(DI)(R8*1), 32(DI)(R8*1), 48(DI)(R8*1)); \
	NT64(c0, xc0, c1, xc1, 0(DI)(R9*1), 16(DI)(R9*1), 32(DI)(R9*1), 48(DI)(R9*1))

#define STORE_P STOREY(Y0, X0, Y1, X1, Y2, X2, Y3, X3, Y4, X4, Y5, X5)
#define STORE_Q STOREY(Y6, X6, Y7, X7, Y8, X8, Y9, X9, Y10, X10, Y11, X11)

// func copyCRC3L(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)
//
// copyCRC3 with its non-temporal stores a round behind its loads: round
// i is loaded and checksummed before round i-1 is stored, so a
// destination up to 64 bytes past the source's offset within a page puts
// no pending store at a page offset the next loads read (4K aliasing:
// see aliasWindow in copycrc.go). Needs AVX2; dst is 16-byte aligned.
TEXT ·copyCRC3L(SB), NOSPLIT, $0-44
	ARGS

	LOADY(Y0, Y1, Y2, Y3, Y4, Y5)
	CRC_192
	ADDQ	$64, SI
	SUBQ	$64, CX

	PCALIGN	$64		// the loop at a line: its speed not left to the linker
loop:
	JZ	lastP
	LOADY(Y6, Y7, Y8, Y9, Y10, Y11)
	CRC_192
	STORE_P
	ADDQ	$64, SI
	ADDQ	$64, DI
	SUBQ	$64, CX
	JZ	lastQ
	LOADY(Y0, Y1, Y2, Y3, Y4, Y5)
	CRC_192
	STORE_Q
	ADDQ	$64, SI
	ADDQ	$64, DI
	SUBQ	$64, CX
	JMP	loop

lastP:
	STORE_P
	JMP	done
lastQ:
	STORE_Q
done:
	SFENCE			// before the caller's publish, as in copyCRC3
	VZEROUPPER
	RESULTS
