#include "textflag.h"

// func cpuidFlushFeatures() (clflushopt, clwb bool)
// CPUID leaf 7, subleaf 0: EBX bit 23 = CLFLUSHOPT, bit 24 = CLWB.
TEXT ·cpuidFlushFeatures(SB), NOSPLIT, $0-2
	MOVL $0, AX
	CPUID
	CMPL AX, $7
	JLT  none
	MOVL $7, AX
	MOVL $0, CX
	CPUID
	MOVL BX, DX
	SHRL $23, BX
	ANDL $1, BX
	MOVB BX, clflushopt+0(FP)
	SHRL $24, DX
	ANDL $1, DX
	MOVB DX, clwb+1(FP)
	RET
none:
	MOVB $0, clflushopt+0(FP)
	MOVB $0, clwb+1(FP)
	RET

// func clflushRange(addr uintptr, lines uintptr)
TEXT ·clflushRange(SB), NOSPLIT, $0-16
	MOVQ addr+0(FP), AX
	MOVQ lines+8(FP), CX
	TESTQ CX, CX
	JZ   done1
loop1:
	CLFLUSH (AX)
	ADDQ $64, AX
	DECQ CX
	JNZ  loop1
done1:
	RET

// func clflushoptRange(addr uintptr, lines uintptr)
TEXT ·clflushoptRange(SB), NOSPLIT, $0-16
	MOVQ addr+0(FP), AX
	MOVQ lines+8(FP), CX
	TESTQ CX, CX
	JZ   done2
loop2:
	CLFLUSHOPT (AX)
	ADDQ $64, AX
	DECQ CX
	JNZ  loop2
done2:
	RET

// func clwbRange(addr uintptr, lines uintptr)
TEXT ·clwbRange(SB), NOSPLIT, $0-16
	MOVQ addr+0(FP), AX
	MOVQ lines+8(FP), CX
	TESTQ CX, CX
	JZ   done3
loop3:
	CLWB (AX)
	ADDQ $64, AX
	DECQ CX
	JNZ  loop3
done3:
	RET

// func sfence()
TEXT ·sfence(SB), NOSPLIT, $0-0
	SFENCE
	RET

// func mfence()
TEXT ·mfence(SB), NOSPLIT, $0-0
	MFENCE
	RET
