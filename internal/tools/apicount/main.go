// Command apicount counts the exported top-level identifiers of one Go
// package folder: types, functions, methods on exported types, constants
// and variables, and separately the exported fields of exported struct
// types and the methods of exported interfaces. It reads every non-test
// .go file of the folder whatever its build constraints, so a declaration
// that has a twin in another build (a cgo and a no-cgo file) is counted in
// "declarations" once per file and in "identifiers" once.
//
// Usage:
//
//	go run ./internal/tools/apicount [-list] [dir]
//
// dir defaults to the current folder; -list prints every identifier.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The categories, in the order they are printed.
var categories = []string{"type", "func", "method", "const", "var"}

func main() {
	list := flag.Bool("list", false, "print every identifier")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: apicount [-list] [dir]")
		flag.PrintDefaults()
	}
	flag.Parse()
	dir := "."
	switch flag.NArg() {
	case 0:
	case 1:
		dir = flag.Arg(0)
	default:
		flag.Usage()
		os.Exit(2)
	}
	c, err := count(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(1)
	}
	c.print(os.Stdout, *list)
}

// counts holds how many files declare each identifier, by category.
type counts struct {
	decls  map[string]map[string]int // category -> name -> files declaring it
	fields map[string]int            // Type.Field -> files declaring it
	iface  map[string]int            // Interface.Method -> files declaring it
}

func count(dir string) (*counts, error) {
	c := &counts{decls: make(map[string]map[string]int), fields: make(map[string]int), iface: make(map[string]int)}
	for _, k := range categories {
		c.decls[k] = make(map[string]int)
	}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if f.Name.Name == "main" {
			continue
		}
		n++
		c.file(f)
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: %w", dir, fs.ErrNotExist)
	}
	return c, nil
}

func (c *counts) file(f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				c.decls["func"][d.Name.Name]++
				continue
			}
			if recv := recvName(d.Recv.List[0].Type); ast.IsExported(recv) {
				c.decls["method"][recv+"."+d.Name.Name]++
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						c.decls["type"][s.Name.Name]++
						c.members(s)
					}
				case *ast.ValueSpec:
					kind := "var"
					if d.Tok == token.CONST {
						kind = "const"
					}
					for _, id := range s.Names {
						if id.IsExported() {
							c.decls[kind][id.Name]++
						}
					}
				}
			}
		}
	}
}

// members counts the exported fields of a struct type and the exported
// methods of an interface type.
func (c *counts) members(s *ast.TypeSpec) {
	switch t := s.Type.(type) {
	case *ast.StructType:
		for _, fl := range t.Fields.List {
			if len(fl.Names) == 0 { // embedded
				if name := recvName(fl.Type); ast.IsExported(name) {
					c.fields[s.Name.Name+"."+name]++
				}
				continue
			}
			for _, id := range fl.Names {
				if id.IsExported() {
					c.fields[s.Name.Name+"."+id.Name]++
				}
			}
		}
	case *ast.InterfaceType:
		for _, m := range t.Methods.List {
			for _, id := range m.Names {
				if id.IsExported() {
					c.iface[s.Name.Name+"."+id.Name]++
				}
			}
		}
	}
}

// recvName returns the type name of a receiver or embedded field: T, *T,
// T[P], pkg.T ("T").
func recvName(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.SelectorExpr:
			return t.Sel.Name
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

func sum(m map[string]int) (decls int) {
	for _, n := range m {
		decls += n
	}
	return decls
}

func (c *counts) print(w *os.File, list bool) {
	var ids, decls int
	for _, k := range categories {
		m := c.decls[k]
		ids += len(m)
		decls += sum(m)
		fmt.Fprintf(w, "%-8s %4d", k+"s", len(m))
		if d := sum(m); d != len(m) {
			fmt.Fprintf(w, " (%d declarations: build-tag twins)", d)
		}
		fmt.Fprintln(w)
		if list {
			printNames(w, m)
		}
	}
	fmt.Fprintf(w, "total    %4d identifiers, %d declarations\n", ids, decls)
	fmt.Fprintf(w, "fields   %4d exported fields of exported struct types\n", len(c.fields))
	if list {
		printNames(w, c.fields)
	}
	fmt.Fprintf(w, "iface    %4d exported methods of exported interfaces (not in the total)\n", len(c.iface))
	if list {
		printNames(w, c.iface)
	}
}

func printNames(w *os.File, m map[string]int) {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(w, "\t%s\n", name)
	}
}
