package runcue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runcue/runcue/store"
)

// Drain returns once no work that this Cue can run is queued, running or
// waiting (for its RunAt or a retry), or ctx ends. Units of task types not
// registered in this Cue do not hold it; Drain logs them. In a Cue that
// does not own the database, Drain watches the database instead: it returns
// when the owner has finished the work. With Config.DrainSubscriptions it
// also waits until those durable subscriptions have acknowledged every
// event, and looks again if their consumers submitted follow-ups.
func (c *Cue) Drain(ctx context.Context) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	if err := c.w.Poll(ctx); err != nil && !errors.Is(err, ErrClosed) {
		return wrapStoreErr(err)
	}
	if err := c.knownDrainSubscriptions(ctx); err != nil {
		return err
	}
	if d := c.disp.Load(); d != nil {
		for {
			// The log's end before the drain: a follow-up a consumer of
			// DrainSubscriptions submits after this reading is looked at
			// again; one submitted before it reached the dispatcher before
			// the drain did (Submit returns after that), so the drain
			// waits for it.
			since, err := c.lastSeq(ctx)
			if err != nil {
				return err
			}
			if err := d.drain(ctx); err != nil {
				return err
			}
			if err := c.w.Sync(ctx); err != nil {
				return err
			}
			if moved, err := c.waitAcked(ctx, since); err != nil || !moved {
				return err
			}
		}
	}
	warned := false
	for {
		changed := c.hub.Changed()
		since, err := c.lastSeq(ctx) // before the counts (see above)
		if err != nil {
			return err
		}
		counts, err := c.st.CountActive(ctx)
		if err != nil {
			return c.readErr(err)
		}
		busy, orphans := 0, map[string]int{}
		c.mu.Lock()
		for task, n := range counts {
			if _, ok := c.tasks[task]; ok {
				busy += n
			} else {
				orphans[task] = n
			}
		}
		c.mu.Unlock()
		if busy == 0 {
			moved, err := c.waitAcked(ctx, since)
			if err != nil {
				return err
			}
			if !moved {
				c.reportOrphans(orphans)
				return nil
			}
			continue
		}
		if !warned {
			warned = true
			c.warnIfUnowned(ctx, "Drain", "units", busy)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lastSeq is the log's end, for Drain's DrainSubscriptions (0 without
// them: it is not read).
func (c *Cue) lastSeq(ctx context.Context) (int64, error) {
	if len(c.cfg.DrainSubscriptions) == 0 {
		return 0, nil
	}
	if err := c.w.Sync(ctx); err != nil {
		return 0, wrapStoreErr(err)
	}
	n, err := c.st.LastSeq(ctx)
	if err != nil {
		return 0, c.readErr(err)
	}
	return n, nil
}

// warnIfUnowned logs a warning when this Cue does not own the database and
// no other process does either: the call would wait for work no one runs.
// It asks the store without taking ownership (which could make a
// concurrent Start fail).
func (c *Cue) warnIfUnowned(ctx context.Context, call string, args ...any) {
	if c.disp.Load() != nil {
		return
	}
	p, ok := c.st.(store.OwnerProber)
	if !ok {
		return
	}
	if _, owned, err := p.Owner(ctx); err != nil || owned {
		return
	}
	db := "the database"
	if n, ok := c.st.(interface{ Path() string }); ok {
		db = n.Path()
	}
	c.log.Warn(fmt.Sprintf("runcue: %s: no Cue owns %s: was Start called? Nothing runs its work until one does", call, db), args...)
}

func (c *Cue) reportOrphans(orphans map[string]int) {
	for task, n := range orphans {
		c.log.Warn("runcue: units of a task type not registered here remain queued", "task_type", task, "units", n)
	}
}

// Prune deletes the finished units (completed, skipped, failed or cancelled) that
// finished more than olderThan ago, with their history, and returns how many
// it deleted. It deletes in batches, one transaction each. See also
// Config.Retention.
func (c *Cue) Prune(ctx context.Context, olderThan time.Duration) (int, error) {
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	before := c.clock.Now().Add(-olderThan)
	total := 0
	for {
		res, err := c.w.Do(ctx, &store.Prune{Before: before, Limit: 1000})
		if err != nil {
			return total, wrapStoreErr(err)
		}
		total += res[0].Count
		if !res[0].More {
			return total, nil
		}
	}
}
