package runcue_test

import (
	"bytes"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The root package holds the user's vocabulary; the engine is in
// internal/engine, reached through three adapter files, and the SQLite
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
// adapter (configuration, registry, the engine's reports in the public
// types), the local Runner and the remote one (executors').
var adapterFiles = map[string]bool{"adapter.go": true, "runner.go": true, "remote.go": true}

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
