package runcue

import (
	"context"

	"github.com/runcue/runcue/internal/writer"
)

// Settle returns once the dispatcher has handled everything sent to it, the
// writer has committed everything queued, and the dispatcher has handled the
// commits' consequences. Handlers still running are not waited for.
func Settle(ctx context.Context, c *Cue) error {
	for range 2 {
		if d := c.disp.Load(); d != nil {
			if err := d.sync(ctx); err != nil {
				return err
			}
		}
		if err := c.w.Sync(ctx); err != nil {
			return err
		}
	}
	if d := c.disp.Load(); d != nil {
		return d.sync(ctx)
	}
	return nil
}

// PollNow makes the Cue check the database for other processes' commits.
func PollNow(ctx context.Context, c *Cue) error { return c.w.Poll(ctx) }

// WriterStats returns the group-commit counters.
func WriterStats(c *Cue) (batches, ops int64) { return c.w.Stats() }

var _ = writer.ErrClosed
