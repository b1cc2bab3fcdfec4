package vramguard

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestFunctionLength holds the package to short functions (issue #24): no
// production function longer than 100 lines, and the unload's driver,
// unloadModel, at most 60 (its decisions are in unload_state.go).
func TestFunctionLength(t *testing.T) {
	limits := map[string]int{"unloadModel": 60}
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	longest, longestName, n := 0, "", 0
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n++
			lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			limit, ok := limits[fd.Name.Name]
			if !ok {
				limit = 100
			}
			if lines > limit {
				t.Errorf("%s: %s is %d lines, more than %d", fset.Position(fd.Pos()), fd.Name.Name, lines, limit)
			}
			if lines > longest {
				longest, longestName = lines, fd.Name.Name
			}
		}
	}
	if n == 0 {
		t.Fatal("no function found")
	}
	t.Logf("%d functions; the longest, %s, has %d lines", n, longestName, longest)
}

// TestAPIBudget pins the root's exported API (issue #35, item 8): the
// exported identifiers (types, funcs, methods on exported types, consts,
// vars; scripts/api-count.sh counts the same) and, of them, the types,
// funcs and methods. A change that adds one fails here and says so in its
// diff; one that removes some lowers the pins.
func TestAPIBudget(t *testing.T) {
	const (
		// 221 at c60ae07; #34 made four "no room" errors one (214); #35's
		// one style of hooks (215): FallbackEvent and CleanupEvent for
		// ModelEvent, seven callbacks that reported other hooks' events
		// gone (Hooks' fields are not counted here); the pool in a package
		// of its own (201): NewPool, PoolOptions, PoolMember, Placement,
		// PlaceReason and its three values, MemberStatus, Members gone, and
		// Checks.Has, EnsureReport.Freed, ReleaseReport.FreedAllDevices
		// and Offload.CPUBytes, one expression each; DoneReasonUnknown, a
		// name for "" (200); #47: one registry of what gives memory back,
		// the tenants, its second registration method gone (199); and one
		// door for the loads a proxy forwards, OllamaClient.Admit, so that
		// vramgate keeps no admission of its own (200).
		maxIdents = 200
		maxDecls  = 129 // types + funcs + methods; 146 at c60ae07, 139 after #34, 129 after #35 and after #47
	)
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{} // identifier -> category
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					seen[d.Name.Name] = "func"
					continue
				}
				recv := d.Recv.List[0].Type
				if s, ok := recv.(*ast.StarExpr); ok {
					recv = s.X
				}
				if id, ok := recv.(*ast.Ident); ok && id.IsExported() {
					seen[id.Name+"."+d.Name.Name] = "method"
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							seen[s.Name.Name] = "type"
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								seen[n.Name] = d.Tok.String()
							}
						}
					}
				}
			}
		}
	}
	decls := 0
	for _, c := range seen {
		if c == "type" || c == "func" || c == "method" {
			decls++
		}
	}
	if len(seen) > maxIdents || decls > maxDecls {
		t.Errorf("the root exports %d identifiers (budget %d), %d types+funcs+methods (budget %d): a feature that can live in its own package does", len(seen), maxIdents, decls, maxDecls)
	}
	if len(seen) < maxIdents || decls < maxDecls {
		t.Errorf("the root exports %d identifiers and %d types+funcs+methods, fewer than pinned (%d, %d): lower the pins", len(seen), decls, maxIdents, maxDecls)
	}
}

// TestRootImportsNoChild: the module's public packages import the root,
// never the other way round (issue #35: the pool was a hidden mode of the
// client): no root file imports a package of this module but internal
// ones.
func TestRootImportsNoChild(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/vramguard/vramguard/"
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range f.Imports {
			p := strings.Trim(im.Path.Value, `"`)
			if strings.HasPrefix(p, module) && !strings.HasPrefix(p, module+"internal/") {
				t.Errorf("%s imports %s: the root imports no public package of the module", name, p)
			}
		}
	}
}
