// Package modproxy writes a Go module proxy, in the file layout GOPROXY's
// file:// scheme reads, holding this repository's modules as they are in a
// working tree at one version: a release checked before it exists
// upstream.
package modproxy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// Modules are the repository's modules, by directory from its root.
var Modules = []string{".", "store/postgres", "cmd", "llm/openai", "llm/anthropic"}

// Build writes the modules found at root (the directories of dirs, each
// holding a go.mod) at version into dir, as a module proxy: for each, its
// list, .info, .mod and .zip (golang.org/x/mod/zip, which leaves out the
// nested modules and what a module zip may not hold). It returns the
// modules' paths.
func Build(root, dir, version string, dirs []string) ([]string, error) {
	var paths []string
	for _, d := range dirs {
		src := filepath.Join(root, d)
		gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
		if err != nil {
			return nil, err
		}
		path := modfile.ModulePath(gomod)
		if path == "" {
			return nil, fmt.Errorf("modproxy: %s/go.mod names no module", d)
		}
		esc, err := module.EscapePath(path)
		if err != nil {
			return nil, err
		}
		at := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			return nil, err
		}
		info, _ := json.Marshal(struct {
			Version string
			Time    time.Time
		}{version, time.Now().UTC().Truncate(time.Second)})
		files := map[string][]byte{"list": []byte(version + "\n"), version + ".info": info, version + ".mod": gomod}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
				return nil, err
			}
		}
		f, err := os.Create(filepath.Join(at, version+".zip"))
		if err != nil {
			return nil, err
		}
		err = zip.CreateFromDir(f, module.Version{Path: path, Version: version}, src)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("modproxy: zip %s: %w", path, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// URL is dir as a GOPROXY entry.
func URL(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	return "file://" + filepath.ToSlash(strings.TrimSuffix(abs, string(filepath.Separator)))
}
