package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

// TestEveryExportRecovers: every exported function but the constants
// (cxl_abi_version, cxl_page_trailer_bytes) defers recoverCall with its own name first, so no panic reaches the
// process the library runs in.
func TestEveryExportRecovers(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	exports := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Doc == nil || !hasExport(fn) {
				continue
			}
			exports++
			if fn.Name.Name == "cxl_abi_version" || fn.Name.Name == "cxl_page_trailer_bytes" {
				continue
			}
			if !defersRecover(fn) {
				t.Errorf("%s: %s does not defer recoverCall(%q, errbuf, errlen, &code) first", fset.Position(fn.Pos()), fn.Name.Name, fn.Name.Name)
			}
		}
	}
	if exports < 30 {
		t.Fatalf("found %d exported functions; the parse is wrong", exports)
	}
}

func hasExport(fn *ast.FuncDecl) bool {
	for _, c := range fn.Doc.List {
		if c.Text == "//export "+fn.Name.Name {
			return true
		}
	}
	return false
}

// defersRecover: the first statement is defer recoverCall("<name>",
// errbuf, errlen, &<the function's one named result>), so a panic's code
// reaches the caller (a pointer to any other variable would drop it).
func defersRecover(fn *ast.FuncDecl) bool {
	if len(fn.Body.List) == 0 || fn.Type.Results == nil || len(fn.Type.Results.List) != 1 ||
		len(fn.Type.Results.List[0].Names) != 1 {
		return false
	}
	result := fn.Type.Results.List[0].Names[0].Name
	d, ok := fn.Body.List[0].(*ast.DeferStmt)
	if !ok {
		return false
	}
	id, ok := d.Call.Fun.(*ast.Ident)
	if !ok || id.Name != "recoverCall" || len(d.Call.Args) != 4 {
		return false
	}
	name, ok := d.Call.Args[0].(*ast.BasicLit)
	if !ok || name.Value != `"`+fn.Name.Name+`"` {
		return false
	}
	for i, want := range []string{"errbuf", "errlen"} {
		if a, ok := d.Call.Args[1+i].(*ast.Ident); !ok || a.Name != want {
			return false
		}
	}
	addr, ok := d.Call.Args[3].(*ast.UnaryExpr)
	if !ok || addr.Op != token.AND {
		return false
	}
	x, ok := addr.X.(*ast.Ident)
	return ok && x.Name == result
}

// TestDefersRecoverCatchesTheGaps: the checker itself refuses an export
// whose deferred recover is missing, names another call, or points at
// anything but its named result.
func TestDefersRecoverCatchesTheGaps(t *testing.T) {
	for _, c := range []struct {
		src string
		ok  bool
	}{
		{`func f(errbuf *C.char, errlen C.int) (code C.int) { defer recoverCall("f", errbuf, errlen, &code); return 0 }`, true},
		{`func f(errbuf *C.char, errlen C.int) (code C.int) { var other C.int; defer recoverCall("f", errbuf, errlen, &other); return 0 }`, false},
		{`func f(errbuf *C.char, errlen C.int) (code C.int) { defer recoverCall("f", errbuf, errlen, nil); return 0 }`, false},
		{`func f(errbuf *C.char, errlen C.int) C.int { var code C.int; defer recoverCall("f", errbuf, errlen, &code); return code }`, false},
		{`func f(errbuf *C.char, errlen C.int) (code C.int) { defer recoverCall("g", errbuf, errlen, &code); return 0 }`, false},
		{`func f(errbuf *C.char, errlen C.int) (code C.int) { defer recoverCall("f", nil, 0, &code); return 0 }`, false},
		{`func f(errbuf *C.char, errlen C.int) (code C.int) { x := 1; _ = x; defer recoverCall("f", errbuf, errlen, &code); return 0 }`, false},
	} {
		file, err := parser.ParseFile(token.NewFileSet(), "x.go", "package p\n"+c.src, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := defersRecover(file.Decls[0].(*ast.FuncDecl)); got != c.ok {
			t.Errorf("defersRecover = %v, want %v for\n%s", got, c.ok, c.src)
		}
	}
}

// TestRecovered: a panic becomes an error of no kind (CXL_EOTHER) naming
// the call, with the stack logged.
func TestRecovered(t *testing.T) {
	var log bytes.Buffer
	f := func() (err error) {
		defer func() { err = recovered("cxl_test", recover(), &log) }()
		var m map[string]int
		m["x"] = 1
		return nil
	}
	err := f()
	if err == nil || !strings.Contains(err.Error(), "cxl_test") || codeOf(err) != codeOther {
		t.Fatalf("%v (code %d)", err, codeOf(err))
	}
	if !strings.Contains(log.String(), "goroutine") {
		t.Fatalf("no stack logged: %q", log.String())
	}
	if recovered("cxl_test", nil, &log) != nil {
		t.Fatal("no panic, yet an error")
	}
	// Whatever the panic's value, the call reports CXL_EOTHER: never
	// success (panic(nil)), never the kind of an error it happens to carry.
	for _, v := range []any{nil, tier.ErrNotFound, fmt.Errorf("wrapped: %w", tier.ErrExists), "text"} {
		err := func() (err error) {
			defer func() { err = recovered("cxl_test", recover(), &log) }()
			panic(v)
		}()
		if err == nil || codeOf(err) != codeOther {
			t.Errorf("panic(%v): %v, code %d", v, err, codeOf(err))
		}
	}
}

// TestCodes: sentinels of every package reach C callers with their kind;
// the ones that used to come out as CXL_EOTHER among them.
func TestCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{engram.ErrCacheTooSmall, codeNoSpace},
		{kernels.ErrOutOfBounds, codeInval},
		{kernels.ErrBadRequest, codeInval},
		{kernels.ErrTooManyRanges, codeNoSpace},
		{topk.ErrBadPosition, codeInval},
		{topk.ErrUnknown, codeNotFound},
		{prefix.ErrDenied, codeDenied},
		{prefix.ErrChecksum, codeChecksum},
		{tier.ErrLeaseLost, codeClosed},
		{tier.ErrExists, codeExist},
		{errRange, codeRange},
		{tier.ErrLockTimeout, codeBusy},
		{prefix.ErrPinned, codeBusy},
		{tier.ErrCorrupt, codeDamaged},
		{tier.ErrHoldsInFlight, codeBusy},
		{errBadHandle, codeNotFound},
		{errors.New("plain"), codeOther},
	} {
		if got := int(codeOf(tc.err)); got != tc.want {
			t.Errorf("%v: code %d, want %d", tc.err, got, tc.want)
		}
		if got := int(codeOf(errors.Join(errors.New("context"), tc.err))); got != tc.want && tc.want != codeOther {
			t.Errorf("wrapped %v: code %d, want %d", tc.err, got, tc.want)
		}
	}
}
