package release_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The user's documentation: README.md, CHANGELOG.md, ARCHITECTURE.md and
// docs/, kept true by the tests below.
func docFiles(t *testing.T) []string {
	root := repoRoot(t)
	files := []string{"README.md", "CHANGELOG.md", "ARCHITECTURE.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, f := range more {
		rel, _ := filepath.Rel(root, f)
		files = append(files, rel)
	}
	return files
}

func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	return root
}

func read(t *testing.T, rel string) string {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	require.NoError(t, err)
	return string(b)
}

// TestDocLinks: every relative link of the documentation resolves to a
// file of the repository (an anchor is not checked).
func TestDocLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range docFiles(t) {
		for _, m := range link.FindAllStringSubmatch(read(t, f), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			p := filepath.Join(repoRoot(t), filepath.Dir(f), filepath.FromSlash(target))
			_, err := os.Stat(p)
			assert.NoError(t, err, "%s links to %s, which does not exist", f, m[1])
		}
	}
}

// TestNoCommitHashes: the documentation names no commit (a 7-12
// character hex word with a letter that git knows as a commit): figures
// and attempts belong in commit messages, not in a user's guide.
func TestNoCommitHashes(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("SKIP: no git")
	}
	hexWord := regexp.MustCompile(`\b[0-9a-f]{7,12}\b`)
	letter := regexp.MustCompile(`[a-f]`)
	for _, f := range docFiles(t) {
		for _, w := range hexWord.FindAllString(read(t, f), -1) {
			if !letter.MatchString(w) {
				continue
			}
			cmd := exec.Command("git", "cat-file", "-e", w+"^{commit}")
			cmd.Dir = repoRoot(t)
			if cmd.Run() == nil {
				t.Errorf("%s names commit %s", f, w)
			}
		}
	}
}

// TestLayoutTables: every file or directory a layout table names (a
// backticked path in the first column of a table under a heading with
// "Layout" in it) exists.
func TestLayoutTables(t *testing.T) {
	path := regexp.MustCompile("^\\|\\s*`([^`]+)`")
	for _, f := range docFiles(t) {
		in := false
		sc := bufio.NewScanner(strings.NewReader(read(t, f)))
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") {
				in = strings.Contains(strings.ToLower(line), "layout")
				continue
			}
			if !in {
				continue
			}
			if m := path.FindStringSubmatch(line); m != nil {
				for _, p := range strings.Split(m[1], ", ") {
					p = strings.TrimSuffix(strings.TrimSpace(p), "/")
					if strings.ContainsAny(p, "*{") {
						matches, _ := filepath.Glob(filepath.Join(repoRoot(t), p))
						assert.NotEmpty(t, matches, "%s's layout names %s, which matches nothing", f, p)
						continue
					}
					_, err := os.Stat(filepath.Join(repoRoot(t), p))
					assert.NoError(t, err, "%s's layout names %s, which does not exist", f, p)
				}
			}
		}
	}
}

// TestDocSnippetsCompile: every ```go block of the documentation compiles:
// a block of declarations as a file, a block of statements as the body of
// a function, each in a package of its own with the names the guide
// leaves to the reader (snippetPrelude: a Cue, a context, the user's
// types and calls). Imports are added for the packages a block names.
func TestDocSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the snippets are compiled by go build")
	}
	block := regexp.MustCompile("(?s)```go\\n(.*?)```")
	dir, err := os.MkdirTemp("testdata", "snippets-")
	if os.IsNotExist(err) {
		require.NoError(t, os.Mkdir("testdata", 0o755))
		t.Cleanup(func() { os.Remove("testdata") })
		dir, err = os.MkdirTemp("testdata", "snippets-")
	}
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	var pkgs []string
	origin := map[string]string{}
	for _, f := range docFiles(t) {
		for i, m := range block.FindAllStringSubmatch(read(t, f), -1) {
			name := fmt.Sprintf("s%02d_%d", len(pkgs), i)
			pkg := filepath.Join(dir, name)
			require.NoError(t, os.Mkdir(pkg, 0o755))
			src, err := snippetFile(m[1])
			require.NoError(t, err, "%s, Go block %d", f, i+1)
			require.NoError(t, os.WriteFile(filepath.Join(pkg, "snippet.go"), []byte(src), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(pkg, "prelude.go"), []byte(withImports(snippetPrelude)), 0o644))
			pkgs = append(pkgs, "./"+filepath.ToSlash(pkg))
			origin[name] = fmt.Sprintf("%s, Go block %d", f, i+1)
		}
	}
	require.NotEmpty(t, pkgs)
	cmd := exec.Command("go", append([]string{"build"}, pkgs...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := out.String()
		for name, where := range origin {
			msg = strings.ReplaceAll(msg, name+"/", "["+where+"] ")
		}
		t.Fatalf("documentation snippets do not compile:\n%s", msg)
	}
}

