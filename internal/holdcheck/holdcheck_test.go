package holdcheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// gated lists, per package, the types whose exported methods must take a
// hold, and the methods exempt with the reason: they read only Go memory.
var gated = []struct {
	dir    string
	types  []string
	exempt map[string]string
}{
	{"prefix", []string{"Store", "Mover", "LayerLoad", "Fill"}, map[string]string{
		"Fill.Blocks": "under the fill's own hold, taken by BeginFill", "Fill.Slack": "under the fill's own hold, taken by BeginFill",
		"Fill.Statuses":   "Go memory",
		"Fill.Pace":       "Go memory: the pacer the commit uses",
		"Store.Namespace": "a string", "Store.Room": "the geometry", "Store.Checksum": "hashes the caller's bytes",
		"Store.VerifyReads": "a flag", "Store.Extent": "the geometry", "Store.Name": "a string",
		"Store.BlockBytes": "the geometry", "Store.TenantSecret": "Go memory", "Mover.Close": "engine ranges only", "LayerLoad.Pages": "a count",
	}},
	{"topk", []string{"Pool"}, map[string]string{
		"Pool.Config": "the configuration", "Pool.Buffer": "an engine buffer", "Pool.Row": "arithmetic",
		"Pool.Len": "Go memory", "Pool.Stats": "Go memory", "Pool.Planner": "a constant",
	}},
	{"engram", []string{"Prefetcher"}, map[string]string{
		"Prefetcher.Options": "the options", "Prefetcher.Metrics": "Go memory", "Prefetcher.Layers": "Go memory",
		"Prefetcher.CacheBuffer": "an engine buffer", "Prefetcher.Close": "engine memory only (waits for copies)",
	}},
}

// pkgFuncs are a package's function and method bodies by name (methods by
// their bare name, several types' together), for following calls.
type pkgFuncs map[string][]*ast.BlockStmt

func funcsOf(files []*ast.File) pkgFuncs {
	fns := pkgFuncs{}
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				fns[fd.Name.Name] = append(fns[fd.Name.Name], fd.Body)
			}
		}
	}
	return fns
}

// isGate reports whether call enters the gate itself: a hold taken from a
// tier client, or the C ABI's use[T], which takes one.
func isGate(call *ast.CallExpr) bool {
	switch fn := call.Fun.(type) {
	case *ast.SelectorExpr:
		return fn.Sel.Name == "Hold" || fn.Sel.Name == "HoldToRelease"
	case *ast.IndexExpr:
		id, ok := fn.X.(*ast.Ident)
		return ok && id.Name == "use"
	}
	return false
}

// holds reports whether body enters the gate, directly or through the
// package's own functions and methods it calls (up to depth calls deep).
func (fns pkgFuncs) holds(body *ast.BlockStmt, depth int, seen map[*ast.BlockStmt]bool) bool {
	if depth == 0 || seen[body] {
		return false
	}
	seen[body] = true
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || found {
			return !found
		}
		if isGate(call) {
			found = true
			return false
		}
		var name string
		switch fn := call.Fun.(type) {
		case *ast.Ident:
			name = fn.Name
		case *ast.SelectorExpr:
			name = fn.Sel.Name
		}
		for _, b := range fns[name] {
			if fns.holds(b, depth-1, seen) {
				found = true
				break
			}
		}
		return !found
	})
	return found
}

func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

func recvType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	typ := fd.Recv.List[0].Type
	if st, ok := typ.(*ast.StarExpr); ok {
		typ = st.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// TestEveryMethodTakesAHold: an exported method of a gated type that
// neither takes a hold nor is exempt fails, and so does an exemption whose
// method is gone.
func TestEveryMethodTakesAHold(t *testing.T) {
	for _, pkg := range gated {
		want := map[string]bool{}
		for _, ty := range pkg.types {
			want[ty] = true
		}
		seen := map[string]bool{}
		files := parseDir(t, pkg.dir)
		fns := funcsOf(files)
		for _, f := range files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil || !fd.Name.IsExported() || !want[recvType(fd)] {
					continue
				}
				name := recvType(fd) + "." + fd.Name.Name
				seen[name] = true
				_, exempt := pkg.exempt[name]
				switch took := fns.holds(fd.Body, 4, map[*ast.BlockStmt]bool{}); {
				case !took && !exempt:
					t.Errorf("%s: %s touches no gate: take a hold (tier.Hold), or exempt it with the reason", pkg.dir, name)
				case took && exempt:
					t.Errorf("%s: %s takes a hold but is listed as exempt", pkg.dir, name)
				}
			}
		}
		for name := range pkg.exempt {
			if !seen[name] {
				t.Errorf("%s: exemption for %s, which is gone", pkg.dir, name)
			}
		}
	}
}

// abiExempt are the C exports that reach no tier through a handle.
var abiExempt = map[string]string{
	"cxl_attach":                   "makes the handle",
	"cxl_detach":                   "closes the client, which is the gate",
	"cxl_abi_version":              "a constant",
	"cxl_page_trailer_bytes":       "a constant",
	"cxl_engram_hash":              "hashes the caller's ids",
	"cxl_engram_table_name":        "makes a name from the caller's strings",
	"cxl_tier_release":             "gives back a hold cxl_tier_hold took (it touches no tier memory)",
	"cxl_engram_checkpoint_digest": "reads checkpoint files, not the tier",
	"cxl_prefix_keys":              "hashes the caller's tokens",
	"cxl_prefix_part_keys":         "hashes the caller's tokens",
	"cxl_prefix_part_keys_joined":  "hashes the caller's tokens",
	"cxl_engram_wait":              "waits for engine copies; the prefetcher's close waits for them before its tier goes",
}

