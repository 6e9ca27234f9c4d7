package runcue_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

func TestDependencyFile(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	dep := runcue.Dependency{ID: "u1", Task: "fetch", Target: "example.org"}
	f := runcue.DependencyFile(filepath.Join(dir, "{target}", "{task}-{id}-*.json"))
	ok, err := f(ctx, dep)
	require.NoError(t, err)
	assert.False(t, ok, "no file yet")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "example.org"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "example.org", "fetch-u1-0001.json"), nil, 0o600))
	ok, err = f(ctx, dep)
	require.NoError(t, err)
	assert.True(t, ok, "placeholders and wildcards")
	ok, _ = f(ctx, runcue.Dependency{ID: "u2", Task: "fetch", Target: "example.org"})
	assert.False(t, ok, "another dependency's file does not count")

	_, err = runcue.DependencyFile(filepath.Join(dir, "[{id}"))(ctx, dep)
	assert.Error(t, err, "a malformed pattern is an error")
}

func TestDependencyQuery(t *testing.T) {
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "app.db"))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE outputs(work_id TEXT, a INTEGER, b INTEGER)`)
	require.NoError(t, err)
	ctx := context.Background()
	f := runcue.DependencyQuery(db, `SELECT a, b FROM outputs WHERE work_id = ?`)
	ok, err := f(ctx, runcue.Dependency{ID: "u1"})
	require.NoError(t, err)
	assert.False(t, ok)
	_, err = db.Exec(`INSERT INTO outputs VALUES('u1', 1, 2)`)
	require.NoError(t, err)
	ok, err = f(ctx, runcue.Dependency{ID: "u1"})
	require.NoError(t, err)
	assert.True(t, ok, "any row, any columns")

	_, err = runcue.DependencyQuery(db, `SELECT 1 FROM nowhere WHERE id = ?`)(ctx, runcue.Dependency{ID: "u1"})
	assert.Error(t, err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = f(cancelled, runcue.Dependency{ID: "u1"})
	assert.Error(t, err, "the callback's context bounds the query")
}

// A DependencySatisfied error counts as not satisfied, and is reported with
// reason "error"; the dependent runs once the callback says yes.
func TestDependencyCallbackError(t *testing.T) {
	answers := make(chan error, 10)
	e := newEnv(t, runcue.Config{DependencySatisfied: func(ctx context.Context, dep runcue.Dependency) (bool, error) {
		err := <-answers
		return err == nil, err
	}})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	checks := runcue.WatchChecks(e.c)
	e.start()
	answers <- assert.AnError
	a := e.submit("t")
	b := e.submit("t", func(s *runcue.Submission) { s.DependsOn = []string{a} })
	assert.Equal(t, b, recv(e, checks, "the check of b"))
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(b).State, "an error is not a yes")
	assert.Contains(t, e.logs.String(), "reason=error")
	answers <- nil
	e.clk.Advance(time.Hour) // the recheck
	assert.Equal(t, runcue.StateCompleted, e.wait(b).State)
}

// Dependents lists the units that wait for a unit, sorted; an unknown ID
// is ErrNotFound.
func TestDependents(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	_, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{
		{Task: "t", ID: "c2", DependsOn: []string{"p"}}, {Task: "t", ID: "p"}, {Task: "t", ID: "c1", DependsOn: []string{"p"}},
	})
	require.NoError(t, err)
	deps, err := e.c.Dependents(e.ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, []string{"c1", "c2"}, deps)
	deps, err = e.c.Dependents(e.ctx, "c1")
	require.NoError(t, err)
	assert.Empty(t, deps)
	_, err = e.c.Dependents(e.ctx, "nope")
	assert.ErrorIs(t, err, runcue.ErrNotFound)
}
