package ptxsim

import (
	"fmt"
	"strconv"
	"strings"
)

// opcode is an instruction's operation.
type opcode uint8

const (
	opAdd opcode = iota + 1
	opSub
	opMulLo
	opMulWide
	opDiv
	opRem
	opNeg
	opAnd
	opOr
	opXor
	opNot
	opShl
	opShr
	opPopc
	opBfe
	opMax
	opMin
	opSelp
	opSetp
	opMov
	opCvt
	opLd
	opSt
	opAtom
	opBra
	opRet
	opMembar
	// collective: executed by the scheduler for a whole group at once
	opBarSync
	opBarWarp
	opShfl
	opVote
)

func (o opcode) collective() bool { return o >= opBarSync }

// dtype is an integer type: its width and signedness; bits 1 is .pred.
type dtype struct {
	bits   uint8
	signed bool
}

func typeOf(s string) (dtype, bool) {
	switch s {
	case "pred":
		return dtype{bits: 1}, true
	case "u8", "b8":
		return dtype{bits: 8}, true
	case "s8":
		return dtype{bits: 8, signed: true}, true
	case "u16", "b16":
		return dtype{bits: 16}, true
	case "s16":
		return dtype{bits: 16, signed: true}, true
	case "u32", "b32":
		return dtype{bits: 32}, true
	case "s32":
		return dtype{bits: 32, signed: true}, true
	case "u64", "b64":
		return dtype{bits: 64}, true
	case "s64":
		return dtype{bits: 64, signed: true}, true
	}
	return dtype{}, false
}

// space is a state space of a memory instruction.
type space uint8

const (
	spGeneric space = iota
	spGlobal
	spShared
	spLocal
	spParam
)

// operand kinds
const (
	kImm uint8 = iota
	kReg
	kSpecial
)

// special registers
const (
	srTid = iota
	srNtid
	srCtaid
	srNctaid
	srLaneid
	srWarpid
	srZero // the y and z components: grids and blocks are one-dimensional
)

type operand struct {
	kind uint8
	reg  int32 // register index, or special register
	imm  uint64
}

// inst is one decoded instruction.
type inst struct {
	op       opcode
	typ      dtype // the instruction's type (cvt: the destination's)
	src      dtype // cvt's source type
	sp       space
	cmp      string // setp's comparison, atom's operation, shfl's and vote's mode
	volatile bool
	guard    int32 // predicate register, -1 for none
	guardNeg bool
	dst      []int32   // destination registers (ld.v4 has four)
	args     []operand // sources; a memory operand's base register is args[0]
	addr     operand   // memory operand's base (register or absolute)
	off      int64     // memory operand's displacement
	vec      int       // elements of a vector access (1 if scalar)
	target   int       // branch target
	line     int
	text     string
}

func (b *body) decode(pd pending) (inst, error) {
	in := inst{guard: -1, vec: 1}
	if pd.guard != "" {
		g := pd.guard
		if strings.HasPrefix(g, "!") {
			in.guardNeg, g = true, g[1:]
		}
		r, ok := b.regs[g]
		if !ok {
			return in, fmt.Errorf("unknown guard %q", pd.guard)
		}
		in.guard = int32(r)
	}
	parts := strings.Split(pd.op, ".")
	var types []dtype
	var mods []string
	for _, m := range parts[1:] {
		if t, ok := typeOf(m); ok {
			types = append(types, t)
			continue
		}
		switch m {
		case "global":
			in.sp = spGlobal
		case "shared":
			in.sp = spShared
		case "local":
			in.sp = spLocal
		case "param":
			in.sp = spParam
		case "volatile":
			in.volatile = true
		case "v2":
			in.vec = 2
		case "v4":
			in.vec = 4
		default:
			mods = append(mods, m)
		}
	}
	if len(types) > 0 {
		in.typ = types[0]
	}
	if err := b.decodeOp(&in, parts[0], mods, types, pd.args); err != nil {
		return in, err
	}
	switch in.op {
	case opBra, opRet, opMembar, opBarSync, opBarWarp:
	case opLd, opSt, opAtom:
		if in.typ.bits < 8 {
			return in, fmt.Errorf("a memory access needs a type of 8 bits or more")
		}
	default:
		if in.typ.bits == 0 {
			return in, fmt.Errorf("no type")
		}
	}
	return in, nil
}

