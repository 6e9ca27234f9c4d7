package runcuecli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/cmd/runcuecli"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// bin is the runcue command, built once for the tests.
var bin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "runcue-cli")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	bin = filepath.Join(dir, "runcue")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/runcue/runcue/cmd/runcue").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build runcue: %v\n%s", err, out)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// run runs the built command on db and returns its stdout, stderr and
// exit code.
func run(t *testing.T, db string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "RUNCUE_DB="+db)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return stdout.String(), stderr.String(), code
}

// ok runs the command and requires exit code 0.
func ok(t *testing.T, db string, args ...string) string {
	t.Helper()
	out, errOut, code := run(t, db, args...)
	require.Zero(t, code, "runcue %v: %s", args, errOut)
	return out
}

var (
	timeRE     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	durationRE = regexp.MustCompile(`\b\d+(\.\d+)?(ns|µs|ms|s)\b`)
)

// golden compares out, its times and durations normalised, with
// testdata/name (rewritten with -update).
func golden(t *testing.T, name, out string) {
	t.Helper()
	out = timeRE.ReplaceAllString(out, "<TIME>")
	out = durationRE.ReplaceAllString(out, "<DURATION>")
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(out), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create %s", path)
	assert.Equal(t, string(want), out, "golden %s (run with -update to accept)", name)
}

// newDB makes a database with the test's tasks registered.
func newDB(t *testing.T) (string, *runcue.Cue) {
	t.Helper()
	db := filepath.Join(t.TempDir(), "work.db")
	c, err := runcue.Open(db, runcue.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return db, c
}

// The commands a user starts with, in both output formats, against golden
// files: enqueue, show, explain, list, stats, and the exit codes.
func TestCommandsGolden(t *testing.T) {
	db, c := newDB(t)
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 2, RateLimit: 10, RateWindow: time.Minute}))
	require.NoError(t, c.Task("fetch", runcue.Task{Services: []string{"api"}, Handler: func(context.Context, *runcue.Work) (any, error) {
		return nil, nil
	}}))
	ok(t, db, "pause")
	golden(t, "enqueue.txt", ok(t, db, "enqueue", "fetch", "--id", "u-1", "--target", "https://example.org/a", "--params", `{"n":1}`))
	golden(t, "enqueue.json", ok(t, db, "enqueue", "fetch", "--id", "u-2", "--key", "k-2", "-o", "json"))
	golden(t, "enqueue-duplicate.txt", ok(t, db, "enqueue", "fetch", "--key", "k-2"))
	golden(t, "show.txt", ok(t, db, "show", "u-1"))
	golden(t, "show.json", ok(t, db, "show", "u-1", "-o", "json"))
	golden(t, "explain.txt", ok(t, db, "explain", "u-1"))
	golden(t, "list.txt", ok(t, db, "list"))
	golden(t, "list.json", ok(t, db, "list", "--target-prefix", "https://example.org/", "-o", "json"))
	golden(t, "stats.txt", ok(t, db, "stats"))
	golden(t, "service-ls.txt", ok(t, db, "service", "ls"))

	_, errOut, code := run(t, db, "show", "nope")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `no unit "nope" in this database`)
	_, errOut, code = run(t, db, "show")
	assert.Equal(t, 2, code, errOut)
	_, errOut, code = run(t, db, "list", "--bogus")
	assert.Equal(t, 2, code, errOut)
	_, errOut, code = run(t, db, "frobnicate")
	assert.Equal(t, 2, code, errOut)
	_, errOut, code = run(t, "", "stats")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "RUNCUE_DB")
	out := ok(t, db, "version")
	assert.True(t, strings.HasPrefix(out, "runcue "), out)
}

