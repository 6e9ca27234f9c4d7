//go:build unix

package hoststest

import (
	"bufio"
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
)

// Frozen: an executor stopped with SIGSTOP while its handler is at the
// service, past its TTL, is judged gone: its run is requeued and completed
// by another executor. Resumed with SIGCONT, its handler returns and it
// reports the run's end, which the store refuses (store.ErrStaleRun): the
// unit stays completed by the second run, with one completion, and the
// frozen run recorded as abandoned. The scheduler is a Cue of this process.
//
// writable, if not nil, reports whether a write could take the store's
// lock now: the executor is frozen only where it holds none (between
// SQLite's transactions). A SQLite process frozen inside a write
// transaction keeps the file's write lock, and no process writes until it
// resumes: the requeue would wait for the resume this test waits on it
// for.
func Frozen(t *testing.T, open Opener, env []string, writable func(context.Context) bool) {
	ctx := context.Background()
	st, err := open(ctx)
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, Register(c))
	require.NoError(t, c.Start(ctx))
	_, err = c.Submit(ctx, runcue.Submission{ID: "u1", Task: "call", Target: "0", Cost: runcue.Costs{"tokens": TokenCost("u1")}})
	require.NoError(t, err)
	m := newMock()
	srv := httptest.NewServer(m)
	defer srv.Close()
	env = append(slices.Clone(env), envMock+"="+srv.URL)

	// The frozen executor: its stderr is read for the refusal.
	a := exec.Command(os.Args[0], "-test.run=^$")
	a.Env = append(append(os.Environ(), env...), envChild+"=executor", envID+"=frozen", envHold+"=2s")
	errs, err := a.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, a.Start())
	t.Cleanup(func() { _ = a.Process.Signal(syscall.SIGCONT); kill(a) })
	var mu sync.Mutex
	var lines []string
	go func() {
		sc := bufio.NewScanner(errs)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
		}
	}()
	waitUntil(t, "the first run at the service", func() bool { return m.busy(a.Process.Pid) })
	// Frozen at the service (its first run holds there for 2 s), outside
	// a write transaction: else resumed and tried again a moment later.
	tries := 0
	for {
		tries++
		require.NoError(t, a.Process.Signal(syscall.SIGSTOP))
		if writable == nil || writable(ctx) {
			break
		}
		require.NoError(t, a.Process.Signal(syscall.SIGCONT))
		require.Less(t, tries, 50, "the executor held the store's write lock at every try")
		time.Sleep(time.Duration(tries) * time.Millisecond)
	}
	stopped := time.Now()
	require.True(t, m.busy(a.Process.Pid), "frozen while its run is at the service")
	waitUntil(t, "the frozen executor's run requeued", func() bool {
		wi, err := c.Get(ctx, "u1")
		require.NoError(t, err)
		return len(wi.Attempts) > 0 && wi.Attempts[0].Outcome == "abandoned"
	})
	requeued := time.Since(stopped)
	b := startChild(t, env, "executor", envID+"=other")
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	wi, err := c.Wait(wctx, "u1")
	require.NoError(t, err)
	require.Equal(t, runcue.StateCompleted, wi.State)
	require.NoError(t, a.Process.Signal(syscall.SIGCONT))
	waitUntil(t, "the frozen executor's report refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, store.ErrStaleRun.Error()) })
	})
	kill(b)
	wi, err = c.Get(ctx, "u1")
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	var outcomes []string
	for _, at := range wi.Attempts {
		outcomes = append(outcomes, at.Outcome)
	}
	assert.Equal(t, []string{"abandoned", "completed"}, outcomes)
	assert.Equal(t, 2, wi.Runs)
	m.mu.Lock()
	arrived := len(m.arrivals)
	m.mu.Unlock()
	assert.Equal(t, 2, arrived, "both runs arrived at the service")
	t.Logf("frozen at the service (try %d); requeued %v after SIGSTOP (TTL 600ms); resumed, its report was refused", tries, requeued.Round(time.Millisecond))
}

// waitUntil polls cond until it holds or a generous deadline passes (a
// liveness wait, not a measurement).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
