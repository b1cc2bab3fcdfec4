// Command filegraph measures how the production files of one Go package
// folder reach one another: file A refers to file B when A names a
// package-level declaration of B (a type, func, var or const by its
// identifier; a method by a selector whose name only B declares as a
// method). It prints the files, the pairs that refer to each other both
// ways, and the size of the largest set of files that all reach one
// another (the largest strongly connected component). It reads syntax
// only (no type checking), so a local name that shadows a package-level
// one counts as a reference: the figures are an upper bound, comparable
// between two versions of one package.
//
// Usage:
//
//	go run ./internal/tools/filegraph [dir]
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		fail(err)
	}
	fset := token.NewFileSet()
	var files []string
	asts := map[string]*ast.File{}
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			fail(err)
		}
		b := filepath.Base(n)
		files = append(files, b)
		asts[b] = f
	}
	owner := map[string]string{}     // top-level identifier -> file
	methods := map[string][]string{} // method name -> files declaring one
	for _, name := range files {
		for _, d := range asts[name].Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil {
					methods[d.Name.Name] = append(methods[d.Name.Name], name)
				} else {
					owner[d.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						owner[s.Name.Name] = name
					case *ast.ValueSpec:
						for _, id := range s.Names {
							owner[id.Name] = name
						}
					}
				}
			}
		}
	}
	refs := map[string]map[string]bool{}
	for _, name := range files {
		refs[name] = map[string]bool{}
		ast.Inspect(asts[name], func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if fs := methods[n.Sel.Name]; len(fs) == 1 && fs[0] != name {
					refs[name][fs[0]] = true
				}
			case *ast.Ident:
				if o, ok := owner[n.Name]; ok && o != name {
					refs[name][o] = true
				}
			}
			return true
		})
	}
	mutual := 0
	for i, a := range files {
		for _, b := range files[i+1:] {
			if refs[a][b] && refs[b][a] {
				mutual++
			}
		}
	}
	fmt.Printf("%d files, %d pairs that refer to each other, largest set that all reach one another: %d files\n",
		len(files), mutual, largestSCC(files, refs))
}

// largestSCC is the size of the largest strongly connected component.
func largestSCC(files []string, refs map[string]map[string]bool) int {
	reach := func(from string) map[string]bool {
		seen := map[string]bool{from: true}
		stack := []string{from}
		for len(stack) > 0 {
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for g := range refs[f] {
				if !seen[g] {
					seen[g] = true
					stack = append(stack, g)
				}
			}
		}
		return seen
	}
	all := map[string]map[string]bool{}
	for _, f := range files {
		all[f] = reach(f)
	}
	best := 0
	for _, f := range files {
		n := 0
		for _, g := range files {
			if all[f][g] && all[g][f] {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "filegraph:", err)
	os.Exit(1)
}
