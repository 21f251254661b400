#include "textflag.h"

// func Lines(p *byte, n uintptr)
// Issues PRFM PLDL1KEEP for every 64-byte line of [p, p+n). A hint only:
// it never faults, even on an unmapped address.
TEXT ·Lines(SB), NOSPLIT, $0-16
	MOVD	p+0(FP), R0
	MOVD	n+8(FP), R1
	ADD	R0, R1, R1
	AND	$~63, R0
loop:
	CMP	R1, R0
	BHS	done
	PRFM	(R0), PLDL1KEEP
	ADD	$64, R0
	B	loop
done:
	RET

// func Line(p *byte)
TEXT ·Line(SB), NOSPLIT, $0-8
	MOVD	p+0(FP), R0
	PRFM	(R0), PLDL1KEEP
	RET
