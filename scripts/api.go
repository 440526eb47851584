//go:build ignore

// api pins a package's public API, as Go keeps api/go1.*.txt: it lists every
// exported name of the package's non-test files, one line each (a function
// or method with its signature, a type, each exported field of a struct and
// method of an interface, each constant and variable), and compares the
// list with the checked-in file, so that every change to the API is
// deliberate and visible in review. It also counts the API as the house
// rule counts it (shared/ARCHITECTURE.md): exported top-level names plus
// exported methods of exported types (fields and interface methods not
// counted), and fails above -max.
//
//	go run scripts/api.go                  # check the root against api/receipts.txt (CI)
//	go run scripts/api.go -write           # rewrite api/receipts.txt after a deliberate change
//	go run scripts/api.go -dir observe -file api/observe.txt -max 0
//
// Build tags: the files for the default build are read (a file whose
// //go:build line names receipts_nopebble is skipped).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	dir := flag.String("dir", ".", "the package's directory")
	file := flag.String("file", "api/receipts.txt", "the pinned API")
	write := flag.Bool("write", false, "rewrite the pinned API instead of checking it")
	maxNames := flag.Int("max", 135, "the most names allowed (top-level + methods); 0: no bound")
	flag.Parse()

	lines, top, methods, err := api(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(2)
	}
	fmt.Printf("%s: %d names (%d top-level, %d methods)\n", *dir, top+methods, top, methods)
	text := strings.Join(lines, "\n") + "\n"
	if *write {
		if err := os.MkdirAll(filepath.Dir(*file), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "api:", err)
			os.Exit(2)
		}
		if err := os.WriteFile(*file, []byte(text), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "api:", err)
			os.Exit(2)
		}
		fmt.Printf("wrote %s (%d lines)\n", *file, len(lines))
	}
	failed := false
	if *maxNames > 0 && top+methods > *maxNames {
		fmt.Fprintf(os.Stderr, "api: %s has %d names, more than %d\n", *dir, top+methods, *maxNames)
		failed = true
	}
	if !*write {
		pinned, err := os.ReadFile(*file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "api:", err)
			os.Exit(2)
		}
		if added, removed := diff(strings.Split(strings.TrimSpace(string(pinned)), "\n"), lines); len(added)+len(removed) > 0 {
			fmt.Fprintf(os.Stderr, "api: %s differs from %s (if the change is deliberate: go run scripts/api.go -dir %s -file %s -write)\n", *dir, *file, *dir, *file)
			for _, l := range removed {
				fmt.Fprintln(os.Stderr, "-", l)
			}
			for _, l := range added {
				fmt.Fprintln(os.Stderr, "+", l)
			}
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// diff returns the lines of now not in was, and of was not in now.
func diff(was, now []string) (added, removed []string) {
	for _, l := range now {
		if !slices.Contains(was, l) {
			added = append(added, l)
		}
	}
	for _, l := range was {
		if !slices.Contains(now, l) {
			removed = append(removed, l)
		}
	}
	return added, removed
}

// api lists dir's package API, sorted, and counts its names.
func api(dir string) (lines []string, top, methods int, err error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, 0, err
	}
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, 0, 0, err
		}
		if !defaultBuild(f) {
			continue
		}
		files = append(files, f)
	}
	exportedTypes := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, s := range g.Specs {
					if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
						exportedTypes[ts.Name.Name] = true
					}
				}
			}
		}
	}
	str := func(n any) string {
		var b bytes.Buffer
		_ = printer.Fprint(&b, fset, n)
		return strings.Join(strings.Fields(b.String()), " ")
	}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				sig := strings.TrimPrefix(str(d.Type), "func")
				if d.Recv == nil {
					top++
					lines = append(lines, "func "+d.Name.Name+sig)
					continue
				}
				recv := str(d.Recv.List[0].Type)
				base := strings.TrimPrefix(recv, "*")
				if i := strings.IndexByte(base, '['); i >= 0 {
					base = base[:i]
				}
				if !exportedTypes[base] {
					continue
				}
				methods++
				lines = append(lines, "method ("+recv+") "+d.Name.Name+sig)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						top++
						lines = append(lines, typeLines(s, str)...)
					case *ast.ValueSpec:
						kind := "var"
						if d.Tok == token.CONST {
							kind = "const"
						}
						for _, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							top++
							l := kind + " " + n.Name
							if s.Type != nil {
								l += " " + str(s.Type)
							}
							lines = append(lines, l)
						}
					}
				}
			}
		}
	}
	slices.Sort(lines)
	return lines, top, methods, nil
}

// typeLines is a type's line, and one per exported field or interface method.
func typeLines(s *ast.TypeSpec, str func(any) string) []string {
	name := s.Name.Name
	assign := ""
	if s.Assign.IsValid() {
		assign = "= "
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		out := []string{"type " + name + " struct"}
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 { // embedded
				if n := strings.TrimPrefix(str(f.Type), "*"); ast.IsExported(n[strings.LastIndexByte(n, '.')+1:]) {
					out = append(out, "field "+name+" embeds "+str(f.Type))
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					out = append(out, "field "+name+"."+n.Name+" "+str(f.Type))
				}
			}
		}
		return out
	case *ast.InterfaceType:
		out := []string{"type " + name + " interface"}
		for _, m := range t.Methods.List {
			for _, n := range m.Names {
				if n.IsExported() {
					out = append(out, "method ("+name+" interface) "+n.Name+strings.TrimPrefix(str(m.Type), "func"))
				}
			}
			if len(m.Names) == 0 {
				out = append(out, "type "+name+" interface embeds "+str(m.Type))
			}
		}
		return out
	}
	return []string{"type " + name + " " + assign + str(s.Type)}
}

// defaultBuild reports whether f is in the default build (its //go:build
// line, if any, holds with no tags set but the usual ones).
func defaultBuild(f *ast.File) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > f.Package {
			break
		}
		for _, c := range cg.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			if err != nil {
				return false
			}
			return expr.Eval(func(tag string) bool { return tag == "linux" || tag == "amd64" || tag == "unix" || tag == "gc" })
		}
	}
	return true
}
