package ptxsim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrSyntax is returned for PTX the parser cannot read or an instruction it
// does not execute; the error names the line.
var ErrSyntax = errors.New("ptxsim: cannot run this PTX")

// Module is a parsed PTX module.
type Module struct {
	kernels map[string]*Kernel
	// extern is the name of the module's dynamic shared array, if any.
	extern string
	// static are the module-scope .shared declarations.
	static []sharedDecl
}

// Kernel is one entry point of a module.
type Kernel struct {
	Name    string
	params  map[string]int // name → byte offset in the param space
	nparams int
	insts   []inst
	regs    int // registers per thread, predicates included
	local   int // bytes of local memory per thread
	// staticShared is the bytes of shared memory the kernel declares; the
	// dynamic array starts at dynOffset.
	staticShared int
	dynOffset    int
}

// Params is how many parameters the kernel takes.
func (k *Kernel) Params() int { return k.nparams }

type sharedDecl struct {
	name        string
	align, size int
}

// Address windows of the state spaces other than global: their addresses
// are offsets from these bases, so a zero or small pointer faults.
const (
	sharedBase = 1 << 24
	localBase  = 1 << 25
)

// Parse reads a PTX module.
func Parse(src string) (*Module, error) {
	p := &parser{lines: strings.Split(src, "\n"), m: &Module{kernels: map[string]*Kernel{}}}
	if err := p.module(); err != nil {
		return nil, err
	}
	return p.m, nil
}

// Kernel returns the entry point called name.
func (m *Module) Kernel(name string) (*Kernel, error) {
	k, ok := m.kernels[name]
	if !ok {
		return nil, fmt.Errorf("ptxsim: no entry %q in the module", name)
	}
	return k, nil
}

type parser struct {
	lines []string
	i     int // next line, 0-based
	m     *Module
}

func (p *parser) errf(line int, format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrSyntax, line, fmt.Sprintf(format, args...))
}

// next returns the next non-empty line with its comment removed, and its
// 1-based number; ok is false at the end.
func (p *parser) next() (string, int, bool) {
	for p.i < len(p.lines) {
		s := p.lines[p.i]
		p.i++
		if c := strings.Index(s, "//"); c >= 0 {
			s = s[:c]
		}
		if s = strings.TrimSpace(s); s != "" {
			return s, p.i, true
		}
	}
	return "", 0, false
}

func (p *parser) module() error {
	for {
		s, n, ok := p.next()
		if !ok {
			return nil
		}
		switch f := strings.Fields(s); {
		case f[0] == ".version" || f[0] == ".target" || f[0] == ".address_size":
		case strings.HasPrefix(s, ".extern .shared"):
			name, _, err := declName(f[len(f)-1])
			if err != nil {
				return p.errf(n, "%v", err)
			}
			p.m.extern = name
		case f[0] == ".shared":
			d, err := parseShared(f)
			if err != nil {
				return p.errf(n, "%v", err)
			}
			p.m.static = append(p.m.static, d)
		case strings.Contains(s, ".entry"):
			if err := p.entry(s, n); err != nil {
				return err
			}
		default:
			return p.errf(n, "unexpected %q", s)
		}
	}
}

