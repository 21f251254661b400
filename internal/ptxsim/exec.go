package ptxsim

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// thread states
const (
	running uint8 = iota
	waitBar
	waitWarp
	exited
)

type thread struct {
	regs    []uint64
	local   []byte
	pc      int32
	state   uint8
	tid     int32
	lastRun uint64 // machine step at which the thread last ran
}

// norm reads v as a value of type d: truncated to its width, then sign
// extended if d is signed. Registers keep values normalized by the type
// that wrote them; every reader normalizes by its own type.
func (d dtype) norm(v uint64) uint64 {
	switch d.bits {
	case 1:
		if v != 0 {
			return 1
		}
		return 0
	case 64:
		return v
	}
	if d.signed {
		s := 64 - uint(d.bits)
		return uint64(int64(v<<s) >> s)
	}
	return v & (1<<d.bits - 1)
}

func (m *machine) val(bk *block, t *thread, o operand) uint64 {
	switch o.kind {
	case kReg:
		return t.regs[o.reg]
	case kImm:
		return o.imm
	}
	switch o.reg {
	case srTid:
		return uint64(t.tid)
	case srNtid:
		return uint64(m.cfg.Block)
	case srCtaid:
		return uint64(bk.id)
	case srNctaid:
		return uint64(m.cfg.Grid)
	case srLaneid:
		return uint64(t.tid % 32)
	case srWarpid:
		return uint64(t.tid / 32)
	}
	return 0
}

// exec runs a non-collective instruction for one thread whose guard
// passed, and moves its program counter on.
func (m *machine) exec(bk *block, t *thread, in *inst) error {
	t.pc++
	switch in.op {
	case opBra:
		t.pc = int32(in.target)
		return nil
	case opRet:
		return m.exit(bk, t)
	case opMembar:
		return nil
	case opLd:
		return m.load(bk, t, in)
	case opSt:
		return m.store(bk, t, in)
	case opAtom:
		return m.atom(bk, t, in)
	}
	a := in.typ.norm(m.val(bk, t, in.args[0]))
	var r uint64
	switch in.op {
	case opMov:
		r = a
	case opNeg:
		r = -a
	case opNot:
		r = ^a
		if in.typ.bits == 1 {
			r = a ^ 1
		}
	case opPopc:
		r = uint64(bits.OnesCount64(in.src.norm(m.val(bk, t, in.args[0])) & widthMask(in.src)))
	case opCvt:
		r = in.src.norm(m.val(bk, t, in.args[0]))
	case opSelp:
		if m.val(bk, t, in.args[2]) != 0 {
			r = a
		} else {
			r = in.typ.norm(m.val(bk, t, in.args[1]))
		}
	case opBfe:
		r = bfe(in.typ, a, m.val(bk, t, in.args[1])&0xff, m.val(bk, t, in.args[2])&0xff)
	case opSetp:
		r = compare(in, a, in.typ.norm(m.val(bk, t, in.args[1])))
		t.regs[in.dst[0]] = r
		return nil
	case opMulWide:
		r = a * in.typ.norm(m.val(bk, t, in.args[1]))
		t.regs[in.dst[0]] = r // a 64-bit product of 32-bit operands
		return nil
	default:
		var err error
		if r, err = binop(in, a, in.typ.norm(m.val(bk, t, in.args[1]))); err != nil {
			return err
		}
	}
	t.regs[in.dst[0]] = in.typ.norm(r)
	return nil
}

func widthMask(d dtype) uint64 {
	if d.bits == 64 {
		return ^uint64(0)
	}
	return 1<<d.bits - 1
}

func binop(in *inst, a, b uint64) (uint64, error) {
	switch in.op {
	case opAdd:
		return a + b, nil
	case opSub:
		return a - b, nil
	case opMulLo:
		return a * b, nil
	case opAnd:
		return a & b, nil
	case opOr:
		return a | b, nil
	case opXor:
		return a ^ b, nil
	case opShl:
		if b = b & 0xffffffff; b >= uint64(in.typ.bits) {
			return 0, nil
		}
		return a << b, nil
	case opShr:
		b &= 0xffffffff
		if in.typ.signed {
			return uint64(int64(a) >> min(b, 63)), nil
		}
		if b >= uint64(in.typ.bits) {
			return 0, nil
		}
		return (a & widthMask(in.typ)) >> b, nil
	case opMax, opMin:
		less := a < b
		if in.typ.signed {
			less = int64(a) < int64(b)
		}
		if less == (in.op == opMin) {
			return a, nil
		}
		return b, nil
	case opDiv, opRem:
		if b&widthMask(in.typ) == 0 {
			return 0, fmt.Errorf("integer division by zero")
		}
		if in.typ.signed {
			if in.op == opDiv {
				return uint64(int64(a) / int64(b)), nil
			}
			return uint64(int64(a) % int64(b)), nil
		}
		a, b = a&widthMask(in.typ), b&widthMask(in.typ)
		if in.op == opDiv {
			return a / b, nil
		}
		return a % b, nil
	}
	return 0, fmt.Errorf("opcode %d is not an arithmetic operation", in.op)
}

func compare(in *inst, a, b uint64) uint64 {
	signed := in.typ.signed
	lt := a < b
	if signed {
		lt = int64(a) < int64(b)
	}
	var r bool
	switch in.cmp {
	case "eq":
		r = a == b
	case "ne":
		r = a != b
	case "lt", "lo":
		r = lt
	case "le", "ls":
		r = lt || a == b
	case "gt", "hi":
		r = !lt && a != b
	case "ge", "hs":
		r = !lt
	}
	if r {
		return 1
	}
	return 0
}

