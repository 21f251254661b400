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

// func copyCRC3(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)
//
// Copies 3*seg bytes from src to dst with non-temporal stores and returns
// the raw CRC-32C registers of the three segments: ra from r over
// src[0:seg], rb and rc from 0 over src[seg:2seg] and src[2seg:3seg]. The
// three chains interleave so that the CRC32 instruction's latency is
// hidden; copyCRC joins them. seg is a positive multiple of 64 and dst is
// 16-byte aligned (checked by the caller).
TEXT ·copyCRC3(SB), NOSPLIT, $0-44
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	seg+16(FP), CX
	MOVL	r+24(FP), AX
	XORL	BX, BX
	XORL	DX, DX
	MOVQ	CX, R8			// offset of segment B
	LEAQ	(CX)(CX*1), R9		// offset of segment C

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
	MOVL	AX, ra+32(FP)
	MOVL	BX, rb+36(FP)
	MOVL	DX, rc+40(FP)
	RET

// func copyCRC3T(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)
//
// copyCRC3 with ordinary stores, for a destination whose offset within a
// page is just past the source's, where non-temporal stores would stall
// the loads (aliasWindow in copycrc.go), or that is not 16-byte aligned:
// dst may start anywhere.
TEXT ·copyCRC3T(SB), NOSPLIT, $0-44
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	seg+16(FP), CX
	MOVL	r+24(FP), AX
	XORL	BX, BX
	XORL	DX, DX
	MOVQ	CX, R8			// offset of segment B
	LEAQ	(CX)(CX*1), R9		// offset of segment C

loop:
	LOAD_192
	CRC_192
	STORE_192(MOVOU)
	ADDQ	$64, SI
	ADDQ	$64, DI
	SUBQ	$64, CX
	JNZ	loop
	MOVL	AX, ra+32(FP)
	MOVL	BX, rb+36(FP)
	MOVL	DX, rc+40(FP)
	RET
