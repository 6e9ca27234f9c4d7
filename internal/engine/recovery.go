package engine

import (
	"context"
	"errors"
	"slices"

	"github.com/runcue/runcue/store"
)

// Recovery: what a new owner does before it dispatches (see lease.go).

// firstLoad is how many queued units recovery indexes before the
// dispatcher starts; loadBatch is how many each later step of the load
// hands to the loop.
const (
	firstLoad = 10_000
	loadBatch = 4096
)

// loader is the state of a streamed load of the queued units (owned by the
// dispatcher goroutine): loading is set until the last batch is filed, and
// deferred holds the loaded units with dependencies, filed when every
// queued unit is indexed (so that a dependent stored before its dependency
// waits for it).
type loader struct {
	loading  bool
	deferred []*unit
}

// errLoadedEnough stops the first part of the load.
var errLoadedEnough = errors.New("runcue: first part of the load done")

// recover requeues the units a previous owner left running and indexes the
// queued units. It runs before the dispatcher goroutine starts: it indexes
// the first firstLoad queued units itself (a small queue is held entirely
// when Start returns), and the rest streams in on the reader goroutine
// while the dispatcher runs (see loaded), so that dispatch starts before a
// deep queue is loaded. With a priority function, the first scoring
// passes see only the units loaded so far.
func (d *Engine) recover(ctx context.Context) error {
	res, err := d.w.Do(ctx, &store.Recover{Epoch: d.epoch, At: d.wall(), PreviousDead: d.own.PreviousDead()})
	if err == nil {
		err = res[0].Err // ErrNotOwner: another Cue took over meanwhile
	}
	if err != nil {
		return err
	}
	if n := len(res[0].IDs); n > 0 {
		d.log.Info("runcue: requeued units left running by the previous owner", "units", n)
	}
	if held := res[0].Held; len(held) > 0 {
		// Runs of an owner that may be alive: they hold their services
		// until their leases end (ghosts.go).
		units, err := d.st.ListUnits(ctx, store.ListFilter{IDs: held, States: []store.State{store.Running}, Limit: len(held)})
		if err != nil {
			return err
		}
		for _, su := range units {
			d.haunt(su)
		}
		d.log.Warn("runcue: units left running by an earlier owner that may still be alive wait for their leases to end",
			"units", len(units))
	}
	first := firstLoad
	if d.hooks.FirstLoad > 0 {
		first = d.hooks.FirstLoad
	}
	var loaded []*unit
	var last int64
	n := 0
	err = d.st.LoadActive(ctx, 0, func(su *store.Unit) error {
		if n == first {
			return errLoadedEnough
		}
		last = su.Seq
		if su.State == store.Queued {
			n++
			if u := d.index(su); u != nil {
				loaded = append(loaded, u)
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, errLoadedEnough):
		d.loading = true
		d.fileLoaded(loaded)
		d.streamLoad(last)
	case err != nil:
		return err
	default:
		d.file(loaded)
	}
	d.schedulePrune(d.now())
	if d.cfg.QueueStatusInterval > 0 {
		d.pushTimer(&timerEntry{at: d.now().Add(d.cfg.QueueStatusInterval), kind: tQueueStatus})
	}
	return nil
}

// streamLoad loads the queued units after seq after on a goroutine of its
// own (not the reader's, which it would hold for the whole load), handing
// them to the loop in batches (msgLoaded); its last answer (a msgRead)
// ends the load. It counts as a pending read, which keeps the record of
// units that ended (noteEnded), so that a unit cancelled after it was read
// is not indexed. It stops early when the dispatcher exits.
func (d *Engine) streamLoad(after int64) {
	d.pending++
	size := loadBatch
	if d.hooks.LoadBatch > 0 {
		size = d.hooks.LoadBatch
	}
	step := func() {
		if d.hooks.LoadStep != nil {
			d.hooks.LoadStep(d.auxCtx)
		}
	}
	d.aux.Go(func() {
		ctx := d.auxCtx
		var batch []*unit
		err := d.st.LoadActive(ctx, after, func(su *store.Unit) error {
			if su.State != store.Queued {
				return nil
			}
			batch = append(batch, d.build(su))
			if len(batch) == size {
				step()
				d.in.Push(msgLoaded{units: batch})
				batch = nil
			}
			return nil
		})
		step()
		d.in.Push(msgRead{apply: func(d *Engine) {
			if err != nil && ctx.Err() == nil {
				d.log.Error("runcue: load queued units; the units not loaded stay queued for the next owner", "error", err)
			}
			d.loaded(batch)
			d.loading = false
			// A deferred unit cancelled or failed meanwhile is gone.
			deferred := slices.DeleteFunc(d.deferred, func(u *unit) bool { return d.units[u.id] != u })
			d.deferred = nil
			d.file(deferred)
		}})
	})
}

// loaded indexes a batch of the streamed load (built on the loading
// goroutine): units without dependencies are filed now, the others when
// the load ends.
func (d *Engine) loaded(built []*unit) {
	units := built[:0]
	for _, u := range built {
		if _, gone := d.ended[u.id]; gone {
			continue // ended since it was read
		}
		if u := d.register(u); u != nil {
			units = append(units, u)
		}
	}
	d.fileLoaded(units)
}

// fileLoaded files the loaded units without dependencies and defers the
// others to the end of the load.
func (d *Engine) fileLoaded(units []*unit) {
	for _, u := range units {
		if len(u.deps()) > 0 {
			u.state = uBlocked
			d.deferred = append(d.deferred, u)
		} else {
			d.makeEligible(u)
		}
	}
}
