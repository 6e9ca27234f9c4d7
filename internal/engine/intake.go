package engine

import (
	"encoding/json"
	"errors"
	"math"
	"sync/atomic"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// Intake: backpressure (the queue's high and low water marks) and feeding
// (Config.Feed when the queue runs low).

// intake is the state of backpressure and the feed.
type intake struct {
	// bpActive: the queue crossed its high-water mark and has not yet
	// fallen to the low one.
	bpActive bool
	// feeding: a Feed call is in flight; feedWait: the last returned
	// nothing or failed (wait FeedInterval); exhausted: Feed said it has
	// no more.
	feeding   bool
	feedWait  bool
	exhausted bool
	// queued and unloadedNow mirror queuedCount and loader.unloaded for
	// the metrics goroutine, which reads them (atomic).
	queued, unloadedNow atomic.Int64
}

// queuedCount is the number of queued units: those the dispatcher holds,
// and those of a deep queue it has not loaded yet (loader.unloaded).
func (d *Engine) queuedCount() int {
	return d.heldQueued() + d.unloaded
}

// heldQueued is the number of queued units the dispatcher holds.
func (d *Engine) heldQueued() int {
	n := len(d.units) - len(d.runs)
	for _, o := range d.orphans {
		n += len(o)
	}
	return n
}

// backpressure reports the queue crossing the high and low water marks.
func (d *Engine) backpressure() {
	limit := d.cfg.MaxQueued
	if limit <= 0 {
		return
	}
	q := d.queuedCount()
	high, low := int(math.Ceil(rt.HighWater*float64(limit))), int(math.Floor(rt.LowWater*float64(limit)))
	switch {
	case !d.bpActive && q >= high:
		d.bpActive = true
	case d.bpActive && q <= low:
		d.bpActive = false
	default:
		return
	}
	typ := store.TypeBackpressureCleared
	if d.bpActive {
		typ = store.TypeBackpressureActive
	}
	d.log.Info("runcue: "+typ, "queued", q, "max_queued", limit)
	data, _ := json.Marshal(backpressureData{Queued: q, MaxQueued: limit})
	d.submit(&store.AppendEvent{Epoch: d.epoch, Event: store.Event{Type: typ, Time: d.wall(), Data: data}})
}

type backpressureData struct {
	Queued    int `json:"queued"`
	MaxQueued int `json:"max_queued"`
}

// maybeFeed asks the feed for work when the queue is low.
func (d *Engine) maybeFeed() {
	f := d.cfg.Feed
	if f == nil || d.feeding || d.feedWait || d.exhausted || d.stopping || d.failed != nil {
		return
	}
	q := d.queuedCount()
	low := d.cfg.FeedLowWater
	if q >= low {
		return
	}
	d.feeding = true
	want := 2*low - q
	d.helperStart()
	d.aux.Go(func() {
		ctx := d.auxCtx // cancelled when the dispatcher exits
		d.in.Push(msgFed{err: f(ctx, want)})
		d.helperDone()
	})
}

func (d *Engine) fed(err error) {
	d.feeding = false
	switch {
	case err == nil:
	case errors.Is(err, ErrFeedExhausted):
		d.exhausted = true
		d.log.Info("runcue: feed exhausted")
	default:
		if !errors.Is(err, ErrFeedEmpty) {
			d.log.Warn("runcue: feed failed", "error", err)
		}
		d.feedWait = true
		d.pushTimer(&timerEntry{at: d.now().Add(d.cfg.FeedInterval), kind: tFeed})
	}
}
