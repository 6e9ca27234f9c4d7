package runcue_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// childEnv selects a child-process mode (see child_test.go): the test binary
// re-executes itself to be killed with SIGKILL.
const childEnv = "RUNCUE_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	if path := os.Getenv(lockHolderEnv); path != "" {
		os.Exit(holdLock(path))
	}
	hoststest.Child(openHostsDB)
	goleak.VerifyTestMain(m)
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// wait bounds how long a test waits for something that should happen. It is
// a guard against hangs, never a timing assertion.
const wait = 30 * time.Second

type env struct {
	t    *testing.T
	c    *runcue.Cue
	clk  *clock.Fake
	path string
	ctx  context.Context
	logs *syncBuffer
}

// newEnv opens a Cue on a new file with a fake clock.
func newEnv(t *testing.T, cfg runcue.Config) *env {
	t.Helper()
	e := &env{t: t, path: filepath.Join(t.TempDir(), "runcue.db"), clk: clock.NewFake(epoch), logs: &syncBuffer{}}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	e.ctx = ctx
	e.c = e.open(cfg)
	return e
}

// newEnvAt is newEnv with its fake clock at start.
func newEnvAt(t *testing.T, start time.Time) *env {
	t.Helper()
	e := &env{t: t, path: filepath.Join(t.TempDir(), "runcue.db"), clk: clock.NewFake(start), logs: &syncBuffer{}}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	e.ctx = ctx
	e.c = e.open(runcue.Config{})
	return e
}

// open opens another Cue on the env's file, sharing its clock and logs.
func (e *env) open(cfg runcue.Config) *runcue.Cue {
	e.t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = e.clk
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c, err := runcue.Open(e.path, cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { c.Close() })
	runcue.WatchIterations(c)
	return c
}

// newHeldEnv is newEnv on a store whose commits a test can hold
// (testutil.HoldStore).
func newHeldEnv(t *testing.T, cfg runcue.Config) (*env, *testutil.HoldStore) {
	t.Helper()
	e := &env{t: t, path: filepath.Join(t.TempDir(), "runcue.db"), clk: clock.NewFake(epoch), logs: &syncBuffer{}}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	e.ctx = ctx
	st, err := sqlite.Open(e.path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	hs := &testutil.HoldStore{Store: st}
	if cfg.Clock == nil {
		cfg.Clock = e.clk
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger
	}
	e.c, err = runcue.New(hs, cfg)
	require.NoError(t, err)
	runcue.WatchIterations(e.c)
	t.Cleanup(func() { e.c.Close() })
	return e, hs
}

// finishOf matches a commit that holds a Finish of id.
func finishOf(id string) func([]store.Op) bool {
	return testutil.HasOp(func(op store.Op) bool {
		f, ok := op.(*store.Finish)
		return ok && f.ID == id
	})
}

// inspect returns a snapshot of the dispatcher taken after one full loop
// iteration (dispatch included) that follows every message sent so far.
func (e *env) inspect() runcue.DispatcherState {
	e.t.Helper()
	require.NoError(e.t, runcue.SyncDispatcher(e.ctx, e.c))
	st, err := runcue.Inspect(e.ctx, e.c)
	require.NoError(e.t, err)
	return st
}

func (e *env) settle(cs ...*runcue.Cue) {
	e.t.Helper()
	if len(cs) == 0 {
		cs = []*runcue.Cue{e.c}
	}
	for _, c := range cs {
		require.NoError(e.t, runcue.Settle(e.ctx, c))
	}
}

func (e *env) submit(task string, mods ...func(*runcue.Submission)) string {
	e.t.Helper()
	s := runcue.Submission{Task: task}
	for _, m := range mods {
		m(&s)
	}
	out, err := e.c.Submit(e.ctx, s)
	require.NoError(e.t, err)
	return out.ID
}

func (e *env) get(id string) runcue.WorkInfo {
	e.t.Helper()
	wi, err := e.c.Get(e.ctx, id)
	require.NoError(e.t, err)
	return wi
}

func (e *env) wait(id string) runcue.WorkInfo {
	e.t.Helper()
	wi, err := e.c.Wait(e.ctx, id)
	require.NoError(e.t, err)
	return wi
}

func (e *env) start() {
	e.t.Helper()
	require.NoError(e.t, e.c.Start(e.ctx))
}

func noop(context.Context, *runcue.Work) (any, error) { return nil, nil }

// batchOf returns n submissions of task with no payload.
func batchOf(task string, n int) []runcue.Submission {
	subs := make([]runcue.Submission, n)
	for i := range subs {
		subs[i] = runcue.Submission{Task: task}
	}
	return subs
}

// recorder collects a Cue's events.
type recorder struct {
	mu     sync.Mutex
	events []runcue.Event
	more   chan struct{}
	done   chan struct{}
}

func record(t *testing.T, c *runcue.Cue) *recorder {
	ctx, cancel := context.WithCancel(context.Background())
	r := &recorder{more: make(chan struct{}), done: make(chan struct{})}
	ch := c.Events(ctx)
	go func() {
		defer close(r.done)
		for ev := range ch {
			r.mu.Lock()
			r.events = append(r.events, ev)
			close(r.more)
			r.more = make(chan struct{})
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func (r *recorder) all() []runcue.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]runcue.Event(nil), r.events...)
}

// waitFor waits until n events satisfy match and returns them.
func (r *recorder) waitFor(t *testing.T, n int, match func(runcue.Event) bool) []runcue.Event {
	t.Helper()
	deadline := time.After(wait)
	for {
		r.mu.Lock()
		var got []runcue.Event
		for _, ev := range r.events {
			if match(ev) {
				got = append(got, ev)
			}
		}
		more := r.more
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-more:
		case <-deadline:
			t.Fatalf("timed out waiting for %d matching events; have %d", n, len(got))
		}
	}
}