// Importing a 10,000-line file twice, with some keys held by failed units:
// the second run stores nothing new, reports each line, and exits 0.
func TestImportTwice(t *testing.T) {
	db, c := newDB(t)
	require.NoError(t, c.Task("fetch", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Target == "bad" {
				return nil, errors.New("gone")
			}
			return nil, nil
		}}))
	ctx := t.Context()
	require.NoError(t, c.Start(ctx))
	for i := range 5 {
		s, err := c.Submit(ctx, runcue.Submission{Task: "fetch", Target: "bad", IdempotencyKey: fmt.Sprintf("k-%d", i*1000)})
		require.NoError(t, err)
		_, err = c.Wait(ctx, s.ID)
		require.NoError(t, err)
	}
	require.NoError(t, c.PauseQueue(ctx)) // the owner stays, running nothing

	var b strings.Builder
	for i := range 10000 {
		fmt.Fprintf(&b, `{"task":"fetch","target":"https://example.org/%d","idempotency_key":"k-%d","params":{"i":%d}}`+"\n", i, i, i)
	}
	b.WriteString("not json\n")
	file := filepath.Join(t.TempDir(), "units.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(b.String()), 0o644))

	type result struct {
		New, Duplicate, Refused int
		Items                   []struct {
			Line   int
			Status string
			Error  string
		}
	}
	imp := func() result {
		var r result
		out, errOut, code := run(t, db, "import", file, "-o", "json")
		assert.Equal(t, 1, code, "lines were refused")
		assert.Contains(t, errOut, "6 of 10001 lines refused")
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		return r
	}
	first := imp()
	assert.Equal(t, 9995, first.New)
	assert.Equal(t, 6, first.Refused, "5 keys of failed units and a line that is not JSON")
	s, err := c.Stats(ctx)
	require.NoError(t, err)
	queued := s.States[runcue.StateQueued]
	assert.Equal(t, 9995, queued)

	second := imp()
	assert.Zero(t, second.New, "nothing new the second time")
	assert.Equal(t, 9995, second.Duplicate)
	assert.Equal(t, 6, second.Refused)
	require.Len(t, second.Items, 10001, "one outcome per line")
	assert.Equal(t, 10001, second.Items[10000].Line)
	assert.Contains(t, second.Items[0].Error, "idempotency key", "k-0 belongs to a failed unit")
	s, err = c.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, queued, s.States[runcue.StateQueued])
	out, _, _ := run(t, db, "import", file)
	golden(t, "import-again.txt", strings.SplitN(out, "\n", 3)[0]+"\n")
}

// An import may name in depends_on any line of the file, before or after
// it; a line that is not UTF-8 or whose run_at no store can hold is
// refused, and so is a line that depends on a refused one; the exit code
// says whether any line was refused.
func TestImportOrderAndRefusals(t *testing.T) {
	db, c := newDB(t)
	require.NoError(t, c.Task("fetch", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) { return nil, nil }}))
	file := filepath.Join(t.TempDir(), "units.jsonl")
	write := func(lines ...string) {
		require.NoError(t, os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	}
	write(`{"task":"fetch","id":"report","depends_on":["page-1","page-2"]}`,
		`{"task":"fetch","id":"page-2","depends_on":["split"]}`,
		`{"task":"fetch","id":"page-1","depends_on":["split"]}`,
		`{"task":"fetch","id":"split"}`)
	out, errOut, code := run(t, db, "import", file)
	assert.Zero(t, code, errOut)
	assert.Equal(t, "4 new, 0 duplicate, 0 refused\n", out)
	report, err := c.Get(t.Context(), "report")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"page-1", "page-2"}, report.DependsOn)

	write(`{"task":"fetch","id":"late","run_at":"9999-01-01T00:00:00Z"}`,
		`{"task":"fetch","id":"after-late","depends_on":["late"]}`,
		"{\"task\":\"fetch\",\"id\":\"caf\xe9\"}",
		`{"task":"fetch","id":"fine"}`)
	out, errOut, code = run(t, db, "import", file)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "3 of 4 lines refused")
	assert.Contains(t, out, "1 new, 0 duplicate, 3 refused\n")
	assert.Contains(t, out, "RunAt 9999-01-01T00:00:00Z is outside the times a store represents")
	assert.Contains(t, out, "line 2  refused  depends on late (line 1), which was refused")
	assert.Contains(t, out, "line 3  refused  not valid UTF-8")
	_, err = c.Get(t.Context(), "fine")
	require.NoError(t, err)
}

