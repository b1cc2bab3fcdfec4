package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// The gate keeps only HTTP (issue #47): a forwarded request's load is
// admitted by the library's one door, OllamaClient.Admit, and nowhere
// else. Read from the gate's own source: every room-making call it makes
// is a dry run (can-load, /ready's reading) or a reservation an HTTP
// client asked for (/vramgate/reservations with make_room), never the
// admission of a load; no unload is planned by the gate itself
// (verifiedUnload unloads what a client named); and Admit is called.
func TestAdmissionIsTheLibrarys(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	admits := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			switch sel.Sel.Name {
			case "Admit":
				admits++
			case "EnsureFree":
				if len(call.Args) != 2 || !(hasField(call.Args[1], "DryRun", "true") || hasField(call.Args[1], "Reservation", "")) {
					t.Errorf("%s: EnsureFree that is neither a dry run nor an HTTP client's reservation: the gate would make room of its own", fset.Position(call.Pos()))
				}
			case "Lock":
				if x, ok := sel.X.(*ast.SelectorExpr); ok && strings.Contains(strings.ToLower(x.Sel.Name), "admit") {
					t.Errorf("%s: an admission lock of the gate's own (%s)", fset.Position(call.Pos()), x.Sel.Name)
				}
			}
			return true
		})
	}
	if admits != 1 {
		t.Errorf("the gate calls OllamaClient.Admit %d times; want once (forward)", admits)
	}
}

// hasField reports whether e is a composite literal with the field set
// (to value, when value is not empty).
func hasField(e ast.Expr, field, value string) bool {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return false
	}
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
			if value == "" {
				return true
			}
			v, ok := kv.Value.(*ast.Ident)
			return ok && v.Name == value
		}
	}
	return false
}
