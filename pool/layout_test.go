package pool_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestPoolUsesPublicAPIOnly: the pool is built over the root's public API
// (issue #35, item 2): of this module it imports the root only, no
// internal package, so the compiler holds it to what a user can call.
func TestPoolUsesPublicAPIOnly(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/vramguard/vramguard"
	fset := token.NewFileSet()
	root := false
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
			switch {
			case p == module:
				root = true
			case strings.HasPrefix(p, module+"/"):
				t.Errorf("%s imports %s: the pool uses the root's public API only", name, p)
			}
		}
	}
	if !root {
		t.Error("no file of the pool imports the root")
	}
}
