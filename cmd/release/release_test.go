// Package release checks the repository as a user outside it meets it: its
// modules, at the version being released, from a module proxy made of the
// working tree.
package release_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/cmd/internal/modproxy"
)

// version is the release the modules are checked at.
const version = "v0.1.0"

// TestOutsideConsumer: a module outside the tree requires runcue,
// store/postgres, cmd and the LLM SDK adapters (llm/openai, llm/anthropic)
// at the release's version, fetched from a local
// module proxy made of this working tree (no replace, no workspace, as a
// user's go get would): it builds, runs the quickstart, opens a PostgreSQL
// store (RUNCUE_TEST_POSTGRES; skipped without it unless CI=true), embeds
// the CLI, and go install of the runcue command works.
func TestOutsideConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the outside consumer builds the modules from a module proxy (about a minute)")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	proxy := t.TempDir()
	paths, err := modproxy.Build(root, proxy, version, modproxy.Modules)
	require.NoError(t, err)
	require.Equal(t, []string{"github.com/runcue/runcue", "github.com/runcue/runcue/store/postgres", "github.com/runcue/runcue/cmd",
		"github.com/runcue/runcue/llm/openai", "github.com/runcue/runcue/llm/anthropic"}, paths)
	for _, dir := range modproxy.Modules {
		b, err := os.ReadFile(filepath.Join(root, dir, "go.mod"))
		require.NoError(t, err)
		require.NotContains(t, string(b), "\nreplace ", "%s/go.mod has a replace: Go ignores it in a dependency, and go install refuses it", dir)
	}

	consumer := t.TempDir()
	write := func(name, content string) {
		p := filepath.Join(consumer, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	write("go.mod", "module example.com/consumer\n\ngo 1.26.0\n\nrequire (\n"+
		"\tgithub.com/runcue/runcue "+version+"\n\tgithub.com/runcue/runcue/store/postgres "+version+"\n\tgithub.com/runcue/runcue/cmd "+version+
		"\n\tgithub.com/runcue/runcue/llm/openai "+version+"\n\tgithub.com/runcue/runcue/llm/anthropic "+version+"\n)\n")
	quickstart, err := os.ReadFile(filepath.Join(root, "examples/quickstart/main.go"))
	require.NoError(t, err)
	write("quickstart/main.go", string(quickstart))
	write("pgopen/main.go", pgopen)
	write("ops/main.go", ops)
	write("sdks/main.go", sdks)

	modcache, gobin := t.TempDir(), t.TempDir()
	base := os.Getenv("GOPROXY")
	if base == "" || base == "off" {
		base = "https://proxy.golang.org,direct"
	}
	cached := filepath.Join(goEnv(t, "GOMODCACHE"), "cache", "download")
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -buildvcs=false", "GONOSUMDB=github.com/runcue",
		"GOPROXY="+modproxy.URL(proxy)+","+modproxy.URL(cached)+","+base,
		"GOMODCACHE="+modcache, "GOBIN="+gobin)
	t.Cleanup(func() {
		// The module cache's files are read-only.
		_ = exec.Command("chmod", "-R", "u+w", modcache).Run()
	})
	run := func(dir string, extra []string, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(append([]string{}, env...), extra...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Run(), "%s %s:\n%s", name, strings.Join(args, " "), out.String())
		return out.String()
	}
	run(consumer, nil, "go", "mod", "tidy")
	run(consumer, nil, "go", "build", "./quickstart", "./pgopen", "./ops")
	// The SDK adapters' modules resolve, with every package they import
	// (building them would compile the SDKs, over a minute on the CI
	// machine; their own modules' tests compile and run them).
	out := run(consumer, nil, "go", "list", "-deps", "./sdks")
	require.Contains(t, out, "github.com/runcue/runcue/llm/openai\n", out)
	require.Contains(t, out, "github.com/runcue/runcue/llm/anthropic\n", out)
	out = run(consumer, nil, "go", "run", "./quickstart", "-n", "3")
	// Its model API fails a fifth of the calls: a unit fails all three
	// attempts once in 125. Every unit ends, completed or failed.
	m := regexp.MustCompile(`3 units: (\d) completed, (\d) failed`).FindStringSubmatch(out)
	require.NotNil(t, m, "the quickstart ran:\n%s", out)
	require.Equal(t, 3, int(m[1][0]-'0')+int(m[2][0]-'0'), "the quickstart ran:\n%s", out)
	if url := os.Getenv("RUNCUE_TEST_POSTGRES"); url != "" {
		out := run(consumer, nil, "go", "run", "./pgopen", url)
		require.Contains(t, out, "completed", out)
	} else if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and RUNCUE_TEST_POSTGRES is not set: scripts/test runs under scripts/with-postgres")
	} else {
		t.Log("SKIP (part): RUNCUE_TEST_POSTGRES is not set: the PostgreSQL store was not opened")
	}
	out = run(consumer, nil, "go", "run", "./ops", "version")
	require.Contains(t, out, "runcue", out)
	run(t.TempDir(), nil, "go", "install", "github.com/runcue/runcue/cmd/runcue@"+version)
	out = run(t.TempDir(), nil, filepath.Join(gobin, "runcue"), "version")
	require.Contains(t, out, "runcue", out)
}

func goEnv(t *testing.T, name string) string {
	out, err := exec.Command("go", "env", name).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// pgopen opens a PostgreSQL store at the URL it is given (in a schema of
// its own), runs one unit and prints its state.
const pgopen = `package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/postgres"
)

func main() {
	ctx := context.Background()
	schema := fmt.Sprintf("consumer_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(ctx, os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	defer conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	u, err := url.Parse(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	st, err := postgres.Open(ctx, u.String(), postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Task("hello", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return "hi", nil }}); err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	s, err := c.Submit(ctx, runcue.Submission{Task: "hello"})
	if err != nil {
		log.Fatal(err)
	}
	w, err := c.Wait(ctx, s.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(w.State)
}
`

// ops embeds the CLI, as an application with its handlers does.
const ops = `package main

import (
	"os"

	"github.com/runcue/runcue/cmd/runcuecli"
)

func main() { os.Exit(runcuecli.Main(runcuecli.Options{Name: "ops"}, os.Args[1:])) }
`

// sdks makes an OpenAI and an Anthropic client with runcue's adapters (it
// is resolved, not built nor run).
const sdks = `package main

import (
	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"

	runcueanthropic "github.com/runcue/runcue/llm/anthropic"
	runcueopenai "github.com/runcue/runcue/llm/openai"
)

func main() {
	_ = openai.NewClient(runcueopenai.Options()...)
	_ = anthropic.NewClient(runcueanthropic.Options()...)
}
`
