package runcue

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/runcue/runcue/store"
)

// Bulk operations: retry or cancel every unit a filter selects.

// bulkPage is how many units a bulk operation reads (and retries) at once.
const bulkPage = 1000

// RetryWhere requeues, with a fresh retry budget, every failed unit that o
// selects, with the dependents that failed only because of them (as
// Retry). o's States are ignored (only failed units are retried), and so
// are Newest, Limit and Cursor. With dryRun nothing changes and the count
// is of the failed units selected. It returns the number of units
// requeued, dependents included; a unit that changed meanwhile is skipped.
func (c *Cue) RetryWhere(ctx context.Context, o ListOptions, dryRun bool) (int, error) {
	f := o.filter()
	f.States = []store.State{store.Failed}
	n := 0
	err := c.eachPage(ctx, f, func(ids []string) error {
		if dryRun {
			n += len(ids)
			return nil
		}
		res, err := c.w.Do(ctx, &store.Requeue{IDs: ids, At: c.clock.Now()})
		if err != nil {
			return wrapStoreErr(err)
		}
		n += len(res[0].IDs)
		c.requeued(res[0])
		return nil
	})
	return n, err
}

// CancelWhere cancels, as Cancel does, every queued or running unit that o
// selects (o's States may narrow that to one of the two; Newest, Limit and
// Cursor are ignored). With dryRun nothing changes and the count is of the
// units selected. It returns the number of units cancelled (or, running
// elsewhere, asked to cancel); one that finished meanwhile is skipped.
func (c *Cue) CancelWhere(ctx context.Context, o ListOptions, opts CancelOptions, dryRun bool) (int, error) {
	f := o.filter()
	f.States = slices.DeleteFunc(slices.Clone(f.States), func(s State) bool { return s != StateQueued && s != StateRunning })
	if len(f.States) == 0 {
		if len(o.States) > 0 {
			return 0, nil // only finished states asked for
		}
		f.States = []store.State{store.Queued, store.Running}
	}
	n := 0
	err := c.eachPage(ctx, f, func(ids []string) error {
		if dryRun {
			n += len(ids)
			return nil
		}
		// Concurrent Cancels share group commits.
		var mu sync.Mutex
		var first error
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		for _, id := range ids {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				err := c.Cancel(ctx, id, opts)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					n++
				case errors.Is(err, ErrFinished), errors.Is(err, ErrNotFound):
				case first == nil:
					first = err
				}
			})
		}
		wg.Wait()
		return first
	})
	return n, err
}

// eachPage calls fn with the IDs of the units f selects, a page at a time,
// in submission order. A page is read after the previous one was handled.
func (c *Cue) eachPage(ctx context.Context, f store.ListFilter, fn func(ids []string) error) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	f.Limit, f.AfterSeq = bulkPage, 0
	for {
		units, err := c.st.ListUnits(ctx, f)
		if err != nil {
			return c.readErr(err)
		}
		if len(units) == 0 {
			return nil
		}
		ids := make([]string, len(units))
		for i, u := range units {
			ids[i] = u.ID
		}
		if err := fn(ids); err != nil {
			return err
		}
		if len(units) < bulkPage {
			return nil
		}
		f.AfterSeq = units[len(units)-1].Seq
	}
}