// While an owner runs in this process: pausing one keyed instance with the
// command holds its units once the owner applied it, while another
// instance's units run; explain says so and names the instance; stats and
// cancel by filter work alongside.
func TestPauseKeyedInstanceWhileOwnerRuns(t *testing.T) {
	db, c := newDB(t)
	started := make(chan string, 100)
	release := make(chan struct{})
	require.NoError(t, c.Service("host", runcue.Service{}))
	require.NoError(t, c.Task("fetch", runcue.Task{
		ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			started <- w.Target
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, nil
		}}))
	ctx := t.Context()
	events, stop, err := c.Subscribe(ctx, runcue.SubscribeOptions{After: runcue.SeqNow, Types: []runcue.EventType{runcue.EventServiceChanged}})
	require.NoError(t, err)
	defer stop()
	require.NoError(t, c.Start(ctx))

	ok(t, db, "service", "pause", "host:a.example")
	select {
	case ev := <-events:
		assert.Equal(t, "host:a.example", ev.Service.Name)
	case <-time.After(30 * time.Second):
		t.Fatal("no service_changed event")
	}
	// The owner read the change at its poll: wait until its live status shows it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := c.ServiceStatus(ctx, "host")
		require.NoError(t, err)
		if st.PausedKeys == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the owner never applied the pause")
	}
	a, err := c.Submit(ctx, runcue.Submission{Task: "fetch", Target: "a.example"})
	require.NoError(t, err)
	_, err = c.Submit(ctx, runcue.Submission{Task: "fetch", Target: "b.example"})
	require.NoError(t, err)
	select {
	case target := <-started:
		assert.Equal(t, "b.example", target)
	case <-time.After(30 * time.Second):
		t.Fatal("b.example never started")
	}
	var ex runcue.Explanation
	require.NoError(t, json.Unmarshal([]byte(ok(t, db, "explain", a.ID, "-o", "json")), &ex))
	require.NotEmpty(t, ex.Reasons)
	assert.Equal(t, runcue.ReasonPaused, ex.Reasons[0].Kind)
	assert.Equal(t, "host:a.example", ex.Reasons[0].Service)
	assert.True(t, ex.Live, "the owner answered from its live state, through the log")
	select {
	case target := <-started:
		t.Fatalf("%s started under a pause", target)
	default:
	}
	var s runcue.Stats
	require.NoError(t, json.Unmarshal([]byte(ok(t, db, "stats", "-o", "json")), &s))
	assert.Equal(t, 1, s.States[runcue.StateQueued])
	assert.Equal(t, 1, s.States[runcue.StateRunning])
	assert.True(t, s.Live, "the owner's live figures, asked through the log")
	require.Len(t, s.Services, 1)
	assert.Equal(t, 0, s.Services[0].Active, "no unit lists the class itself")
	assert.Equal(t, 1, s.Services[0].KeysActive, "a keyed class's instances' load, seen from another process")
	var keys []string
	for _, k := range s.Services[0].Keys {
		keys = append(keys, k.Name)
	}
	assert.Equal(t, []string{"host:b.example", "host:a.example"}, keys, "the running instance first, then the paused one")

	out := ok(t, db, "cancel", "--target-prefix", "a.", "--dry-run")
	assert.Equal(t, "1 would be cancelled (dry run)\n", out)
	ok(t, db, "cancel", "--target-prefix", "a.")
	wi, err := c.Wait(ctx, a.ID)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCancelled, wi.State)
	close(release)
	require.NoError(t, c.Drain(ctx))

	backup := filepath.Join(t.TempDir(), "copy.db")
	ok(t, db, "backup", backup)
	assert.Contains(t, ok(t, backup, "list"), a.ID, "the copy opens with the units")
}

