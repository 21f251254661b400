#include "textflag.h"

// func Lines(p *byte, n uintptr)
// Issues PREFETCHT0 for every 64-byte line of [p, p+n). A hint only: it
// never faults, even on an unmapped address.
TEXT ·Lines(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ n+8(FP), CX
	LEAQ (AX)(CX*1), CX
	ANDQ $~63, AX
loop:
	CMPQ AX, CX
	JAE done
	PREFETCHT0 (AX)
	ADDQ $64, AX
	JMP loop
done:
	RET

// func Line(p *byte)
TEXT ·Line(SB), NOSPLIT, $0-8
	MOVQ p+0(FP), AX
	PREFETCHT0 (AX)
	RET
