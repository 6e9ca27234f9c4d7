package runcue_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/engine"
	"github.com/runcue/runcue/store/sqlite"
)

// scriptRunner is a Runner the test drives: it records each run launched,
// and reports what the test tells it to.
type scriptRunner struct {
	mu   sync.Mutex
	runs []*engine.Run
}

func (s *scriptRunner) Launch(p *engine.Run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs = append(s.runs, p)
}

func (s *scriptRunner) Cancel(p *engine.Run, cause error) {
	p.Done(engine.Ending{Err: cause, At: p.Now()})
}

// launched returns the IDs of the runs launched so far.
func (s *scriptRunner) launched() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, p := range s.runs {
		ids = append(ids, p.ID)
	}
	return ids
}

// run returns the run of unit id.
func (s *scriptRunner) run(id string) *engine.Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.runs {
		if p.ID == id {
			return p
		}
	}
	return nil
}

// TestStartOutsideBoundsKeepsWindow: a Runner that reports a start outside
// [decision, StartBy] (a remote start dated by a clock gone wrong, an end
// whose start was never reported) has it counted at StartBy, which may be
// ahead of the present; the rate window then still counts every earlier
// start until it leaves. Two starts a second: u1 starts at 0; u2, decided
// at 0.9 s, reports at 0.95 s a start before its decision, counted at its
// StartBy (1.1 s); u3, submitted at 0.95 s, must wait for u1 to leave the
// window at 1 s. Before, the window expired itself by 1.1 s when given the
// start, forgot u1, and dispatched u3 at 0.95 s: u1, u2 and u3 within one
// second.
func TestStartOutsideBoundsKeepsWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Clock: clk, Logger: quietLogger, MaxStartDelay: 200 * time.Millisecond, PollInterval: time.Hour})
	require.NoError(t, err)
	defer c.Close()
	sr := &scriptRunner{}
	runcue.UseRunner(c, func(string, engine.Runner) engine.Runner { return sr })
	require.NoError(t, c.Service("api", runcue.Service{RateLimit: 2, RateWindow: time.Second, Margin: -1}))
	require.NoError(t, c.Task("call", runcue.Task{Services: []string{"api"}, Handler: noop}))
	require.NoError(t, c.Start(ctx))
	settle := func() {
		_, err := c.Settle(ctx)
		require.NoError(t, err)
	}
	submit := func(id string) {
		_, err := c.Submit(ctx, runcue.Submission{ID: id, Task: "call"})
		require.NoError(t, err)
		settle()
	}
	at := func(ms int) {
		clk.Set(t0.Add(time.Duration(ms) * time.Millisecond))
		settle()
	}

	submit("u1")
	require.Equal(t, []string{"u1"}, sr.launched())
	u1 := sr.run("u1")
	u1.Started(u1.Now())
	u1.Done(engine.Ending{At: clk.Now()})
	settle()

	at(900)
	submit("u2")
	require.Equal(t, []string{"u1", "u2"}, sr.launched())
	at(950)
	u2 := sr.run("u2")
	u2.Started(u2.Now().Add(-time.Second)) // before its decision: counted at its StartBy, 1.1 s
	settle()
	submit("u3")
	assert.Equal(t, []string{"u1", "u2"}, sr.launched(), "u3 dispatched at 0.95 s, while u1 (0 s) and u2 count")

	at(1000)
	assert.Equal(t, []string{"u1", "u2", "u3"}, sr.launched(), "u1 left the window at 1 s")
	for _, id := range []string{"u2", "u3"} {
		if p := sr.run(id); p != nil {
			p.Done(engine.Ending{At: clk.Now()})
		}
	}
	settle()
}
