package engine

import (
	"context"
	"errors"

	"github.com/runcue/runcue/store"
)

// Recovery: what a new owner does before it dispatches (see lease.go).

// firstLoad is how many queued units recovery indexes before the
// dispatcher starts; loadBatch is how many each later step of the load
// reads and hands to the loop.
const (
	firstLoad = 10_000
	loadBatch = 4096
)

// loader is the state of a streamed load of the queued units (owned by the
// dispatcher goroutine). The load is paced by the loop: the loading
// goroutine reads a batch only when granted one (grant), and the loop
// withholds the next while it holds Config.LoadAhead queued units and
// dispatch is saturated by them (see loadMore), so that a deep queue is
// read as dispatch makes room for it instead of all at once against the
// writer.
type loader struct {
	// loading is set until the last batch is filed.
	loading bool
	// grant carries the loop's permission to read one more batch (at most
	// one is outstanding: granted is set from the grant until its batch
	// arrives); loadWaits is set while the load waits for room.
	grant     chan struct{}
	granted   bool
	loadWaits bool
	// unloaded counts the queued units stored but not yet read: the
	// store's count when the load began, less the queued units read since.
	// Submissions and cancellations made elsewhere after the count are
	// not in it; it is zero once the load ends.
	unloaded int
}

// errLoadedEnough stops a part of the load.
var errLoadedEnough = errors.New("runcue: part of the load done")

// recover requeues the units a previous owner left running and indexes the
// queued units. It runs before the dispatcher goroutine starts: it indexes
// the first firstLoad queued units itself (at most Config.LoadAhead; a
// small queue is held entirely when Start returns), and the rest streams
// in on a goroutine of its own as dispatch makes room (see streamLoad), so
// that dispatch starts before a deep queue is loaded. A priority function
// sees only the units loaded so far.
func (d *Engine) recover(ctx context.Context) error {
	res, err := d.w.Do(ctx, &store.Recover{Epoch: d.epoch, At: d.wall(), PreviousDead: d.own.PreviousDead(), Ended: d.cfg.Ended})
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
		haunted := 0
		for _, su := range units {
			if !d.adopt(su) {
				d.haunt(su)
				haunted++
			}
		}
		if adopted := len(units) - haunted; adopted > 0 {
			d.log.Info("runcue: adopted runs an earlier owner handed to executors", "units", adopted)
		}
		if haunted > 0 {
			d.log.Warn("runcue: units left running by an earlier owner that may still be alive wait for their leases to end",
				"units", haunted)
		}
	}
	first := firstLoad
	if ahead := d.cfg.LoadAhead; ahead >= 0 {
		first = min(first, max(ahead, 1))
	}
	if d.hooks.FirstLoad > 0 {
		first = d.hooks.FirstLoad
	}
	total, err := d.st.QueuedCount(ctx)
	if err != nil {
		return err
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
		d.file(loaded)
		d.streamLoad(last, max(0, total-n))
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

// streamLoad loads the queued units after seq after (unloaded of them, as
// far as the store counted) on a goroutine of its own, a batch whenever the
// loop grants one (see loader and loadMore). Each batch is read in a fresh
// read of the store, holding no snapshot between batches (a paused load
// must not keep the database from checkpointing), and counts as a pending
// read from its grant until it is filed, which keeps the record of units
// that ended meanwhile (noteEnded) so that a unit cancelled after it was
// read is not indexed. The goroutine ends with the load or when the
// dispatcher exits.
func (d *Engine) streamLoad(after int64, unloaded int) {
	d.loading, d.unloaded = true, unloaded
	d.grant = make(chan struct{}, 1)
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
		for {
			select {
			case <-d.grant:
			case <-d.auxStop:
				return
			}
			var batch []*unit
			read := 0
			err := d.st.LoadActive(ctx, after, func(su *store.Unit) error {
				if su.State != store.Queued {
					after = su.Seq
					return nil
				}
				if read == size {
					return errLoadedEnough
				}
				after = su.Seq
				read++
				batch = append(batch, d.build(su))
				return nil
			})
			done := !errors.Is(err, errLoadedEnough)
			if !done {
				err = nil
			}
			step()
			d.in.Push(msgLoaded{units: batch, read: read, done: done, err: err})
			if done {
				return
			}
		}
	})
	d.loadMore()
}

// loadMore grants the loading goroutine its next batch unless one is
// granted already or the load is to wait (then the loop asks again after
// every iteration: see Run).
//
// The load waits while the loop holds Config.LoadAhead queued units and
// they keep dispatch saturated: every handler slot is taken, or the commit
// backlog is full, or the queue is paused. While a slot is free after a
// dispatch pass, the units held cannot use it (they wait for dependencies,
// a time, or a service's limits), and a unit not yet loaded might: the
// load goes on, however many are held. So units that cannot run never
// keep the units behind them from loading; the memory bound is LoadAhead
// only while the units held are the ones dispatch can use.
func (d *Engine) loadMore() {
	if !d.loading || d.granted {
		return
	}
	saturated := d.inflight >= d.cfg.MaxConcurrent || d.uncommitted >= d.cfg.MaxUncommitted || d.queuePaused || d.stopping
	if ahead := d.cfg.LoadAhead; ahead >= 0 && saturated && d.heldQueued() >= ahead {
		if !d.loadWaits && d.hooks.LoadWaits != nil {
			d.hooks.LoadWaits(d.heldQueued(), d.unloaded)
		}
		d.loadWaits = true
		return
	}
	d.loadWaits, d.granted = false, true
	d.pending++ // the batch is a read in flight until it is filed
	d.grant <- struct{}{}
}

// loaded files a batch of the streamed load (built on the loading
// goroutine) and asks for the next.
func (d *Engine) loaded(m msgLoaded) {
	d.granted = false
	d.pending--
	d.unloaded = max(0, d.unloaded-m.read)
	units := m.units[:0]
	for _, u := range m.units {
		if _, gone := d.ended[u.id]; gone {
			continue // ended since it was read
		}
		if u := d.register(u); u != nil {
			units = append(units, u)
		}
	}
	// A dependency not yet loaded is queued in the store: its dependents
	// wait for it like for any dependency this Cue does not hold
	// (resolveDeps), and it releases them when it completes here.
	d.file(units)
	if d.pending == 0 {
		clear(d.ended)
	}
	if m.done {
		if m.err != nil && d.auxCtx.Err() == nil {
			d.log.Error("runcue: load queued units; the units not loaded stay queued for the next owner", "error", m.err)
		}
		d.loading, d.unloaded = false, 0
		return
	}
	d.loadMore()
}
