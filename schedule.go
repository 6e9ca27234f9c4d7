package runcue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/runcue/runcue/internal/inbox"
	"github.com/runcue/runcue/store"
)

// Scheduling options: dependencies, dynamic priority, backpressure and
// feeders. They are set in Config; this file holds their types.

// OverflowPolicy says what Submit does when the queue is full.
type OverflowPolicy uint8

const (
	// OverflowReject makes Submit return ErrBackpressure. The default.
	OverflowReject OverflowPolicy = iota
	// OverflowDropOldest makes room by cancelling the oldest queued units
	// (ErrorKind and reason "dropped", with a work_cancelled event each).
	OverflowDropOldest
	// OverflowBlock makes Submit wait until there is room or its context
	// ends (then it returns ErrBackpressure wrapping the context's error).
	OverflowBlock
)

// Backpressure marks: backpressure_active is reported when the queued units
// reach HighWater of Config.MaxQueued, backpressure_cleared when they fall
// back to LowWater of it, so the signal does not flap at the limit.
const (
	HighWater = 0.9
	LowWater  = 0.7
)

// PriorityContext is what a priority function sees of a unit.
type PriorityContext struct {
	// Work is the unit: ID, task, target, params and next attempt number.
	Work *Work
	// QueueDepth is the number of queued units the owner holds.
	QueueDepth int
	// ServicePressure maps each of the unit's services to its load: active
	// over MaxConcurrent, 0 for a service without a concurrency limit.
	ServicePressure map[string]float64
	// WaitTime is how long ago the unit was submitted.
	WaitTime time.Duration
}

// PriorityFunc scores a unit for dispatch, from 0 (lowest) to 1 (highest).
// It must be fast and must not block; see Config.Priority.
type PriorityFunc func(PriorityContext) float64

// PriorityConstant scores every unit x: dispatch stays in submission order.
func PriorityConstant(x float64) PriorityFunc {
	return func(PriorityContext) float64 { return x }
}

// PriorityByWaitTime scores a unit by how long it has waited, reaching 1 at
// horizon: the oldest work goes first, and no unit starves. Combine it with
// your own score to keep low-priority work moving under a stream of urgent
// work:
//
//	func(pc runcue.PriorityContext) float64 {
//		return max(myScore(pc), byWait(pc)) // byWait := runcue.PriorityByWaitTime(time.Hour)
//	}
func PriorityByWaitTime(horizon time.Duration) PriorityFunc {
	if horizon <= 0 {
		horizon = time.Hour
	}
	return func(pc PriorityContext) float64 {
		return min(1, float64(pc.WaitTime)/float64(horizon))
	}
}

// FeedFunc supplies work when the queue runs low (see Config.Feed). It is
// asked for about want submissions; it returns them (possibly none, for
// now), or ErrFeedExhausted when there will never be more.
type FeedFunc func(ctx context.Context, want int) ([]Submission, error)

// DependencyFunc reports whether a completed dependency's output is usable
// (see Config.DependencySatisfied).
type DependencyFunc func(ctx context.Context, id string) bool

// defaultScore is the score of a unit whose priority function panicked, or
// that could not be scored in time.
const defaultScore = 0.5

// score runs f for one unit, clamping its result to [0, 1] and mapping a
// panic or NaN to the default. A failure says why (reason: panic, nan,
// out_of_range) and what (detail).
func score(f PriorityFunc, pc PriorityContext) (s float64, reason, detail string) {
	defer func() {
		if v := recover(); v != nil {
			s, reason, detail = defaultScore, "panic", fmt.Sprint(v)
		}
	}()
	s = f(pc)
	switch {
	case math.IsNaN(s):
		return defaultScore, "nan", "NaN"
	case s < 0 || s > 1:
		return min(max(s, 0), 1), "out_of_range", fmt.Sprint(s)
	}
	return s, "", ""
}

// errCallbackPanic marks a callback that panicked.
var errCallbackPanic = errors.New("panic")

// checkDependency runs f for one dependency with a timeout. A timeout or a
// panic counts as not satisfied. The call runs on its own goroutine so that
// a callback that ignores its context cannot hold the caller past the
// timeout; such a goroutine ends when the callback returns.
func checkDependency(f DependencyFunc, id string, timeout time.Duration) (ok bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res := make(chan bool, 1)
	errc := make(chan error, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				errc <- fmt.Errorf("%w: %v", errCallbackPanic, v)
			}
		}()
		res <- f(ctx, id)
	}()
	select {
	case ok := <-res:
		return ok, nil
	case err := <-errc:
		return false, err
	case <-ctx.Done():
		return false, fmt.Errorf("no answer within %v", timeout)
	}
}

