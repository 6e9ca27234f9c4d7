package store

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// minSharedRun is the shortest run of identical lines TestBackendsShare
// refuses between the two backends.
const minSharedRun = 6

// TestBackendsShare: what the SQLite and PostgreSQL backends do alike is
// written once (in package store, or store/internal/sqlrows), not copied.
// No run of minSharedRun or more identical lines (spaces aside), at least
// three of them code (not blank, a lone bracket, a comment or a
// method's signature), stands in a
// non-test file of each. Left out: the import blocks, and the event-log
// reads (read_events.go of each), which the PostgreSQL throughput issue
// redesigns.
func TestBackendsShare(t *testing.T) {
	sqlite := backendFiles(t, "sqlite")
	postgres := backendFiles(t, "postgres")
	var found []string
	for a, la := range sqlite {
		for b, lb := range postgres {
			if filepath.Base(a) == "read_events.go" && filepath.Base(b) == "read_events.go" {
				continue
			}
			for _, r := range sharedRuns(la, lb) {
				found = append(found, fmt.Sprintf("%s:%d-%d ~ %s:%d-%d", a, r[0]+1, r[0]+r[2], b, r[1]+1, r[1]+r[2]))
			}
		}
	}
	sort.Strings(found)
	for _, f := range found {
		t.Errorf("shared run: %s", f)
	}
}

// backendFiles reads the non-test Go files of dir: each line trimmed, the
// import block's lines blank.
func backendFiles(t *testing.T, dir string) map[string][]string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(names) == 0 {
		t.Fatalf("%s: %v (%d files)", dir, err, len(names))
	}
	out := map[string][]string{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		inImport := false
		for i, l := range lines {
			l = strings.TrimSpace(l)
			switch {
			case l == "import (":
				inImport, l = true, ""
			case inImport && l == ")":
				inImport, l = false, ""
			case inImport || strings.HasPrefix(l, "import "):
				l = ""
			}
			lines[i] = l
		}
		out[name] = lines
	}
	return out
}

// codeLine reports whether l carries code. A method's signature does not
// count: the interfaces both implement (store.Store, store.Tx) fix them.
func codeLine(l string) bool {
	switch l {
	case "", "}", ")", "{", "})", "},", "}()":
		return false
	}
	return !strings.HasPrefix(l, "//") && !strings.HasPrefix(l, "func (")
}

// sharedRuns returns the maximal runs of identical lines of a and b (start
// in a, start in b, length) of at least minSharedRun lines, three of them
// code.
func sharedRuns(a, b []string) [][3]int {
	at := map[string][]int{}
	for j, l := range b {
		at[l] = append(at[l], j)
	}
	var out [][3]int
	for i, l := range a {
		for _, j := range at[l] {
			if i > 0 && j > 0 && a[i-1] == b[j-1] {
				continue // inside a run that starts earlier
			}
			n, code := 0, 0
			for i+n < len(a) && j+n < len(b) && a[i+n] == b[j+n] {
				if codeLine(a[i+n]) {
					code++
				}
				n++
			}
			if n >= minSharedRun && code >= 3 {
				out = append(out, [3]int{i, j, n})
			}
		}
	}
	return out
}