// snippetFile makes a Go file of a documentation block: declarations as
// they are, statements as the body of a function (each variable they
// declare used once after them, as a reader's code would go on).
func snippetFile(block string) (string, error) {
	fset := token.NewFileSet()
	if _, err := parser.ParseFile(fset, "", "package snippet\n"+block, 0); err == nil {
		return withImports("package snippet\n\n" + block), nil
	}
	body := "package snippet\n\nfunc _() {\n" + block + "\n}\n"
	f, err := parser.ParseFile(fset, "", body, 0)
	if err != nil {
		return "", err
	}
	var declared []string
	seen := map[string]bool{}
	fn := f.Decls[0].(*ast.FuncDecl)
	for _, st := range fn.Body.List {
		if as, ok := st.(*ast.AssignStmt); ok && as.Tok == token.DEFINE {
			for _, l := range as.Lhs {
				if id, ok := l.(*ast.Ident); ok && id.Name != "_" && !seen[id.Name] {
					seen[id.Name] = true
					declared = append(declared, id.Name)
				}
			}
		}
	}
	uses := ""
	for _, d := range declared {
		uses += "\t_ = " + d + "\n"
	}
	return withImports("package snippet\n\nfunc _() {\n" + block + "\n" + uses + "}\n"), nil
}

// knownImports are the packages a documentation block may name, by the
// name it uses.
var knownImports = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "log": "log", "slog": "log/slog", "http": "net/http",
	"os": "os", "time": "time", "json": "encoding/json", "runcue": "github.com/runcue/runcue",
	"httplimit": "github.com/runcue/runcue/httplimit", "sse": "github.com/runcue/runcue/sse",
	"dashboard": "github.com/runcue/runcue/dashboard", "postgres": "github.com/runcue/runcue/store/postgres",
	"sqlite": "github.com/runcue/runcue/store/sqlite", "proc": "github.com/runcue/runcue/proc",
	"runcuecli": "github.com/runcue/runcue/cmd/runcuecli",
}

// withImports adds to src (a file without imports) the imports of the
// known packages it names.
func withImports(src string) string {
	var names []string
	for name := range knownImports {
		if regexp.MustCompile(`\b` + name + `\.[A-Z]`).MatchString(src) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return src
	}
	sort.Strings(names)
	imports := "import (\n"
	for _, n := range names {
		p := knownImports[n]
		if filepath.Base(p) == n {
			imports += fmt.Sprintf("\t%q\n", p)
		} else {
			imports += fmt.Sprintf("\t%s %q\n", n, p)
		}
	}
	imports += ")\n"
	pkg, rest, _ := strings.Cut(src, "\n")
	return pkg + "\n\n" + imports + rest
}

// snippetPrelude declares what the guide's blocks leave to the reader.
const snippetPrelude = `package snippet

var (
	cue, c, q    *runcue.Cue
	ctx          context.Context
	mux          *http.ServeMux
	st           *postgres.Store
	lastSeen     int64
	isAdmin      bool
	pacific      *time.Location
	summarize    runcue.Handler
	transcode    runcue.Handler
	complete     runcue.Handler
)

type Doc struct{ URL string }
type Summary struct{ Text string }
type Question struct{ Text string; InputTokens, MaxTokens int64 }
type Answer struct{ Text string }

// claudeBody is a model's answer as the guide's examples read it.
type claudeBody struct {
	InputTokens, OutputTokens int64
	Answer                    Answer
}

func callTheModel(context.Context, Doc) (Summary, error)                           { return Summary{}, nil }
func callClaude(context.Context, Question) (*http.Response, claudeBody, error)     { return nil, claudeBody{}, nil }
func hostOf(target string) string                                                   { return target }
func checkLogin(*http.Request) error                                               { return nil }
func requireLogin(h http.Handler) http.Handler                                     { return h }
func perHost(w *runcue.Work) []string                                               { return nil }
func parsePDF(ctx context.Context, w *runcue.Work) (any, error)                    { return nil, nil }
`