// ---- dependencies ----

// resolveDeps files each of units, which have dependencies, as waiting for
// those that have not completed, and the rest on to eligibility.
//
// A dependency counts as complete only when the store says so (or it is no
// longer stored: only finished units are pruned, and a failed or cancelled
// one fails its dependents in the same transaction). One this Cue holds
// (queued, running, or finishing without a commit yet) is waited for, and
// so is one the store has queued or running that this Cue does not hold
// yet: a dependency later in the same batch, or one submitted by another
// process and not loaded yet. The store is asked about all of units'
// unknown dependencies at once.
func (d *dispatcher) resolveDeps(units []*unit) {
	if len(units) == 0 {
		return
	}
	var unknown []string
	seen := map[string]bool{}
	for _, u := range units {
		for _, dep := range u.deps {
			if !seen[dep] && !d.holds(dep) {
				seen[dep] = true
				unknown = append(unknown, dep)
			}
		}
	}
	var states map[string]store.State
	if len(unknown) > 0 {
		var err error
		states, err = d.c.st.UnitStates(context.Background(), unknown)
		if err != nil {
			// Without an answer nothing may start: treat them as pending.
			// A unit so blocked waits until the next owner's start.
			d.c.log.Error("runcue: read dependencies' states; their dependents wait", "dependencies", len(unknown), "error", err)
			states = make(map[string]store.State, len(unknown))
			for _, dep := range unknown {
				states[dep] = store.Queued
			}
		}
	}
	for _, u := range units {
		if d.units[u.id] != u {
			continue // gone meanwhile
		}
		d.waitDeps(u, states)
	}
}

// waitDeps files u as waiting for its dependencies that have not completed
// (see resolveDeps); states holds the store's answer for dependencies this
// Cue does not hold.
func (d *dispatcher) waitDeps(u *unit, states map[string]store.State) {
	u.pending = 0
	var dead string
	var deadState store.State
	for _, dep := range u.deps {
		if d.holds(dep) {
			u.pending++
			d.dependents[dep] = append(d.dependents[dep], u)
			continue
		}
		switch st := states[dep]; st {
		case store.Queued, store.Running:
			u.pending++
			d.dependents[dep] = append(d.dependents[dep], u)
		case store.Failed, store.Cancelled:
			dead, deadState = dep, st
		}
	}
	if dead != "" {
		// A dependency ended badly but u is queued (it was requeued on its
		// own, say): u cannot run; fail it as the store fails dependents.
		d.failDependent(u, dead, deadState)
		return
	}
	if !u.depsBy.IsZero() {
		d.dropTimer(u.depTimer)
		u.depTimer = &timerEntry{at: d.fromWall(u.depsBy), kind: tDepDeadline, u: u}
		d.pushTimer(u.depTimer)
	}
	if u.pending > 0 {
		u.state = uBlocked
		return
	}
	d.depsDone(u)
}

// failDependent fails queued unit u because its dependency dep is failed or
// cancelled, propagating to u's own dependents.
func (d *dispatcher) failDependent(u *unit, dep string, st store.State) {
	for _, other := range u.deps {
		if ws := d.dependents[other]; ws != nil {
			d.dependents[other] = slices.DeleteFunc(ws, func(w *unit) bool { return w == u })
		}
	}
	d.removeQueued(u)
	kind := "prerequisite_failed"
	if st == store.Cancelled {
		kind = "prerequisite_cancelled"
	}
	msg := fmt.Sprintf("dependency %s is %s", dep, st)
	d.submit(&store.FailQueued{ID: u.id, At: d.wall(), Error: msg, ErrorKind: kind,
		Events: []store.Event{{Type: string(EventWorkFailed), Task: u.task, Data: eventData{Error: msg, ErrorKind: kind}.encode()}}})
}

// holds reports whether this Cue holds unit id: queued, waiting or running
// here, finishing without a commit yet, or queued with an unregistered task.
func (d *dispatcher) holds(id string) bool {
	if _, ok := d.units[id]; ok {
		return true
	}
	if _, ok := d.finishing[id]; ok {
		return true
	}
	for _, o := range d.orphans {
		if _, ok := o[id]; ok {
			return true
		}
	}
	return false
}

