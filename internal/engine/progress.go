package engine

import (
	"github.com/runcue/runcue/store"
)

// Progress and queue status: throttled work_progress events and the
// periodic queue_status.

// queueStatus publishes the periodic summary.
func (d *Engine) queueStatus() {
	var qs QueueStatus
	for _, u := range d.units {
		switch u.state {
		case uReady:
			qs.Queued++
		case uWaiting:
			qs.Waiting++
		case uBlocked, uChecking:
			qs.Blocked++
		}
	}
	qs.Running = len(d.runs)
	qs.Paused = d.queuePaused
	for _, o := range d.orphans {
		qs.Orphaned += len(o)
	}
	qs.Backpressure = d.bpActive
	data := d.encode(qs)
	d.hub.Publish([]store.Event{{Type: store.TypeQueueStatus, Time: d.wall(), Data: data}})
	if iv := d.cfg.QueueStatusInterval; iv > 0 {
		d.pushTimer(&timerEntry{at: d.now().Add(iv), kind: tQueueStatus})
	}
}