// The embedded tree runs the application's work: run --drain with its
// handlers says what it did when it ends, and stats shows it done.
func TestEmbeddedRunDrain(t *testing.T) {
	db := filepath.Join(t.TempDir(), "app.db")
	open := func(path string) (*runcue.Cue, error) {
		c, err := runcue.Open(path, runcue.Config{})
		if err != nil {
			return nil, err
		}
		if err := c.Task("summarize", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return "ok", nil }}); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	var out, errOut bytes.Buffer
	opts := runcuecli.Options{Name: "queue", Open: open, Stdout: &out, Stderr: &errOut}
	c, err := open(db)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	for i := range 20 {
		require.Zero(t, runcuecli.Main(opts, []string{"--db", db, "enqueue", "summarize", "--id", fmt.Sprint("s-", i)}), errOut.String())
	}
	out.Reset()
	require.Zero(t, runcuecli.Main(opts, []string{"--db", db, "run", "--drain"}), errOut.String())
	assert.Regexp(t, `^ran [0-9.]+m?s: 20 completed, 0 failed, 0 skipped, 0 cancelled; 0 queued, 0 running\n$`, out.String(),
		"a summary, though the output is not a terminal")
	out.Reset()
	require.Zero(t, runcuecli.Main(opts, []string{"--db", db, "stats", "-o", "json"}), errOut.String())
	var s runcue.Stats
	require.NoError(t, json.Unmarshal(out.Bytes(), &s))
	assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 20}, s.States)
	assert.Equal(t, 2, runcuecli.Main(runcuecli.Options{Stdout: &out, Stderr: &errOut}, []string{"--db", db, "run"}),
		"the plain command has no run: it has no handlers")
}

// The remaining commands against one database: service set and show,
// task pause and resume, retry --failed, prune, and tail following events
// until interrupted.
func TestMoreCommands(t *testing.T) {
	db, c := newDB(t)
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 2, Adaptive: &runcue.Adaptive{}}))
	require.NoError(t, c.Task("fetch", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(context.Context, *runcue.Work) (any, error) { return nil, runcue.Overloaded(errors.New("boom")) }}))
	ctx := t.Context()

	ok(t, db, "service", "set", "api", "--rate-limit", "5", "--rate-window", "1m")
	var st runcue.ServiceStatus
	require.NoError(t, json.Unmarshal([]byte(ok(t, db, "service", "show", "api", "-o", "json")), &st))
	assert.Equal(t, runcue.Service{MaxConcurrent: 2, RateLimit: 5, RateWindow: time.Minute, Adaptive: &runcue.Adaptive{}}, st.Limits,
		"the flags given, the rest kept")
	assert.True(t, st.Overridden)
	ok(t, db, "service", "reset", "api")
	ok(t, db, "task", "pause", "fetch")
	var s runcue.Stats
	require.NoError(t, json.Unmarshal([]byte(ok(t, db, "stats", "-o", "json")), &s))
	assert.Equal(t, []string{"fetch"}, s.PausedTasks)
	ok(t, db, "task", "resume", "fetch")
	_, _, code := run(t, db, "task", "pause", "nope")
	assert.Equal(t, 1, code, "an unknown task")

	// tail follows what the owner does, until interrupted.
	tail := exec.Command(bin, "tail", "--after", "0", "--type", "work_failed", "-o", "json")
	tail.Env = append(os.Environ(), "RUNCUE_DB="+db)
	stdout, err := tail.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, tail.Start())
	require.NoError(t, c.Start(ctx))
	sub, err := c.Submit(ctx, runcue.Submission{Task: "fetch", Target: "x"})
	require.NoError(t, err)
	_, err = c.Wait(ctx, sub.ID)
	require.NoError(t, err)
	line := make(chan string, 1)
	go func() {
		b := make([]byte, 4096)
		n, _ := stdout.Read(b)
		line <- string(b[:n])
	}()
	select {
	case l := <-line:
		var ev runcue.Event
		require.NoError(t, json.Unmarshal([]byte(strings.SplitN(l, "\n", 2)[0]), &ev))
		assert.Equal(t, runcue.EventWorkFailed, ev.Type)
		assert.Equal(t, sub.ID, ev.WorkID)
		assert.Equal(t, "x", ev.Target)
	case <-time.After(30 * time.Second):
		t.Fatal("tail printed nothing")
	}
	require.NoError(t, tail.Process.Signal(os.Interrupt))
	require.NoError(t, tail.Wait(), "an interrupt ends tail cleanly")
	assert.Contains(t, ok(t, db, "service", "show", "api"), "effective limit 1 at once (configured 2), lowered after 1 503",
		"the failure was a 503: api's adaptive limit was cut")

	assert.Equal(t, "1 would be requeued (dry run)\n", ok(t, db, "retry", "--failed", "--error", "boom", "--dry-run"))
	_, _, code = run(t, db, "retry", sub.ID, "--failed")
	assert.Equal(t, 2, code, "an ID and --failed")
	_, _, code = run(t, db, "prune")
	assert.Equal(t, 2, code, "prune needs --older-than")
	assert.Equal(t, "0 pruned\n", ok(t, db, "prune", "--older-than", "1h"), "it failed just now")
}