// TestChangelogForm: CHANGELOG.md is by release in the Keep a Changelog
// form: "Unreleased" first, then versions with their dates, newest first,
// and under each only the headings Added, Changed, Deprecated, Removed,
// Fixed and Security.
func TestChangelogForm(t *testing.T) {
	release := regexp.MustCompile(`^## \[(Unreleased|\d+\.\d+\.\d+)\]( - \d{4}-\d{2}-\d{2})?$`)
	allowed := map[string]bool{"Added": true, "Changed": true, "Deprecated": true, "Removed": true, "Fixed": true, "Security": true}
	var releases []string
	sc := bufio.NewScanner(strings.NewReader(read(t, "CHANGELOG.md")))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			m := release.FindStringSubmatch(line)
			require.NotNil(t, m, "a release heading: %q", line)
			if m[1] != "Unreleased" {
				assert.NotEmpty(t, m[2], "%s has its date", m[1])
			}
			releases = append(releases, m[1])
		case strings.HasPrefix(line, "### "):
			assert.True(t, allowed[strings.TrimPrefix(line, "### ")], "only Keep a Changelog's headings: %q", line)
		case strings.HasPrefix(line, "#### "):
			t.Errorf("no deeper headings: %q", line)
		}
	}
	require.NotEmpty(t, releases)
	assert.Equal(t, "Unreleased", releases[0])
	assert.Contains(t, releases, "0.1.0")
}

// TestPackageDoc: the root package's documentation says in its first
// paragraph that it runs on SQLite and PostgreSQL, with executors and
// meters.
func TestPackageDoc(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "doc.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "doc.go", b, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	require.NotNil(t, f.Doc)
	first, _, _ := strings.Cut(f.Doc.Text(), "\n\n")
	for _, word := range []string{"SQLite", "PostgreSQL", "executors", "meters"} {
		assert.Contains(t, first, word, "the first paragraph of the package's doc")
	}
}

// TestLLMRecipesSetMargin: every documented service that a handler calls
// over the internet (its block reports the provider's headers with
// httplimit.Report) sets a Margin that fits real HTTPS, at least 100 ms:
// the default, 10 ms, is for a service on the same network, and start to
// arrival reached 10.9 ms even on loopback.
func TestLLMRecipesSetMargin(t *testing.T) {
	block := regexp.MustCompile("(?s)```go\\n(.*?)```")
	service := regexp.MustCompile(`(?s)runcue\.Service\{(.*?)\}\)`)
	margin := regexp.MustCompile(`Margin:\s*(\d+)\s*\*\s*time\.(Millisecond|Second)`)
	checked := 0
	for _, f := range []string{"README.md", "docs/llm.md"} {
		for i, m := range block.FindAllStringSubmatch(read(t, f), -1) {
			if !strings.Contains(m[1], "httplimit.Report") {
				continue
			}
			for _, s := range service.FindAllStringSubmatch(m[1], -1) {
				if !strings.Contains(s[1], "RateLimit") && !strings.Contains(s[1], "Meters") {
					continue
				}
				checked++
				mm := margin.FindStringSubmatch(s[1])
				if !assert.NotNil(t, mm, "%s, Go block %d: a service called over HTTPS sets its Margin", f, i+1) {
					continue
				}
				n, err := strconv.Atoi(mm[1])
				require.NoError(t, err)
				d := time.Duration(n) * time.Millisecond
				if mm[2] == "Second" {
					d = time.Duration(n) * time.Second
				}
				assert.GreaterOrEqual(t, d, 100*time.Millisecond, "%s, Go block %d: Margin %v", f, i+1, d)
			}
		}
	}
	assert.GreaterOrEqual(t, checked, 2, "the recipes of README.md and docs/llm.md")
}
