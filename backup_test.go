package runcue_test

import (
	"path/filepath"
	"testing"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A backup taken while an owner runs opens as a database with the units.
func TestBackup(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	e.start()
	id := e.submit("t")
	e.wait(id)
	queued := e.submit("t", func(s *runcue.Submission) { s.RunAt = e.clk.Now().Add(1 << 40) })
	path := filepath.Join(t.TempDir(), "copy.db")
	require.NoError(t, e.c.Backup(e.ctx, path))
	assert.ErrorIs(t, e.c.Backup(e.ctx, path), runcue.ErrInvalid, "never over a file")
	c, err := runcue.Open(path, runcue.Config{})
	require.NoError(t, err)
	defer c.Close()
	wi, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	wi, err = c.Get(e.ctx, queued)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateQueued, wi.State)
}