// decodeOp sets the opcode and operands; mods are the suffixes that are
// neither types nor state spaces.
func (b *body) decodeOp(in *inst, base string, mods []string, types []dtype, args []string) error {
	only := func(allowed ...string) error {
		for _, m := range mods {
			ok := false
			for _, a := range allowed {
				ok = ok || m == a
			}
			if !ok {
				return fmt.Errorf("unsupported modifier .%s", m)
			}
		}
		return nil
	}
	arith := map[string]opcode{"add": opAdd, "sub": opSub, "div": opDiv, "rem": opRem, "and": opAnd, "or": opOr,
		"xor": opXor, "shl": opShl, "shr": opShr, "max": opMax, "min": opMin}
	unary := map[string]opcode{"neg": opNeg, "not": opNot, "popc": opPopc, "mov": opMov}
	switch {
	case arith[base] != 0:
		in.op = arith[base]
		return b.regForm(in, args, 1, 2, only())
	case unary[base] != 0:
		in.op = unary[base]
		if base == "popc" {
			// popc's result is .u32 whatever the source's width
			in.src, in.typ = in.typ, dtype{bits: 32}
		}
		return b.regForm(in, args, 1, 1, only())
	case base == "mul":
		in.op = opMulLo
		if len(mods) == 1 && mods[0] == "wide" {
			in.op = opMulWide
		} else if err := only("lo"); err != nil {
			return err
		}
		return b.regForm(in, args, 1, 2, nil)
	case base == "bfe":
		in.op = opBfe
		return b.regForm(in, args, 1, 3, only())
	case base == "selp":
		in.op = opSelp
		return b.regForm(in, args, 1, 3, only())
	case base == "setp":
		in.op = opSetp
		if len(mods) != 1 || !strings.Contains(" eq ne lt le gt ge lo ls hi hs ", " "+mods[0]+" ") {
			return fmt.Errorf("unsupported comparison %v", mods)
		}
		in.cmp = mods[0]
		return b.regForm(in, args, 1, 2, nil)
	case base == "cvt":
		in.op = opCvt
		if len(types) != 2 {
			return fmt.Errorf("cvt needs two types")
		}
		in.src = types[1]
		return b.regForm(in, args, 1, 1, only())
	case base == "cvta":
		// cvta.to.global: generic and global addresses are the same here
		in.op = opMov
		return b.regForm(in, args, 1, 1, only("to"))
	case base == "ld" || base == "st":
		return b.memForm(in, base, args, only())
	case base == "atom":
		return b.atomForm(in, mods, args)
	case base == "bra":
		return b.branch(in, args, only("uni"))
	case base == "ret" || base == "exit":
		in.op = opRet
		return only()
	case base == "membar" || base == "fence":
		in.op = opMembar
		return nil
	case base == "bar":
		return b.barForm(in, mods, args)
	case base == "shfl":
		in.op = opShfl
		if len(mods) != 2 || mods[0] != "sync" || !strings.Contains(" up down bfly idx ", " "+mods[1]+" ") {
			return fmt.Errorf("unsupported shfl form %v", mods)
		}
		in.cmp = mods[1]
		return b.regForm(in, args, 1, 4, nil)
	case base == "vote":
		in.op = opVote
		if len(mods) != 2 || mods[0] != "sync" || !strings.Contains(" ballot any all ", " "+mods[1]+" ") {
			return fmt.Errorf("unsupported vote form %v", mods)
		}
		in.cmp = mods[1]
		return b.regForm(in, args, 1, 2, nil)
	}
	return fmt.Errorf("unsupported instruction %s", base)
}

// regForm reads ndst destination registers followed by nsrc sources.
func (b *body) regForm(in *inst, args []string, ndst, nsrc int, err error) error {
	if err != nil {
		return err
	}
	if len(args) != ndst+nsrc {
		return fmt.Errorf("want %d operands, have %d", ndst+nsrc, len(args))
	}
	for _, a := range args[:ndst] {
		r, ok := b.regs[a]
		if !ok {
			return fmt.Errorf("destination %q is not a register", a)
		}
		in.dst = append(in.dst, int32(r))
	}
	for _, a := range args[ndst:] {
		o, err := b.operand(a)
		if err != nil {
			return err
		}
		in.args = append(in.args, o)
	}
	return nil
}

// operand reads a register, special register, symbol or integer literal.
func (b *body) operand(s string) (operand, error) {
	if r, ok := b.regs[s]; ok {
		return operand{kind: kReg, reg: int32(r)}, nil
	}
	if sr, ok := specials[s]; ok {
		return operand{kind: kSpecial, reg: int32(sr)}, nil
	}
	if a, ok := b.syms[s]; ok {
		return operand{imm: a}, nil
	}
	v, err := literal(s)
	if err != nil {
		return operand{}, fmt.Errorf("unknown operand %q", s)
	}
	return operand{imm: v}, nil
}

