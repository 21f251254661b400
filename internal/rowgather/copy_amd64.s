#include "textflag.h"

// func copyVec(dst, src unsafe.Pointer, dstOffs, srcIdx *int64, n, rowBytes, srcScale int, wide bool)
//
// For i in [0, n): copies rowBytes bytes at src + srcIdx[i]*srcScale to
// dst + dstOffs[i] (dst + i*rowBytes where dstOffs is nil): 64 bytes a
// step (one ZMM load and store where wide, two YMM ones otherwise), then
// 16 bytes a step for the rest. The caller (copy_amd64.go) guarantees
// n > 0, rowBytes a positive multiple of 16, AVX2 (AVX-512F where wide),
// and every span inside its slices: nothing is checked here.
TEXT ·copyVec(SB), NOSPLIT, $0-57
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ dstOffs+16(FP), R12
	MOVQ srcIdx+24(FP), BX
	MOVQ n+32(FP), CX
	MOVQ rowBytes+40(FP), DX
	MOVQ srcScale+48(FP), R13
	MOVBLZX wide+56(FP), R10
	MOVQ DX, R11
	ANDQ $~63, R11 // bytes moved 64 at a time
	XORQ R14, R14  // next sequential dst offset

	// The loops start at a 64-byte line, so that where the linker puts
	// the function does not decide how fast they run: a row loop that
	// straddled a line ran the gather 10% slower, by build alone. The
	// padding before the inner loops follows jumps and is never executed.
	PCALIGN $64
row:
	MOVQ (BX), AX
	IMULQ R13, AX
	LEAQ (SI)(AX*1), R8 // source row
	MOVQ R14, AX
	TESTQ R12, R12
	JEQ seq
	MOVQ (R12), AX
	ADDQ $8, R12
seq:
	LEAQ (DI)(AX*1), R15 // destination row
	XORQ R9, R9
	CMPQ R9, R11
	JAE tail
	TESTQ R10, R10
	JNE zmmline
	JMP ymmline
	PCALIGN $64
zmmline:
	VMOVDQU64 (R8)(R9*1), Z0
	VMOVDQU64 Z0, (R15)(R9*1)
	ADDQ $64, R9
	CMPQ R9, R11
	JB zmmline
	JMP tail
	PCALIGN $64
ymmline:
	VMOVDQU (R8)(R9*1), Y0
	VMOVDQU 32(R8)(R9*1), Y1
	VMOVDQU Y0, (R15)(R9*1)
	VMOVDQU Y1, 32(R15)(R9*1)
	ADDQ $64, R9
	CMPQ R9, R11
	JB ymmline
tail:
	CMPQ R9, DX
	JAE next
	VMOVDQU (R8)(R9*1), X1
	VMOVDQU X1, (R15)(R9*1)
	ADDQ $16, R9
	JMP tail
next:
	ADDQ DX, R14
	ADDQ $8, BX
	DECQ CX
	JNE row
	VZEROUPPER
	RET
