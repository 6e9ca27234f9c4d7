package runcue_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The root package holds the user's vocabulary; the engine is in
// internal/engine, reached through the adapter (and cue.go), and the SQLite
// backend only through Open's file. These are the numbers the Engine
// issue set, checked on every run.
const (
	// machineryShare is the most of the root's non-test lines the files
	// that know the engine (adapterFiles) may hold.
	machineryShare = 0.25
	// maxFileLines bounds every non-test Go file of the library (the root
	// module, not cmd/).
	maxFileLines = 600
)

// adapterFiles are the root files that may import internal/engine: the
// adapter (the engine's configuration and registry, its reports as JSON)
// and cue.go. The runners (internal/local, internal/remote) and the
// executor's loop (internal/execloop) are internal packages.
var adapterFiles = map[string]bool{"adapter.go": true, "cue.go": true}

// TestRootImports: only the adapter files import internal/engine, only the
// file that declares Open imports store/sqlite, and the machinery (the
// adapter files) is at most machineryShare of the root's non-test lines.
func TestRootImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var total, machinery int
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		lines := bytes.Count(src, []byte("\n"))
		total += lines
		if adapterFiles[name] {
			machinery += lines
		}
		declaresOpen := bytes.Contains(src, []byte("\nfunc Open("))
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case path == "github.com/runcue/runcue/internal/engine" && !adapterFiles[name]:
				t.Errorf("%s imports internal/engine: only the adapter files may", name)
			case path == "github.com/runcue/runcue/store/sqlite" && !declaresOpen:
				t.Errorf("%s imports store/sqlite: only Open's file may", name)
			}
		}
	}
	if runners := rootRunners(t); len(runners) > 0 {
		t.Errorf("the root declares runner or executor methods %v: they belong in internal/local, internal/remote or internal/execloop", runners)
	}
	share := float64(machinery) / float64(total)
	t.Logf("the root: %d non-test lines, of which %d (%.1f%%) in %v", total, machinery, 100*share, adapterFiles)
	if share > machineryShare {
		t.Errorf("the adapter files hold %.1f%% of the root's non-test lines, more than %.0f%%", 100*share, 100*machineryShare)
	}
}

// TestFileSizes: no non-test Go file of the library (the root module, not
// cmd/ nor testdata) has more than maxFileLines lines.
func TestFileSizes(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == "cmd" || d.Name() == "testdata" || (path != "." && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != "." {
				return filepath.SkipDir // a module of its own
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := bytes.Count(src, []byte("\n")); n > maxFileLines {
			t.Errorf("%s has %d lines, more than %d", path, n, maxFileLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// exportedDecls lists the exported types (not aliases) and constants that
// the non-test files of the package in dir declare, with their files.
func exportedDecls(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, f := range parseLibrary(t, dir) {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || (g.Tok != token.TYPE && g.Tok != token.CONST) {
				continue
			}
			for _, s := range g.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() && !s.Assign.IsValid() {
						out[s.Name.Name] = filepath.Base(name)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							out[n.Name] = filepath.Base(name)
						}
					}
				}
			}
		}
	}
	return out
}

// TestOneVocabulary: no exported type or constant is declared both in the
// root and in an internal package. What the engine and the API share is
// declared once, in runcuetype, and the root names it with aliases.
func TestOneVocabulary(t *testing.T) {
	root := exportedDecls(t, ".")
	dirs, err := filepath.Glob("internal/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		decls := exportedDecls(t, dir)
		names := make([]string, 0, len(decls))
		for name := range decls {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if file, ok := root[name]; ok {
				t.Errorf("%s is declared in the root (%s) and in %s (%s)", name, file, dir, decls[name])
			}
		}
	}
}

// TestLeafImports: runcuetype, the shared vocabulary, imports only the
// standard library and package store (its tests may import more), so that every package may use it.
func TestLeafImports(t *testing.T) {
	files, err := filepath.Glob("runcuetype/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("runcuetype: %v (%d files)", err, len(files))
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(path, ".") && path != "github.com/runcue/runcue/store" {
				t.Errorf("%s imports %s: runcuetype may import only the standard library and store", name, path)
			}
		}
	}
}

// rootRunners lists the root's methods that make a type an engine.Runner
// (Launch) or run an executor's loop (poll, execute): none should remain.
func rootRunners(t *testing.T) []string {
	t.Helper()
	var out []string
	for name, f := range parseLibrary(t, ".") {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil {
				switch fd.Name.Name {
				case "Launch", "execute", "poll":
					out = append(out, name+": "+fd.Name.Name)
				}
			}
		}
	}
	return out
}

// parseLibrary parses the non-test Go files of dir, by name.
func parseLibrary(t *testing.T, dir string) map[string]*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]*ast.File, len(names))
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = f
	}
	return out
}