// waiting reports whether u waits for dep.
func (d *dispatcher) waiting(u *unit, dep string) bool {
	return slices.Contains(d.dependents[dep], u)
}

// depsDone is called when u's dependencies have all completed.
func (d *dispatcher) depsDone(u *unit) {
	if d.c.cfg.DependencySatisfied == nil {
		d.makeEligible(u)
		return
	}
	u.state = uChecking
	d.requestCheck(u)
}

// settled handles the commit of a unit's terminal outcome.
func (d *dispatcher) settled(id string, state store.State, applied bool) {
	delete(d.finishing, id)
	waiting := d.dependents[id]
	delete(d.dependents, id)
	if !applied || state != store.Completed {
		return // failed or cancelled dependents were failed with it, in the store
	}
	for _, u := range waiting {
		if d.units[u.id] != u || u.state != uBlocked {
			continue // gone meanwhile
		}
		if u.pending--; u.pending == 0 {
			d.depsDone(u)
		}
	}
}

type checkJob struct {
	id   string
	deps []string
}

// requestCheck asks DependencySatisfied about u's dependencies, on the
// checker goroutine.
func (d *dispatcher) requestCheck(u *unit) {
	if d.checks == nil {
		d.checks = inbox.New[checkJob]()
		d.aux.Go(d.checker)
	}
	u.checking = true
	d.checks.Push(checkJob{id: u.id, deps: u.deps})
}

// checker runs dependency checks until the dispatcher exits.
func (d *dispatcher) checker() {
	f, timeout := d.c.cfg.DependencySatisfied, d.c.cfg.CallbackTimeout
	for {
		select {
		case <-d.checks.Wake():
		case <-d.auxStop:
			return
		}
		for _, job := range d.checks.Take() {
			ok := true
			for _, dep := range job.deps {
				t0 := time.Now()
				sat, err := checkDependency(f, dep, timeout)
				d.c.tel.callbackDur.Record(bg, time.Since(t0).Seconds(), metric.WithAttributes(attribute.String("outcome", "dependency")))
				if err != nil {
					reason := "timeout"
					if errors.Is(err, errCallbackPanic) {
						reason = "panic"
					}
					d.c.cbErrs.report("dependency", reason, err.Error(), "work_id", job.id, "dependency", dep)
				}
				if !sat {
					ok = false
					break
				}
			}
			d.in.Push(msgChecked{id: job.id, ok: ok})
		}
	}
}

func (d *dispatcher) checked(id string, ok bool) {
	u := d.units[id]
	if u == nil || u.state != uChecking {
		return
	}
	u.checking = false
	if ok {
		d.makeEligible(u)
		return
	}
	d.dropTimer(u.recheck)
	u.recheck = &timerEntry{at: d.now().Add(d.c.cfg.DependencyRecheck), kind: tRecheck, u: u}
	d.pushTimer(u.recheck)
}

// dependencyTimeout fails a unit whose dependencies were not satisfied by
// its DependencyTimeout.
func (d *dispatcher) dependencyTimeout(u *unit, now time.Time) {
	if d.units[u.id] != u || (u.state != uBlocked && u.state != uChecking) {
		return
	}
	d.removeQueued(u)
	msg := "dependencies not satisfied within the dependency timeout"
	d.submit(&store.FailQueued{ID: u.id, At: now, Error: msg, ErrorKind: "dependency_timeout",
		Events: []store.Event{{Type: string(EventWorkFailed), Task: u.task,
			Data: eventData{Error: msg, ErrorKind: "dependency_timeout"}.encode()}}})
}

// ---- priority ----

type scoreEntry struct {
	score float64
	at    time.Time
}

// candidate is a unit that could be dispatched now.
type candidate struct {
	u      *unit
	l      *lane
	probes []*resource
}

