package engine

import (
	"context"
	"time"

	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// Maintenance: the retention pass, which deletes old finished units,
// events and service log entries in bounded batches. Driven by the
// dispatcher's timer.

// maintenance is the state of retention: pruning is set while a pass is
// in flight.
type maintenance struct {
	pruning bool
}

// pruneBatch caps the rows one retention pass deletes in a transaction.
const pruneBatch = 1000

// ActivityRetention is how long the per-minute activity and queue-wait
// counts behind Stats are kept.
const ActivityRetention = 24 * time.Hour

func (d *Engine) schedulePrune(at time.Time) {
	d.pushTimer(&timerEntry{at: at, kind: tPrune})
}

// prune deletes, in one batch, finished units past Config.Retention, events
// past Config.EventRetention, and the service log entries that no rate
// window needs any more.
func (d *Engine) prune(now time.Time) {
	if d.pruning || d.stopping {
		return
	}
	op := &store.Prune{Epoch: d.epoch, Limit: pruneBatch, LogBefore: d.logCutoffs(now), EventsBefore: now.Add(-d.cfg.EventRetention),
		EventsHardBefore: now.Add(-d.cfg.SubscriptionRetention), ActivityBefore: now.Add(-ActivityRetention)}
	if d.cfg.Retention > 0 {
		op.Before = now.Add(-d.cfg.Retention)
	}
	d.pruning = true
	// Filtered durable subscriptions may have passed events they will
	// never receive: read how far, off the loop, then prune.
	d.read(func(ctx context.Context) func(*Engine) {
		passed, err := store.PassedPositions(ctx, d.st)
		return func(d *Engine) {
			if err != nil {
				d.log.Error("runcue: read the positions of filtered subscriptions; retention keeps their events", "error", err)
			}
			op.Passed = passed
			err := d.w.Submit(&writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
				d.in.Push(msgPruned{more: err == nil && res[0].More})
			}})
			if err != nil {
				d.pruning = false
			}
		}
	})
}