// declName splits "name[16];" into the name and the element count (-1
// without brackets, 0 for "[]").
func declName(s string) (string, int, error) {
	s = strings.TrimSuffix(s, ";")
	name, rest, ok := strings.Cut(s, "[")
	if !ok {
		return name, -1, nil
	}
	rest = strings.TrimSuffix(rest, "]")
	if rest == "" {
		return name, 0, nil
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 {
		return "", 0, fmt.Errorf("bad array size in %q", s)
	}
	return name, n, nil
}

// parseShared reads ".shared .align A .TYPE name[N];".
func parseShared(f []string) (sharedDecl, error) {
	d := sharedDecl{align: 1}
	for i := 1; i < len(f)-1; i++ {
		switch {
		case f[i] == ".align" && i+1 < len(f)-1:
			a, err := strconv.Atoi(f[i+1])
			if err != nil || a <= 0 || a&(a-1) != 0 {
				return d, fmt.Errorf("bad alignment %q", f[i+1])
			}
			d.align = a
			i++
		case strings.HasPrefix(f[i], "."):
			t, ok := typeOf(f[i][1:])
			if !ok {
				return d, fmt.Errorf("unknown type %q", f[i])
			}
			d.size = int(t.bits) / 8
		}
	}
	name, n, err := declName(f[len(f)-1])
	if err != nil {
		return d, err
	}
	if d.size == 0 {
		return d, fmt.Errorf("no type in %q", strings.Join(f, " "))
	}
	if n >= 0 {
		d.size *= n
	}
	d.name = name
	return d, nil
}

func (p *parser) entry(head string, line int) error {
	f := strings.Fields(strings.ReplaceAll(head, "(", " ( "))
	var k Kernel
	for i, w := range f {
		if w == ".entry" && i+1 < len(f) {
			k.Name = f[i+1]
		}
	}
	if k.Name == "" {
		return p.errf(line, "entry without a name")
	}
	k.params = map[string]int{}
	if err := p.params(&k, head); err != nil {
		return err
	}
	b := &body{k: &k, regs: map[string]int{}, syms: map[string]uint64{}, labels: map[string]int{}}
	for _, d := range p.m.static {
		b.addShared(d)
	}
	if err := p.body(b); err != nil {
		return err
	}
	b.finishShared(p.m.extern)
	if err := b.resolve(); err != nil {
		return err
	}
	k.regs = b.nregs
	p.m.kernels[k.Name] = &k
	return nil
}

// params reads the parameter list up to ")" and the body's "{".
func (p *parser) params(k *Kernel, head string) error {
	s, n := head, 0
	for {
		if _, rest, ok := strings.Cut(s, ".param"); ok {
			f := strings.Fields(strings.NewReplacer(",", " ", ")", " ").Replace(rest))
			if len(f) < 2 || (f[0] != ".u64" && f[0] != ".b64" && f[0] != ".s64") {
				return p.errf(n, "only 8-byte parameters are supported: %q", s)
			}
			k.params[f[len(f)-1]] = 8 * k.nparams
			k.nparams++
		}
		if strings.Contains(s, "{") {
			return nil
		}
		var ok bool
		if s, n, ok = p.next(); !ok {
			return p.errf(n, "entry %s has no body", k.Name)
		}
	}
}

// body collects the declarations, labels and instructions of an entry.
type body struct {
	k      *Kernel
	regs   map[string]int    // register name → index
	nregs  int               // registers so far
	syms   map[string]uint64 // shared and local symbols → address
	labels map[string]int    // label → instruction index
	shared int               // static shared bytes so far
	pend   []pending         // instructions to decode once all names are known
}

type pending struct {
	line  int
	guard string
	op    string
	args  []string
}

func (b *body) addShared(d sharedDecl) {
	b.shared = alignUp(b.shared, d.align)
	b.syms[d.name] = sharedBase + uint64(b.shared)
	b.shared += d.size
}

// finishShared places the dynamic shared array after the static ones.
func (b *body) finishShared(extern string) {
	b.k.staticShared = b.shared
	b.k.dynOffset = alignUp(b.shared, 16)
	if extern != "" {
		b.syms[extern] = sharedBase + uint64(b.k.dynOffset)
	}
}

func alignUp(n, a int) int { return (n + a - 1) &^ (a - 1) }

func (p *parser) body(b *body) error {
	for {
		s, n, ok := p.next()
		if !ok {
			return p.errf(n, "entry %s ends without }", b.k.Name)
		}
		f := strings.Fields(s)
		switch {
		case s == "}":
			return nil
		case s == "{":
			return p.errf(n, "nested scopes are not supported")
		case f[0] == ".pragma":
			// loop hints: nothing to do when running the code
		case f[0] == ".reg":
			if err := b.declareRegs(f); err != nil {
				return p.errf(n, "%v", err)
			}
		case f[0] == ".local":
			d, err := parseShared(f) // same shape as .shared
			if err != nil {
				return p.errf(n, "%v", err)
			}
			b.k.local = alignUp(b.k.local, d.align)
			b.syms[d.name] = localBase + uint64(b.k.local)
			b.k.local += d.size
		case f[0] == ".shared":
			d, err := parseShared(f)
			if err != nil {
				return p.errf(n, "%v", err)
			}
			b.addShared(d)
		case strings.HasSuffix(s, ":") && len(f) == 1:
			b.labels[strings.TrimSuffix(s, ":")] = len(b.pend)
		default:
			in, err := splitInst(s)
			if err != nil {
				return p.errf(n, "%v", err)
			}
			in.line = n
			b.pend = append(b.pend, in)
		}
	}
}

// declareRegs reads ".reg .b32 %r<617>;" or ".reg .b64 %SP;".
func (b *body) declareRegs(f []string) error {
	if len(f) != 3 {
		return fmt.Errorf("bad register declaration %q", strings.Join(f, " "))
	}
	name := strings.TrimSuffix(f[2], ";")
	if base, count, ok := strings.Cut(name, "<"); ok {
		n, err := strconv.Atoi(strings.TrimSuffix(count, ">"))
		if err != nil || n < 0 || n > 1<<16 {
			return fmt.Errorf("bad register count in %q", name)
		}
		for i := range n {
			b.regs[base+strconv.Itoa(i)] = b.nregs
			b.nregs++
		}
		return nil
	}
	b.regs[name] = b.nregs
	b.nregs++
	return nil
}

// splitInst splits "@!%p1 bra LBB0_4;" into guard, opcode and operands.
func splitInst(s string) (pending, error) {
	var in pending
	if !strings.HasSuffix(s, ";") {
		return in, fmt.Errorf("statement without ';': %q", s)
	}
	s = strings.TrimSpace(strings.TrimSuffix(s, ";"))
	if strings.HasPrefix(s, "@") {
		g, rest, ok := strings.Cut(s, " ")
		if !ok {
			rest, g = "", s
		}
		in.guard, s = g[1:], strings.TrimSpace(strings.TrimLeft(rest, "\t"))
	}
	op, rest, _ := strings.Cut(strings.ReplaceAll(s, "\t", " "), " ")
	in.op = op
	depth, start := 0, 0
	rest = strings.TrimSpace(rest)
	for i, c := range rest {
		switch c {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			if depth == 0 {
				in.args = append(in.args, strings.TrimSpace(rest[start:i]))
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return in, fmt.Errorf("unbalanced brackets in %q", s)
	}
	if tail := strings.TrimSpace(rest[start:]); tail != "" {
		in.args = append(in.args, tail)
	}
	return in, nil
}

// resolve decodes every instruction now that labels and names are known.
func (b *body) resolve() error {
	b.k.insts = make([]inst, len(b.pend))
	for i, pd := range b.pend {
		in, err := b.decode(pd)
		if err != nil {
			return fmt.Errorf("%w: line %d: %s %s: %v", ErrSyntax, pd.line, pd.op, strings.Join(pd.args, ", "), err)
		}
		in.line = pd.line
		in.text = pd.op + " " + strings.Join(pd.args, ", ")
		b.k.insts[i] = in
	}
	return nil
}
