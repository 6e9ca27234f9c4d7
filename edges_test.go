package runcue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestWaitWithoutOwnerWarns: Wait and Drain in a Cue that does not own the
// database, while no process owns it, log one warning naming the database
// instead of hanging silently; with an owner they do not.
func TestWaitWithoutOwnerWarns(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	id := e.submit("t")
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	_, err := e.c.Wait(ctx, id)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	ctx, cancel = context.WithTimeout(e.ctx, 50*time.Millisecond)
	require.ErrorIs(t, e.c.Drain(ctx), context.DeadlineExceeded)
	cancel()
	logs := e.logs.String()
	want := "no Cue owns " + e.path + ": was Start called?"
	assert.Equal(t, 1, strings.Count(logs, "Wait: "+want), logs)
	assert.Equal(t, 1, strings.Count(logs, "Drain: "+want), logs)

	owner := e.open(runcue.Config{})
	require.NoError(t, owner.Task("t", runcue.Task{Handler: func(ctx context.Context, _ *runcue.Work) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}}))
	require.NoError(t, owner.Start(e.ctx))
	other := e.open(runcue.Config{})
	id2, err := other.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	before := strings.Count(e.logs.String(), want)
	ctx, cancel = context.WithTimeout(e.ctx, 50*time.Millisecond)
	_, err = other.Wait(ctx, id2.ID)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, before, strings.Count(e.logs.String(), want), "an owner runs elsewhere: no warning")
}

// TestMethodsAfterClose: every method of a closed Cue says so (ErrClosed),
// including Submit of a task this Cue never registered (it is looked up in
// the database, which is closed) and Subscribe.
func TestMethodsAfterClose(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("api", runcue.Service{}))
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	id := e.submit("t")
	// A task registered in the database by another Cue only.
	other := e.open(runcue.Config{})
	require.NoError(t, other.Task("elsewhere", runcue.Task{Handler: noop}))
	c := e.open(runcue.Config{}) // knows no task itself
	require.NoError(t, c.Close())
	require.NoError(t, e.c.Close())
	ctx := e.ctx
	for name, call := range map[string]func(c *runcue.Cue) error{
		"Submit(unknown here)": func(c *runcue.Cue) error {
			_, err := c.Submit(ctx, runcue.Submission{Task: "elsewhere"})
			return err
		},
		"Submit": func(c *runcue.Cue) error { _, err := c.Submit(ctx, runcue.Submission{Task: "t"}); return err },
		"SubmitBatch": func(c *runcue.Cue) error {
			_, err := c.SubmitBatch(ctx, []runcue.Submission{{Task: "t"}})
			return err
		},
		"Get":           func(c *runcue.Cue) error { _, err := c.Get(ctx, id); return err },
		"List":          func(c *runcue.Cue) error { _, err := c.List(ctx, runcue.ListOptions{}); return err },
		"Wait":          func(c *runcue.Cue) error { _, err := c.Wait(ctx, id); return err },
		"Drain":         func(c *runcue.Cue) error { return c.Drain(ctx) },
		"Cancel":        func(c *runcue.Cue) error { return c.Cancel(ctx, id, runcue.CancelOptions{}) },
		"Retry":         func(c *runcue.Cue) error { return c.Retry(ctx, id) },
		"RetryFailed":   func(c *runcue.Cue) error { _, err := c.RetryFailed(ctx, runcue.RetryFilter{}); return err },
		"Prune":         func(c *runcue.Cue) error { _, err := c.Prune(ctx, time.Hour); return err },
		"Explain":       func(c *runcue.Cue) error { _, err := c.Explain(ctx, id); return err },
		"Start":         func(c *runcue.Cue) error { return c.Start(ctx) },
		"Service":       func(c *runcue.Cue) error { return c.Service("new", runcue.Service{}) },
		"Task":          func(c *runcue.Cue) error { return c.Task("new", runcue.Task{Handler: noop}) },
		"SetService":    func(c *runcue.Cue) error { return c.SetService(ctx, "api", runcue.Service{MaxConcurrent: 1}) },
		"ResetService":  func(c *runcue.Cue) error { return c.ResetService(ctx, "api") },
		"PauseService":  func(c *runcue.Cue) error { return c.PauseService(ctx, "api") },
		"ResumeService": func(c *runcue.Cue) error { return c.ResumeService(ctx, "api") },
		"Services":      func(c *runcue.Cue) error { _, err := c.Services(ctx); return err },
		"ServiceStatus": func(c *runcue.Cue) error { _, err := c.ServiceStatus(ctx, "api"); return err },
		"Subscribe": func(c *runcue.Cue) error {
			_, cancel, err := c.Subscribe(ctx, runcue.SubscribeOptions{})
			cancel()
			return err
		},
	} {
		for _, cue := range []*runcue.Cue{e.c, c} {
			assert.ErrorIs(t, call(cue), runcue.ErrClosed, name)
		}
	}
	assert.NoError(t, e.c.Close(), "Close is idempotent")
	assert.NoError(t, e.c.Stop(ctx))
	assert.Empty(t, e.c.Owner())
}
