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