// dispatchByPriority dispatches the highest-scoring units that can run,
// scoring only those: units in lanes whose resources admit them.
func (d *dispatcher) dispatchByPriority() {
	for d.inflight < d.c.cfg.MaxConcurrent {
		now := d.now()
		cands := d.candidates(now)
		if len(cands) == 0 {
			return
		}
		d.ensureScores(cands, now)
		best := cands[0]
		bestScore := d.scoreOf(best.u)
		for _, c := range cands[1:] {
			if s := d.scoreOf(c.u); s > bestScore || (s == bestScore && c.u.seq < best.u.seq) {
				best, bestScore = c, s
			}
		}
		l := best.l
		l.units.Remove(best.u.laneIdx)
		d.acquire(l, now, best.probes)
		if l.units.Len() == 0 && l.inReady {
			d.ready.Remove(l.idx)
			l.inReady = false
		} else if l.inReady {
			d.ready.Fix(l.idx)
		}
		d.start(best.u, l, now, best.probes)
		for _, r := range l.resources {
			d.wake(r)
		}
	}
}

// candidates lists the units of the ready lanes that admit a dispatch now;
// lanes that do not are parked.
func (d *dispatcher) candidates(now time.Time) []candidate {
	var out []candidate
	var parked []*lane
	for _, l := range d.ready.Items() {
		blocker, _, probes := d.admit(l, now)
		if blocker != nil {
			parked = append(parked, l)
			continue
		}
		for _, u := range l.units.Items() {
			out = append(out, candidate{u: u, l: l, probes: probes})
		}
	}
	for _, l := range parked {
		d.ready.Remove(l.idx)
		l.inReady = false
		blocker, until, _ := d.admit(l, now)
		d.park(l, blocker, until)
	}
	return out
}

func (d *dispatcher) scoreOf(u *unit) float64 {
	if e, ok := d.scores[u.id]; ok {
		return e.score
	}
	return defaultScore
}

// ensureScores scores the candidates whose score is older than
// PriorityTTL. The pass runs on a goroutine of its own; the dispatcher waits
// for it at most CallbackTimeout, and uses cached or default scores for the
// units it has not scored by then (the pass's late results are kept for
// later decisions).
func (d *dispatcher) ensureScores(cands []candidate, now time.Time) {
	var stale []candidate
	for _, c := range cands {
		if e, ok := d.scores[c.u.id]; !ok || now.Sub(e.at) >= d.c.cfg.PriorityTTL {
			stale = append(stale, c)
		}
	}
	if len(stale) == 0 || d.scoring {
		return
	}
	queued := d.queuedCount()
	jobs := make([]scoreJob, len(stale))
	for i, c := range stale {
		u := c.u
		j := scoreJob{w: &Work{ID: u.id, Task: u.task, Target: u.target, Params: u.params, Attempt: u.runs + 1},
			load: !u.hasParams, wait: max(0, d.wall().Sub(u.createdAt)), pressure: make(map[string]float64, len(c.l.resources))}
		for _, r := range c.l.resources {
			if r.class == "" {
				continue
			}
			p := 0.0
			if r.limit > 0 {
				p = min(1, float64(r.active)/float64(r.limit))
			}
			j.pressure[r.name] = p
		}
		jobs[i] = j
	}
	results := make(chan map[string]float64, 1)
	progress := make(chan struct{}) // closed when the pass finishes
	go d.scorePass(jobs, queued, results, progress)
	timer := time.NewTimer(d.c.cfg.CallbackTimeout)
	defer timer.Stop()
	select {
	case res := <-results:
		d.storeScores(res)
		d.overruns = 0
	case <-timer.C:
		d.scoring = true
		d.overruns++
		d.c.cbErrs.report("priority", "timeout", fmt.Sprintf("a scoring pass of %d units overran %v; cached or default scores used",
			len(jobs), d.c.cfg.CallbackTimeout), "consecutive_overruns", d.overruns)
		go func() {
			<-progress
			d.in.Push(msgScores{scores: <-results})
		}()
	}
}

type scoreJob struct {
	w        *Work
	load     bool
	wait     time.Duration
	pressure map[string]float64
}

// scorePass runs on its own goroutine: it calls the priority function for
// each job. A function that never returns keeps this goroutine; nothing
// waits for it.
func (d *dispatcher) scorePass(jobs []scoreJob, queued int, results chan<- map[string]float64, done chan struct{}) {
	out := make(map[string]float64, len(jobs))
	for _, j := range jobs {
		if j.load {
			if su, err := d.c.st.GetUnit(context.Background(), j.w.ID); err == nil {
				j.w.Params = su.Params
			}
		}
		t0 := time.Now()
		s, reason, detail := score(d.c.cfg.Priority, PriorityContext{Work: j.w, QueueDepth: queued, ServicePressure: j.pressure, WaitTime: j.wait})
		d.c.tel.callbackDur.Record(bg, time.Since(t0).Seconds(), metric.WithAttributes(attribute.String("outcome", "priority")))
		d.c.stats.priorityCalls.Add(1)
		if reason != "" {
			d.c.cbErrs.report("priority", reason, detail, "work_id", j.w.ID, "task_type", j.w.Task, "score_used", s)
		}
		out[j.w.ID] = s
	}
	results <- out
	close(done)
}