var specials = map[string]int{
	"%tid.x": srTid, "%ntid.x": srNtid, "%ctaid.x": srCtaid, "%nctaid.x": srNctaid,
	"%laneid": srLaneid, "%warpid": srWarpid,
	"%tid.y": srZero, "%tid.z": srZero, "%ctaid.y": srZero, "%ctaid.z": srZero,
}

// literal reads a decimal or 0x literal, signed or not, as 64 bits.
func literal(s string) (uint64, error) {
	s = strings.TrimSuffix(s, "U")
	if v, err := strconv.ParseInt(s, 0, 64); err == nil {
		return uint64(v), nil
	}
	return strconv.ParseUint(s, 0, 64)
}

// memForm reads "ld.sp.T d, [a+off]" or "st.sp.T [a+off], v" (vector
// forms with braces).
func (b *body) memForm(in *inst, base string, args []string, err error) error {
	if err != nil {
		return err
	}
	if len(args) != 2 {
		return fmt.Errorf("want 2 operands, have %d", len(args))
	}
	in.op = opLd
	addr, vals := args[1], args[0]
	if base == "st" {
		in.op = opSt
		addr, vals = args[0], args[1]
	}
	if err := b.address(in, addr); err != nil {
		return err
	}
	var list []string
	if strings.HasPrefix(vals, "{") {
		for _, v := range strings.Split(strings.Trim(vals, "{}"), ",") {
			list = append(list, strings.TrimSpace(v))
		}
	} else {
		list = []string{vals}
	}
	if len(list) != in.vec {
		return fmt.Errorf("a .v%d access with %d values", in.vec, len(list))
	}
	for _, v := range list {
		if in.op == opLd {
			r, ok := b.regs[v]
			if !ok {
				return fmt.Errorf("destination %q is not a register", v)
			}
			in.dst = append(in.dst, int32(r))
			continue
		}
		o, err := b.operand(v)
		if err != nil {
			return err
		}
		in.args = append(in.args, o)
	}
	return nil
}

// address reads "[%rd1+-8]", "[sym+12]" or "[param_name]".
func (b *body) address(in *inst, s string) error {
	if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
		return fmt.Errorf("bad address %q", s)
	}
	s = s[1 : len(s)-1]
	base, off, hasOff := strings.Cut(s, "+")
	if hasOff {
		v, err := literal(off)
		if err != nil {
			return fmt.Errorf("bad offset in %q", s)
		}
		in.off = int64(v)
	}
	if p, ok := b.k.params[base]; ok {
		if in.sp != spParam {
			return fmt.Errorf("parameter %s outside ld.param", base)
		}
		in.addr = operand{imm: uint64(p)}
		return nil
	}
	o, err := b.operand(base)
	if err != nil || o.kind == kSpecial {
		return fmt.Errorf("bad address base %q", base)
	}
	in.addr = o
	return nil
}

// atomForm reads "atom.sp.op.T d, [a], b[, c]".
func (b *body) atomForm(in *inst, mods, args []string) error {
	in.op = opAtom
	if len(mods) != 1 || !strings.Contains(" add min max cas exch and or xor ", " "+mods[0]+" ") {
		return fmt.Errorf("unsupported atomic %v", mods)
	}
	in.cmp = mods[0]
	want := 3
	if in.cmp == "cas" {
		want = 4
	}
	if len(args) != want {
		return fmt.Errorf("want %d operands, have %d", want, len(args))
	}
	if in.typ.bits != 32 && in.typ.bits != 64 {
		return fmt.Errorf("atomics of %d bits are not supported", in.typ.bits)
	}
	if err := b.address(in, args[1]); err != nil {
		return err
	}
	return b.regForm(in, append([]string{args[0]}, args[2:]...), 1, want-2, nil)
}

func (b *body) branch(in *inst, args []string, err error) error {
	if err != nil {
		return err
	}
	in.op = opBra
	if len(args) != 1 {
		return fmt.Errorf("bra takes one label")
	}
	t, ok := b.labels[args[0]]
	if !ok {
		return fmt.Errorf("unknown label %q", args[0])
	}
	in.target = t
	return nil
}

// barForm reads "bar.sync 0" (and "barrier.sync") or "bar.warp.sync mask".
func (b *body) barForm(in *inst, mods, args []string) error {
	switch {
	case len(mods) == 2 && mods[0] == "warp" && mods[1] == "sync":
		in.op = opBarWarp
	case len(mods) == 1 && mods[0] == "sync":
		in.op = opBarSync
		if len(args) != 1 {
			return fmt.Errorf("bar.sync with a thread count is not supported")
		}
	default:
		return fmt.Errorf("unsupported barrier %v", mods)
	}
	return b.regForm(in, args, 0, 1, nil)
}