// Tables escape the control characters of what they print: a target with
// an escape sequence would retitle and clear the operator's terminal; a
// newline in a target or an error would forge a row.
func TestTablesEscapeControlCharacters(t *testing.T) {
	db, c := newDB(t)
	require.NoError(t, c.Task("fetch", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			return nil, errors.New("boom\x1b[31m red\u202e")
		}}))
	evil := "\u001b]0;PWNED\u0007\u001b[2J\nu-2  fetch  completed  fake"
	s, err := c.Submit(t.Context(), runcue.Submission{Task: "fetch", Target: evil})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	_, err = c.Wait(t.Context(), s.ID)
	require.NoError(t, err)
	for _, args := range [][]string{{"list"}, {"show", s.ID}} {
		out := ok(t, db, args...)
		assert.NotContains(t, out, "\x1b", "%v", args)
		assert.NotContains(t, out, "\a", "%v", args)
		assert.NotContains(t, out, "\u202e", "%v", args)
		assert.Contains(t, out, `\x1b]0;PWNED\x07\x1b[2J\nu-2  fetch  completed  fake`, "%v", args)
		assert.Contains(t, out, `boom\x1b[31m red\u202e`, "%v", args)
	}
	// The JSON output keeps the values as they are (encoded).
	assert.Contains(t, ok(t, db, "show", s.ID, "-o", "json"), `\u001b]0;PWNED\u0007`)
}