func (d *dispatcher) storeScores(res map[string]float64) {
	now := d.now()
	for id, s := range res {
		if _, ok := d.units[id]; ok {
			d.scores[id] = scoreEntry{score: s, at: now}
		}
	}
	// Forget scores of units that left.
	if len(d.scores) > 2*len(d.units)+64 {
		for id := range d.scores {
			if _, ok := d.units[id]; !ok {
				delete(d.scores, id)
			}
		}
	}
}

// ---- backpressure ----

// queuedCount is the number of queued units the dispatcher holds.
func (d *dispatcher) queuedCount() int {
	n := len(d.units) - len(d.runs)
	for _, o := range d.orphans {
		n += len(o)
	}
	return n
}

// backpressure reports the queue crossing the high and low water marks.
func (d *dispatcher) backpressure() {
	limit := d.c.cfg.MaxQueued
	if limit <= 0 {
		return
	}
	q := d.queuedCount()
	high, low := int(math.Ceil(HighWater*float64(limit))), int(math.Floor(LowWater*float64(limit)))
	switch {
	case !d.bpActive && q >= high:
		d.bpActive = true
	case d.bpActive && q <= low:
		d.bpActive = false
	default:
		return
	}
	typ := EventBackpressureCleared
	if d.bpActive {
		typ = EventBackpressureActive
	}
	d.c.log.Info("runcue: "+string(typ), "queued", q, "max_queued", limit)
	data, _ := json.Marshal(backpressureData{Queued: q, MaxQueued: limit})
	d.submit(&store.AppendEvent{Event: store.Event{Type: string(typ), Time: d.wall(), Data: data}})
}

type backpressureData struct {
	Queued    int `json:"queued"`
	MaxQueued int `json:"max_queued"`
}

// ---- feeding ----

// maybeFeed asks the feed for work when the queue is low.
func (d *dispatcher) maybeFeed() {
	f := d.c.cfg.Feed
	if f == nil || d.feeding || d.feedWait || d.exhausted || d.stopping || d.failed != nil {
		return
	}
	q := d.queuedCount()
	low := d.c.cfg.FeedLowWater
	if q >= low {
		return
	}
	d.feeding = true
	want := 2*low - q
	d.aux.Go(func() {
		ctx := d.auxCtx // cancelled when the dispatcher exits
		subs, err := f(ctx, want)
		if err == nil && len(subs) > 0 {
			_, err = d.c.SubmitBatch(ctx, subs)
		} else if err == nil {
			err = errFeedEmpty
		}
		d.in.Push(msgFed{err: err})
	})
}

var errFeedEmpty = errors.New("runcue: feed returned nothing")

func (d *dispatcher) fed(err error) {
	d.feeding = false
	switch {
	case err == nil:
	case errors.Is(err, ErrFeedExhausted):
		d.exhausted = true
		d.c.log.Info("runcue: feed exhausted")
	default:
		if !errors.Is(err, errFeedEmpty) {
			d.c.log.Warn("runcue: feed failed", "error", err)
		}
		d.feedWait = true
		d.pushTimer(&timerEntry{at: d.now().Add(d.c.cfg.FeedInterval), kind: tFeed})
	}
}

// ---- progress and queue status ----

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
	if r.ended {
		return // the unit has moved on; its outcome says more than this
	}
	d.c.hub.Publish([]store.Event{{Type: string(EventWorkProgress), Time: d.wall(), WorkID: r.id, Task: r.task, Attempt: r.no, Data: val}})
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
	for _, o := range d.orphans {
		qs.Orphaned += len(o)
	}
	qs.Backpressure = d.bpActive
	data, _ := json.Marshal(qs)
	d.c.hub.Publish([]store.Event{{Type: string(EventQueueStatus), Time: d.wall(), Data: data}})
	if iv := d.c.cfg.QueueStatusInterval; iv > 0 {
		d.pushTimer(&timerEntry{at: d.now().Add(iv), kind: tQueueStatus})
	}
}
