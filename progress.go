package runcue

import (
	"encoding/json"
	"time"

	"github.com/runcue/runcue/store"
)

// Progress and queue status: throttled work_progress events and the
// periodic queue_status.

// progressEvery is the least time between two work_progress events of a run.
const progressEvery = time.Second

// reportProgress runs on the handler goroutine. Only the first report of a
// throttling window reaches the dispatcher; later ones just replace the
// value it will emit.
func (d *dispatcher) reportProgress(r *run, b []byte) {
	p := &r.progress
	p.mu.Lock()
	p.latest = b
	if p.pending {
		p.mu.Unlock()
		return
	}
	p.pending = true
	due := p.lastEmit.Add(progressEvery)
	p.mu.Unlock()
	d.in.Push(msgProgress{run: r, due: due})
}

func (d *dispatcher) emitProgress(r *run) {
	now := d.now()
	p := &r.progress
	p.mu.Lock()
	val := p.latest
	p.lastEmit, p.pending = now, false
	p.mu.Unlock()
	if r.over() {
		return // the unit has moved on; its outcome says more than this
	}
	d.hub.Publish([]store.Event{{Type: string(EventWorkProgress), Time: d.wall(), WorkID: r.id, Task: r.task, Target: r.target, Attempt: r.no, Data: val}})
}

// queueStatus publishes the periodic summary.
func (d *dispatcher) queueStatus() {
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
	data, _ := json.Marshal(qs)
	d.hub.Publish([]store.Event{{Type: string(EventQueueStatus), Time: d.wall(), Data: data}})
	if iv := d.cfg.QueueStatusInterval; iv > 0 {
		d.pushTimer(&timerEntry{at: d.now().Add(iv), kind: tQueueStatus})
	}
}