func ofType(typ runcue.EventType, id string) func(runcue.Event) bool {
	return func(ev runcue.Event) bool { return ev.Type == typ && (id == "" || ev.WorkID == id) }
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// gate is a handler whose runs block until released, reporting each start.
type gate struct {
	started chan string
	release chan error
}

func newGate() *gate {
	return &gate{started: make(chan string, 1000), release: make(chan error, 1000)}
}

func (g *gate) handler(ctx context.Context, w *runcue.Work) (any, error) {
	g.started <- w.ID
	select {
	case err := <-g.release:
		return w.ID, err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// next returns the ID of the next run to start.
func (g *gate) next(t *testing.T) string {
	t.Helper()
	select {
	case id := <-g.started:
		return id
	case <-time.After(wait):
		t.Fatal("no run started")
		return ""
	}
}

// none asserts that no further run has started.
func (g *gate) none(t *testing.T) {
	t.Helper()
	select {
	case id := <-g.started:
		t.Fatalf("unexpected start of %s", id)
	default:
	}
}

// testSeed returns a random seed, or the one in the environment variable
// named env, and logs it with how to repeat it.
func testSeed(t *testing.T, env string) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(env); s != "" {
		var err error
		seed, err = parseUint(s)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set %s=%d to repeat)", seed, env, seed)
	return seed
}

func parseUint(s string) (uint64, error) {
	var v uint64
	_, err := fmt.Sscan(s, &v)
	return v, err
}

// quiesce returns once the Cue's dispatcher has nothing in flight: no claim
// waiting for its commit and no handler that has not returned (handlers
// that block must not be running). Then settle.
//
// It waits on the dispatcher's own signal (a loop iteration: a handler's
// return or a claim's commit is one), never on a sleep.
// recv returns the next value from ch, failing the test if none comes
// before the env's deadline.
func recv[T any](e *env, ch <-chan T, what string) T {
	e.t.Helper()
	select {
	case v := <-ch:
		return v
	case <-e.ctx.Done():
		e.t.Fatalf("%s: nothing came before the deadline", what)
		var zero T
		return zero
	}
}

func (e *env) quiesce(c *runcue.Cue) {
	e.t.Helper()
	iterated := runcue.WatchIterations(c)
	for {
		require.NoError(e.t, runcue.Settle(e.ctx, c))
		st, err := runcue.Inspect(e.ctx, c)
		require.NoError(e.t, err)
		if st.Live == 0 && st.Claims == 0 && st.Reads == 0 {
			require.NoError(e.t, runcue.Settle(e.ctx, c))
			return
		}
		select {
		case <-iterated:
		case <-e.ctx.Done():
			e.t.Fatalf("still in flight: %+v", st)
		}
	}
}

// arrival is when the request of a run that started at start reaches the
// service: 0 to 5 ms later, drawn from seed and the run's identity.
func arrival(seed uint64, id string, attempt int, start time.Time) time.Time {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", id, attempt)
	r := rand.New(rand.NewPCG(seed, h.Sum64()))
	return start.Add(time.Duration(r.Int64N(int64(5*time.Millisecond) + 1)))
}