// TestEveryExportTakesAHold: every C export of the library goes through
// use[T], which takes the tier's hold, unless it is exempt.
func TestEveryExportTakesAHold(t *testing.T) {
	seen := map[string]bool{}
	var missing []string
	files := parseDir(t, filepath.Join("cmd", "libcxltier"))
	fns := funcsOf(files)
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Doc == nil || !hasExport(fd.Doc) {
				continue
			}
			name := fd.Name.Name
			seen[name] = true
			if _, exempt := abiExempt[name]; exempt {
				continue
			}
			if !fns.holds(fd.Body, 4, map[*ast.BlockStmt]bool{}) {
				missing = append(missing, name)
			}
		}
	}
	sort.Strings(missing)
	for _, name := range missing {
		t.Errorf("cmd/libcxltier: export %s takes no hold: call use[T](handle)", name)
	}
	for name := range abiExempt {
		if !seen[name] {
			t.Errorf("cmd/libcxltier: exemption for %s, which is not exported", name)
		}
	}
	if len(seen) < 40 {
		t.Fatalf("found %d exports: the parse missed them", len(seen))
	}
}

func hasExport(cg *ast.CommentGroup) bool {
	for _, c := range cg.List {
		if strings.HasPrefix(c.Text, "//export ") {
			return true
		}
	}
	return false
}

// addressExports are the C exports that hand tier addresses out past the
// call, and what keeps the mapping under them until the caller is done:
// a hold its handle keeps ("handle": the export takes a hold and gives it
// to a handle), another handle's hold, or the package's views.
var addressExports = map[string]string{
	"cxl_tier_mappings":      "handle",
	"cxl_prefix_pin":         "handle",
	"cxl_prefix_fill_blocks": "the fill's hold, taken by cxl_prefix_fill_begin and kept until its commit or close",
	"cxl_object_create":      "the package's views: TierObject.buffer tracks each with cxl_tier_hold (python/tests/test_region.py checks)",
	"cxl_object_open":        "the package's views: TierObject.buffer tracks each with cxl_tier_hold (python/tests/test_region.py checks)",
	"cxl_region_alloc":       "the package's views: Region.buffer tracks each with cxl_tier_hold (python/tests/test_region.py checks)",
}

// handsOutAddress reports whether body, or a function of the package it
// calls, stores an unsafe.Pointer into memory the caller reads (an
// assignment to an index or a dereference).
func (fns pkgFuncs) handsOutAddress(body *ast.BlockStmt, depth int, seen map[*ast.BlockStmt]bool) bool {
	if depth == 0 || seen[body] {
		return false
	}
	seen[body] = true
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.AssignStmt:
			for i, lhs := range n.Lhs {
				switch lhs.(type) {
				case *ast.IndexExpr, *ast.StarExpr:
				default:
					continue
				}
				if i < len(n.Rhs) && isPointerConversion(n.Rhs[i]) {
					found = true
				}
			}
		case *ast.CallExpr:
			var name string
			switch fn := n.Fun.(type) {
			case *ast.Ident:
				name = fn.Name
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			}
			for _, b := range fns[name] {
				if fns.handsOutAddress(b, depth-1, seen) {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

func isPointerConversion(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Pointer" {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "unsafe"
}

// callsAny reports whether body, or a function it calls, calls one of names.
func (fns pkgFuncs) callsAny(body *ast.BlockStmt, names map[string]bool, depth int, seen map[*ast.BlockStmt]bool) bool {
	if depth == 0 || seen[body] {
		return false
	}
	seen[body] = true
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || found {
			return !found
		}
		var name string
		switch fn := call.Fun.(type) {
		case *ast.Ident:
			name = fn.Name
		case *ast.SelectorExpr:
			name = fn.Sel.Name
		}
		if names[name] {
			found = true
			return false
		}
		for _, b := range fns[name] {
			if fns.callsAny(b, names, depth-1, seen) {
				found = true
			}
		}
		return !found
	})
	return found
}

// TestAddressesOutliveNoHold: every C export that hands tier addresses out
// past its call is listed with what keeps the mapping under them; one
// listed as "handle" takes a hold (Hold or tierHold) and makes a handle of
// it. An export added later that hands out addresses fails until it says.
func TestAddressesOutliveNoHold(t *testing.T) {
	files := parseDir(t, filepath.Join("cmd", "libcxltier"))
	fns := funcsOf(files)
	seen := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Doc == nil || !hasExport(fd.Doc) {
				continue
			}
			name := fd.Name.Name
			if !fns.handsOutAddress(fd.Body, 4, map[*ast.BlockStmt]bool{}) {
				if _, listed := addressExports[name]; listed {
					t.Errorf("%s is listed as handing out addresses but does not", name)
				}
				continue
			}
			seen[name] = true
			how, listed := addressExports[name]
			switch {
			case !listed:
				t.Errorf("%s hands tier addresses out: keep them under a hold its handle keeps, and list it", name)
			case how == "handle":
				holds := fns.callsAny(fd.Body, map[string]bool{"Hold": true, "tierHold": true}, 4, map[*ast.BlockStmt]bool{})
				hands := fns.callsAny(fd.Body, map[string]bool{"add": true, "addChild": true}, 4, map[*ast.BlockStmt]bool{})
				if !holds || !hands {
					t.Errorf("%s: takes a hold %v, makes a handle %v: its addresses must stay under a hold its handle keeps", name, holds, hands)
				}
			}
		}
	}
	for name := range addressExports {
		if !seen[name] {
			t.Errorf("%s is listed but not found handing out addresses", name)
		}
	}
}