// bfe extracts len bits of a from bit pos, sign-extending signed types.
func bfe(d dtype, a, pos, n uint64) uint64 {
	w := uint64(d.bits)
	if n == 0 || pos >= w {
		if d.signed && pos >= w && int64(a) < 0 && n > 0 {
			return ^uint64(0)
		}
		return 0
	}
	r := (a & widthMask(d)) >> pos
	if n < 64 {
		r &= 1<<n - 1
	}
	if d.signed && n < 64 && r>>(min(n, w-pos)-1)&1 == 1 {
		r |= ^uint64(0) << min(n, w-pos)
	}
	return r
}

// access returns the size bytes an instruction of t reaches at addr,
// checked against its state space, and whether they are global memory.
func (m *machine) access(bk *block, t *thread, in *inst, addr uint64, size int) ([]byte, error) {
	if addr%uint64(size) != 0 {
		return nil, fmt.Errorf("misaligned %d-byte access at %#x", size, addr)
	}
	var mem []byte
	var base uint64
	switch in.sp {
	case spParam:
		mem = m.params
	case spShared:
		mem, base = bk.shared, sharedBase
	case spLocal:
		mem, base = t.local, localBase
	default:
		b, err := m.space.Bytes(addr, size)
		if err != nil {
			return nil, fmt.Errorf("global access: %v", err)
		}
		return b, nil
	}
	off := addr - base
	if off >= uint64(len(mem)) || uint64(size) > uint64(len(mem))-off {
		return nil, fmt.Errorf("%d-byte access at %#x outside the %d bytes of %s memory", size, addr, len(mem), spaceName[in.sp])
	}
	return mem[off : off+uint64(size)], nil
}

var spaceName = [...]string{spGeneric: "generic", spGlobal: "global", spShared: "shared", spLocal: "local", spParam: "param"}

// memOperand is the bytes a load or store of t reaches (checked, and
// noted for the race check), and the size of one element.
func (m *machine) memOperand(bk *block, t *thread, in *inst, write bool) ([]byte, int, error) {
	size := int(in.typ.bits) / 8
	addr := m.val(bk, t, in.addr) + uint64(in.off)
	b, err := m.access(bk, t, in, addr, size*in.vec)
	if err != nil {
		return nil, 0, err
	}
	if in.sp == spShared && m.race {
		if err := m.noteShared(bk, t, in, addr-sharedBase, size*in.vec, write, false); err != nil {
			return nil, 0, err
		}
	}
	return b, size, nil
}

func (m *machine) load(bk *block, t *thread, in *inst) error {
	b, size, err := m.memOperand(bk, t, in, false)
	if err != nil {
		return err
	}
	global := in.sp == spGlobal || in.sp == spGeneric
	for i, d := range in.dst {
		e := b[i*size : (i+1)*size]
		var v uint64
		if global && (size == 4 || size == 8) {
			v = atomicLoad(e)
		} else {
			v = readLE(e)
		}
		t.regs[d] = in.typ.norm(v)
	}
	return nil
}

func (m *machine) store(bk *block, t *thread, in *inst) error {
	b, size, err := m.memOperand(bk, t, in, true)
	if err != nil {
		return err
	}
	global := in.sp == spGlobal || in.sp == spGeneric
	for i, a := range in.args {
		e := b[i*size : (i+1)*size]
		v := m.val(bk, t, a)
		if global && (size == 4 || size == 8) {
			atomicStore(e, v)
		} else {
			writeLE(e, v)
		}
	}
	return nil
}

func readLE(b []byte) uint64 {
	switch len(b) {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

func writeLE(b []byte, v uint64) {
	switch len(b) {
	case 1:
		b[0] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	default:
		binary.LittleEndian.PutUint64(b, v)
	}
}

func (m *machine) atom(bk *block, t *thread, in *inst) error {
	size := int(in.typ.bits) / 8
	addr := m.val(bk, t, in.addr) + uint64(in.off)
	b, err := m.access(bk, t, in, addr, size)
	if err != nil {
		return err
	}
	v := in.typ.norm(m.val(bk, t, in.args[0]))
	var c uint64
	if in.cmp == "cas" {
		c = in.typ.norm(m.val(bk, t, in.args[1]))
	}
	f := atomicFunc(in, v, c)
	var old uint64
	if in.sp == spShared || in.sp == spLocal {
		if in.sp == spShared && m.race {
			if err := m.noteShared(bk, t, in, addr-sharedBase, size, true, true); err != nil {
				return err
			}
		}
		old = readLE(b)
		writeLE(b, f(old))
	} else {
		old = atomicUpdate(b, f)
	}
	t.regs[in.dst[0]] = in.typ.norm(old)
	return nil
}

// atomicFunc is the new value an atomic writes over old.
func atomicFunc(in *inst, v, c uint64) func(old uint64) uint64 {
	mask := widthMask(in.typ)
	signed := in.typ.signed
	return func(old uint64) uint64 {
		old = in.typ.norm(old)
		var r uint64
		switch in.cmp {
		case "add":
			r = old + v
		case "and":
			r = old & v
		case "or":
			r = old | v
		case "xor":
			r = old ^ v
		case "exch":
			r = v
		case "cas":
			r = old
			if old == v {
				r = c
			}
		case "min", "max":
			less := v < old
			if signed {
				less = int64(v) < int64(old)
			}
			r = old
			if less == (in.cmp == "min") && v != old {
				r = v
			}
		}
		return r & mask
	}
}
