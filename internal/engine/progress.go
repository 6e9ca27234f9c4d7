package engine

import (
	"sync"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// What a running handler reports besides its end, and the queue's summary:
// throttled work_progress events, heartbeats (lease extensions), and the
// periodic queue_status.

// queueStatus publishes the periodic summary.
func (d *Engine) queueStatus() {
	var qs rt.QueueStatus
	for _, u := range d.units {
		switch u.state {
		case uReady:
			qs.Queued++
		case uWaiting:
			qs.Waiting++
		case uBlocked, uChecking, uSequenced:
			qs.Blocked++
		}
	}
	qs.Running = len(d.runs)
	qs.Paused = d.queuePaused
	for _, o := range d.orphans {
		qs.Orphaned += len(o)
	}
	qs.Unloaded = d.unloaded
	qs.Backpressure = d.bpActive
	data := d.encode(qs)
	d.hub.Publish([]store.Event{{Type: store.TypeQueueStatus, Time: d.wall(), Data: data}})
	if iv := d.cfg.QueueStatusInterval; iv > 0 {
		d.pushTimer(&timerEntry{at: d.now().Add(iv), kind: tQueueStatus})
	}
}

type progress struct {
	mu       sync.Mutex
	latest   []byte
	lastEmit time.Time
	pending  bool // an emission is scheduled
}

// reportProgress reports a value the handler gave (any JSON), published as a
// work_progress event at most once a second, the latest value winning.
// Only the first report of a throttling window reaches the dispatcher;
// later ones replace the value it will emit.
func (d *Engine) reportProgress(p *Run, b []byte) {
	r := p.r
	pr := &r.progress
	pr.mu.Lock()
	pr.latest = b
	if pr.pending {
		pr.mu.Unlock()
		return
	}
	pr.pending = true
	due := pr.lastEmit.Add(progressEvery)
	pr.mu.Unlock()
	d.in.Push(msgProgress{run: r, due: due})
}

// progressEvery is the least time between two work_progress events of a run.
const progressEvery = time.Second

func (d *Engine) emitProgress(r *run) {
	now := d.now()
	p := &r.progress
	p.mu.Lock()
	val := p.latest
	p.lastEmit, p.pending = now, false
	p.mu.Unlock()
	if r.over() {
		return // the unit has moved on; its outcome says more than this
	}
	d.hub.Publish([]store.Event{{Type: store.TypeWorkProgress, Time: d.wall(), WorkID: r.u.id, Task: r.u.task, Target: r.pub.Target,
		Attempt: r.no, Data: val}})
}

// reportHeartbeat reports that r's handler is alive: its lease is extended,
// with at most one write a second.
func (d *Engine) reportHeartbeat(p *Run) {
	r := p.r
	now := d.now().UnixNano()
	last := r.lastBeat.Load()
	if now-last < int64(time.Second) || !r.lastBeat.CompareAndSwap(last, now) {
		return
	}
	d.in.Push(msgHeartbeat{run: r})
}

// heartbeat writes r's heartbeat, if r still runs.
func (d *Engine) heartbeat(r *run) {
	if d.runs[r.u.id] != r {
		return
	}
	now := d.wall()
	d.submit(&store.Heartbeat{Epoch: d.epoch, ID: r.u.id, Owner: d.owner, Run: r.no, At: now, LeaseExpires: now.Add(d.cfg.LeaseBuffer)})
}