// The executor command runs the program's handlers of the owner's remote
// tasks until interrupted; a poll interval not well inside MaxStartDelay
// is refused; the plain command has no executor.
func TestEmbeddedExecutor(t *testing.T) {
	db := filepath.Join(t.TempDir(), "app.db")
	owner, err := runcue.Open(db, runcue.Config{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	defer owner.Close()
	require.NoError(t, owner.Task("summarize", runcue.Task{Remote: true}))
	ctx := t.Context()
	require.NoError(t, owner.Start(ctx))
	for i := range 10 {
		_, err := owner.Submit(ctx, runcue.Submission{ID: fmt.Sprint("s-", i), Task: "summarize", Target: fmt.Sprint(i)})
		require.NoError(t, err)
	}
	var out, errOut bytes.Buffer
	opts := runcuecli.Options{Name: "queue", Stdout: &out, Stderr: &errOut, Handlers: map[string]runcue.Handler{
		"summarize": func(_ context.Context, w *runcue.Work) (any, error) { return "summary of " + w.Target, nil }}}
	assert.Equal(t, 2, runcuecli.Main(opts, []string{"--db", db, "executor", "--poll", "1s"}), "a poll of half MaxStartDelay")
	assert.Contains(t, errOut.String(), "not well inside MaxStartDelay")
	xctx, stop := context.WithCancel(ctx)
	cmd := runcuecli.New(opts)
	cmd.SetArgs([]string{"--db", db, "executor", "--capacity", "2", "--poll", "10ms", "--id", "cli-1"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(xctx) }()
	for i := range 10 {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		wi, err := owner.Wait(wctx, fmt.Sprint("s-", i))
		cancel()
		require.NoError(t, err)
		assert.JSONEq(t, fmt.Sprintf(`"summary of %d"`, i), string(wi.Result))
	}
	stop()
	require.NoError(t, <-done)
	assert.Contains(t, errOut.String(), "executor cli-1: 1 tasks, capacity 2")
	assert.Equal(t, 2, runcuecli.Main(runcuecli.Options{Stdout: &out, Stderr: &errOut}, []string{"--db", db, "executor"}),
		"the plain command has no executor: it has no handlers")
}

// The schedule commands: ls (table and JSON) shows a schedule's timing and
// next period; pause, resume and delete change it as stored.
func TestScheduleCommands(t *testing.T) {
	db, c := newDB(t)
	require.NoError(t, c.Task("report", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}))
	require.NoError(t, c.Schedule(t.Context(), "nightly", runcue.Schedule{Submission: runcue.Submission{Task: "report"},
		Timing: runcue.Timing{Cron: "30 2 * * *", Zone: "Europe/Berlin"}}))
	table := ok(t, db, "schedule", "ls")
	assert.Contains(t, table, "nightly")
	assert.Contains(t, table, "30 2 * * * Europe/Berlin")
	assert.Contains(t, table, "T02:30 Europe/Berlin", "the next period")
	ok(t, db, "schedule", "pause", "nightly")
	var all []runcue.ScheduleStatus
	require.NoError(t, json.Unmarshal([]byte(ok(t, db, "schedule", "ls", "-o", "json")), &all))
	require.Len(t, all, 1)
	assert.True(t, all[0].Paused)
	assert.Equal(t, "Europe/Berlin", all[0].Timing.Zone)
	ok(t, db, "schedule", "resume", "nightly")
	ok(t, db, "schedule", "delete", "nightly")
	_, _, code := run(t, db, "schedule", "pause", "nightly")
	assert.Equal(t, 1, code, "an unknown schedule")
	assert.Equal(t, "SCHEDULE  TASK  TIMING  MISSED  PAUSED  LAST  NEXT  NEXT AT\n", ok(t, db, "schedule", "ls"))
}

// TestStatsBatches: stats, from another process than the owner's, shows
// the owner's batches (asked through the database).
func TestStatsBatches(t *testing.T) {
	db, c := newDB(t)
	ctx := t.Context()
	require.NoError(t, c.Task("bulk", runcue.Task{Batch: &runcue.Batch{Max: 2, Wait: time.Hour,
		Handler: func(ctx context.Context, ws []*runcue.Work) ([]runcue.Outcome, error) {
			return make([]runcue.Outcome, len(ws)), nil
		}}}))
	_, err := c.SubmitBatch(ctx, []runcue.Submission{{Task: "bulk"}, {Task: "bulk"}, {Task: "bulk"}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Stop(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := c.Stats(ctx)
		require.NoError(t, err)
		if s.States[runcue.StateCompleted] == 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the first batch did not run")
		time.Sleep(10 * time.Millisecond)
	}
	assert.Regexp(t, `batches\s+1 run with 2 units \(2\.0 a batch\), 1 waiting for more units`, ok(t, db, "stats"))
}
