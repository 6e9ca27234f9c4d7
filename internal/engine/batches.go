package engine

import (
	"errors"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Batching: a batch task's units of one lane (its task, keyed services
// and batch key) run in batches, one call of its Runner per batch. The
// batch is admitted as one dispatch: one slot of each cap, one request of
// each rate window and budget, and the units' summed cost of every other
// amount. Its first unit leads it: its run holds what was admitted and
// its claim logs the start; every unit has a run, a claim and a Finish of
// its own, written in the leader's transactions (the claims together,
// before the call), so each ends (and retries) on its own outcome.

// BatchSpec is how a task's units are batched.
type BatchSpec struct {
	// Max is the most units in a batch (at least one).
	Max int
	// MaxCost bounds a batch's summed cost of each amount it names; a
	// unit that costs more alone runs alone.
	MaxCost rt.Costs
	// Wait is how long a batch short of Max (and of MaxCost) waits for
	// more units, from the readiness of its oldest unit; zero: none.
	Wait time.Duration
	// Key gives a unit's batch key from its target: units of different
	// keys never share a batch. Nil, or "": the task's one batch stream.
	Key func(target string) string
}

// batchKey sets u's batch key (at registration).
func (x *unitIndex) batchKey(u *unit, rt *taskRT) {
	if b := rt.spec.Batch; b != nil && b.Key != nil {
		if k := b.Key(u.target); k != "" {
			u.ext().batch = k
		}
	}
}

// batchDue returns the instant l's next batch waits for (zero: it goes
// now): its oldest unit's readiness plus Wait, unless the batch is full.
func (d *Engine) batchDue(l *lane, b *BatchSpec, now time.Time) time.Time {
	n := l.units.Len()
	if b.Wait <= 0 || n >= b.Max {
		return time.Time{}
	}
	oldest := int64(0)
	var sum rt.Costs
	for _, u := range l.units.Items() {
		if oldest == 0 || u.readyAt < oldest {
			oldest = u.readyAt
		}
		for name := range b.MaxCost {
			if sum == nil {
				sum = make(rt.Costs, len(b.MaxCost))
			}
			sum[name] += u.costs().Of(name)
		}
	}
	for name, limit := range b.MaxCost {
		if sum[name] >= limit {
			return time.Time{} // full by cost
		}
	}
	due := time.Unix(0, oldest).Add(b.Wait)
	if !due.After(now) {
		return time.Time{}
	}
	return due
}

// waitBatch leaves l out of the ready lanes until at, when its batch is
// due; a unit that joins it meanwhile makes it ready again, and dispatch
// looks again.
func (d *Engine) waitBatch(l *lane, at time.Time) {
	if l.batchTimer != nil && l.batchTimer.at.Equal(at) {
		return
	}
	d.dropTimer(l.batchTimer)
	l.batchTimer = &timerEntry{at: at, kind: tBatch, l: l}
	d.pushTimer(l.batchTimer)
}

// batchDueNow handles l's batch timer: l is ready again.
func (d *Engine) batchDueNow(e *timerEntry) {
	l := e.l
	if l.batchTimer != e {
		return
	}
	l.batchTimer = nil
	if l.units.Len() > 0 && !l.inReady && l.parkedOn == nil {
		d.laneChanged(l)
	}
}

// gather pops l's next batch: its first unit, then those after it while
// the batch holds fewer than limit units and its summed costs stay within
// MaxCost.
func (d *Engine) gather(l *lane, b *BatchSpec, limit int) []*unit {
	batch := []*unit{l.units.Pop()}
	var sum rt.Costs
	if len(b.MaxCost) > 0 {
		sum = make(rt.Costs, len(b.MaxCost))
		for name := range b.MaxCost {
			sum[name] = batch[0].costs().Of(name)
		}
	}
	for len(batch) < limit && l.units.Len() > 0 {
		u := l.units.Peek()
		fits := true
		for name, most := range b.MaxCost {
			if sum[name]+u.costs().Of(name) > most {
				fits = false
			}
		}
		if !fits {
			break
		}
		for name := range b.MaxCost {
			sum[name] += u.costs().Of(name)
		}
		batch = append(batch, l.units.Pop())
	}
	return batch
}

// unpop puts units popped by gather back in l.
func (d *Engine) unpop(l *lane, units []*unit) {
	for _, u := range units {
		l.units.Push(u)
	}
}

// batchCosts is what a batch of units on l asks of l's resources: one
// slot and one request, and the summed cost of every other amount its
// meters count (a batch of one: its unit's costs).
func (d *Engine) batchCosts(l *lane, batch []*unit) rt.Costs {
	if len(batch) == 1 {
		return batch[0].costs()
	}
	costs := rt.Costs{rt.Requests: 1}
	add := func(name string) {
		if _, ok := costs[name]; ok {
			return
		}
		var n int64
		for _, u := range batch {
			n += u.costs().Of(name)
		}
		costs[name] = n
	}
	for _, e := range d.loggedOf(l, nil) { // every amount the lane's meters count
		add(e.Meter)
	}
	for _, u := range batch {
		for name := range u.costs() {
			add(name)
		}
	}
	return costs
}

// admitBatch admits the batch gathered from l, or a part of it: while a
// meter of an amount refuses the batch (or could never take it), its
// second half goes back to l. It returns the batch admitted, its costs,
// and as admit does.
func (d *Engine) admitBatch(l *lane, batch []*unit, now time.Time) ([]*unit, rt.Costs, *resource, time.Time, []*resource) {
	for {
		costs := d.batchCosts(l, batch)
		blocker, until, probes := d.admit(l, now, costs)
		if blocker == nil || len(batch) == 1 {
			return batch, costs, blocker, until, probes
		}
		if blocker.Unfit(costs) == "" {
			if rf, refused := blocker.RefusalFor(now, costs, l); !refused || rf.Kind != broker.RefuseMeter {
				return batch, costs, blocker, until, probes
			}
		}
		half := len(batch) / 2
		d.unpop(l, batch[half:])
		batch = batch[:half]
	}
}

// startBatch starts a batch admitted on l at now: a run for each unit,
// the first leading the batch with its costs, and their claims written
// together, ahead of the call.
func (d *Engine) startBatch(batch []*unit, l *lane, now time.Time, probes []*resource, spent []store.Event, costs rt.Costs) {
	if len(batch) == 1 {
		d.start(batch[0], l, now, probes, spent)
		return
	}
	lead := d.newRun(batch[0], l, now, probes, spent, costs, nil)
	lead.batch = make([]*run, 0, len(batch)-1)
	for _, u := range batch[1:] {
		lead.batch = append(lead.batch, d.newRun(u, l, now, nil, nil, nil, lead))
	}
	d.stats.Batches.Add(1)
	d.stats.Batched.Add(int64(len(batch)))
	lead.ahead = true
	d.claims++
	ops := make([]store.Op, 0, len(batch))
	ops = append(ops, &lead.mem.claim)
	for _, p := range lead.batch {
		ops = append(ops, &p.mem.claim)
	}
	lead.mem.claimReq.Ops, lead.mem.claimReq.Sink = ops, (*batchClaimSink)(lead)
	if err := d.w.Submit(&lead.mem.claimReq); err != nil {
		d.failed = err
		d.claims--
		d.batchClaimed(lead, make([]bool, len(ops)))
	}
}

// batchClaimSink reports the commit of a batch's claims (the leader's
// run is the request's Sink).
type batchClaimSink run

// Committed implements writer.Sink.
func (s *batchClaimSink) Committed(res []store.Result, err error) {
	r := (*run)(s)
	each := make([]bool, 1+len(r.batch))
	if err == nil {
		r.d.noteResults(res)
		for i := range each {
			each[i] = res[i].Applied
		}
	}
	r.d.in.Push(msgRunWritten{run: r, claim: true, applied: each[0], each: each})
}

// batchClaimed continues a batch whose claims committed (each says which
// applied): a unit whose claim the store refused leaves the batch; the
// leader goes on as claimed says, and if it launches nothing, the others
// are requeued, nothing having run.
func (d *Engine) batchClaimed(lead *run, each []bool) {
	kept := lead.batch[:0]
	for i, p := range lead.batch {
		if each[i+1] {
			kept = append(kept, p)
			continue
		}
		p.claimFailed = true
		if !p.over() {
			d.end(p, true, verdictNone)
			d.forget(p.u)
			endSpan(p.span, "abandoned", nil)
		}
	}
	lead.batch = kept
	d.claimed(lead, each[0])
	if lead.state == runLaunched {
		return
	}
	for _, p := range lead.batch {
		if !p.over() {
			d.finished(p, Ending{Err: errBatchNotRun, Class: ClassLateStart, NotStarted: true, At: d.wall()})
		}
	}
}

// errBatchNotRun is why a unit of a batch whose call never started is
// requeued.
var errBatchNotRun = errors.New("runcue: the batch's call did not start (its first unit's run ended first); nothing ran")

// launchBatch launches the units of lead's batch with it: each run the
// Runner will report on, in lead's Run.Batch. They count as launched
// runs, not as handlers: the batch's one handler call is the leader's.
func (d *Engine) launchBatch(lead *run) {
	lead.pub.Batch = lead.pub.Batch[:0]
	for _, p := range lead.batch {
		if p.over() {
			continue // its deadline passed, or it was cancelled, before the call
		}
		p.state = runLaunched
		d.live++ // not local: the handler's goroutine, which Settle and Stop count, is the leader's
		d.activity.Add(1)
		lead.pub.Batch = append(lead.pub.Batch, &p.pub)
	}
}
