package runcue_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The architecture map names files and, after a colon, what they declare
// ("runs.go: runState", "retry.go: RetryPolicy.Delay"). Every name must be
// there, so the map cannot drift from the code unnoticed.
func TestArchitectureMapMatchesCode(t *testing.T) {
	doc, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	refs := regexp.MustCompile("`([a-z_/]+\\.go)(?:: ([^`]+))?`").FindAllStringSubmatch(string(doc), -1)
	if len(refs) < 20 {
		t.Fatalf("only %d file references found: is the pattern still right?", len(refs))
	}
	for _, ref := range refs {
		path, names := ref[1], ref[2]
		decls := declared(t, path)
		if names == "" {
			continue
		}
		for _, name := range strings.Split(names, ",") {
			name = strings.TrimSpace(name)
			if !decls[name] {
				t.Errorf("ARCHITECTURE.md: %s does not declare %s", path, name)
			}
		}
	}
}

// declared returns the top-level names a Go file declares: functions,
// types, variables and constants, and methods as Type.Method (and by bare
// name).
func declared(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Errorf("ARCHITECTURE.md names %s: %v", path, err)
		return nil
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			out[d.Name.Name] = true
			if d.Recv != nil {
				typ := d.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				switch g := typ.(type) { // a generic type's receiver
				case *ast.IndexExpr:
					typ = g.X
				case *ast.IndexListExpr:
					typ = g.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					out[id.Name+"."+d.Name.Name] = true
				}
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					out[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						out[n.Name] = true
					}
				}
			}
		}
	}
	return out
}
