package engine

import (
	"context"
	"fmt"
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/runcue/runcue/store"
)

// Priority: scoring only the units that could run now, off the loop with
// a timeout, holding each unit's score, and dispatching the best in
// O(log n).
//
// With a priority function, a lane's units are ordered by the score they
// hold (highest first, ties by submission), scored units before unscored
// ones, and the ready lanes by their first unit in the same order. So the
// first unit of the first ready lane is the best unit that could run, and a
// dispatch decision costs what it costs without priority.
//
// A unit is scored when it joins its lane (every lane's new units in
// arrival order, in passes of at most scoreBatch), and becomes a
// candidate once it holds a score. A held score is re-scored once it is
// PriorityTTL old, oldest first, in passes of at most scoreBatch that start
// only when a handler slot is free and at most once per PriorityTTL/10. So
// with n units in ready lanes, a score is at most PriorityTTL plus about
// n/scoreBatch × PriorityTTL/10 old when a decision uses it (for example
// 1.1 s with 100,000 candidates and the default 100 ms). Units of lanes
// that are parked (their services have no room) are not scored: they are
// scored when their lane is ready again, and a lane so woken dispatches
// nothing until that pass answers (lane.awaiting), so that a unit scored
// before the lane parked does not go ahead of better units that arrived
// while it was parked.

// scoreBatch bounds the units one scoring pass scores.
const scoreBatch = 1024

// scorer runs the scoring passes. Owned by the dispatcher goroutine. A pass
// runs on a helper goroutine; scoring is set until it returns, passRefs
// are the units it scores and passID tells its answer from an earlier
// pass's; overran is set once it took longer than CallbackTimeout, and
// overruns counts consecutive passes that did. nextRescore is the earliest
// instant of the next re-scoring pass.
type scorer struct {
	scoring     bool
	overran     bool
	overruns    int
	passID      uint64
	passRefs    []unitRef
	passLanes   []*lane // lanes awaiting this pass (see lane.awaiting)
	passTimer   *time.Timer
	nextRescore time.Time
}

// defaultScore is the score of a unit whose priority function panicked, or
// that could not be scored in time.
const defaultScore = 0.5

// score runs f for one unit, clamping its result to [0, 1] and mapping a
// panic or NaN to the default. A failure says why (reason: panic, nan,
// out_of_range) and what (detail).
func score(f func(PriorityInput) float64, pc PriorityInput) (s float64, reason, detail string) {
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

// unitRef names a unit's stay in a lane: gen is its scoreGen when the
// reference was taken, so a reference outlives neither the stay nor, in a
// lane's stale queue, the score it was taken for.
type unitRef struct {
	u   *unit
	gen uint32
}

// live reports whether r's unit is still in the lane stay r names.
func (r unitRef) live() bool {
	return r.u.state == uReady && r.u.laneIdx >= 0 && r.u.scoreGen == r.gen
}

// unitBefore is the order of a lane's units with a priority function: scored
// units first, by score (highest first), then by submission.
func unitBefore(a, b *unit) bool {
	if a.scored != b.scored {
		return a.scored
	}
	if a.score != b.score {
		return a.score > b.score
	}
	return a.seq < b.seq
}

// joinScoring enters u, just filed in lane l, for scoring: its score is
// dropped, and it waits in l's fresh queue. It is called before u is
// pushed onto l's heap.
func (t *resourceTable) joinScoring(u *unit, l *lane) {
	u.scoreGen++
	u.scored, u.score = false, 0
	l.fresh.push(unitRef{u, u.scoreGen})
	if l.inReady {
		t.noteFresh(l)
	}
}

// noteFresh lists l among the lanes with units to score, if it has any.
func (t *resourceTable) noteFresh(l *lane) {
	if t.cfg.Priority != nil && !l.inFresh && l.fresh.len() > 0 {
		l.inFresh = true
		t.freshLanes.push(l)
	}
}

// scorePasses starts a scoring pass if one is due: the new units of ready
// lanes, then held scores older than PriorityTTL. While a pass that overran
// has not returned, new units take the default score instead (the
// priority function may never return).
func (d *Engine) scorePasses(now time.Time) {
	if d.scoring && !d.overran {
		return
	}
	var refs []unitRef
	var lanes []*lane // lanes awaiting the pass about to start
	tookStale := false
	for d.freshLanes.len() > 0 && len(refs) < scoreBatch {
		l := d.freshLanes.front()
		took := len(refs)
		for l.inReady && l.fresh.len() > 0 && len(refs) < scoreBatch {
			if r := l.fresh.pop(); r.live() && !r.u.scored {
				refs = append(refs, r)
			}
		}
		if l.rescore && len(refs) < scoreBatch {
			// Woken with stale scores (resourceTable.wake): re-scored
			// now, within the rate of re-scoring passes.
			if l.inReady && !d.scoring && !now.Before(d.nextRescore) {
				if l.takeStale(&refs, now, d.cfg.PriorityTTL) {
					tookStale = true
				}
			}
			l.rescore = false
		}
		if l.awaiting && l.awaitPass == 0 {
			if len(refs) > took && !d.scoring {
				l.awaitPass = d.passID + 1
				lanes = append(lanes, l)
			} else {
				l.awaiting = false // nothing of it to wait for
			}
		}
		if !l.inReady || (l.fresh.len() == 0 && !l.rescore) {
			d.freshLanes.pop()
			l.inFresh = false // noteFresh lists it again when it is ready
		}
	}
	if d.scoring {
		for _, r := range refs {
			d.holdScore(r.u, defaultScore, now)
		}
		return
	}
	d.passLanes = lanes
	if !tookStale && len(refs) < scoreBatch && d.inflight < d.cfg.MaxConcurrent && !now.Before(d.nextRescore) {
		for _, l := range d.ready.Items() {
			if l.takeStale(&refs, now, d.cfg.PriorityTTL) {
				tookStale = true
			}
			if len(refs) == scoreBatch {
				break
			}
		}
	}
	if tookStale {
		d.nextRescore = now.Add(d.cfg.PriorityTTL / 10)
	}
	if len(refs) == 0 {
		return
	}
	d.startPass(refs)
}

// startPass scores refs on a helper goroutine. Its answer comes back as
// msgScores; if it takes longer than CallbackTimeout, msgScoreOverrun comes
// first.
func (d *Engine) startPass(refs []unitRef) {
	queued := d.queuedCount()
	wall := d.wall()
	jobs := make([]scoreJob, len(refs))
	for i, r := range refs {
		u := r.u
		j := scoreJob{w: &UnitView{ID: u.id, Task: u.task, Target: u.target, Params: u.params, Attempt: int(u.runs) + 1},
			load: !u.hasParams, wait: max(0, wall.Sub(time.Unix(0, u.createdAt)))}
		for _, res := range u.lane.resources {
			if res.class == "" {
				continue
			}
			p := 0.0
			if res.Limit > 0 {
				p = min(1, float64(res.Active)/float64(res.Limit))
			}
			if j.pressure == nil {
				j.pressure = make(map[string]float64, len(u.lane.resources))
			}
			j.pressure[res.name] = p
		}
		jobs[i] = j
	}
	d.passID++
	id := d.passID
	d.scoring, d.overran, d.passRefs = true, false, refs
	d.passTimer = time.AfterFunc(d.cfg.CallbackTimeout, func() { d.in.Push(msgScoreOverrun{pass: id}) })
	d.helperStart()
	go d.scorePass(id, jobs, queued)
}

type scoreJob struct {
	w        *UnitView
	load     bool
	wait     time.Duration
	pressure map[string]float64
}

// scorePass runs on its own goroutine: it reads the params of the units
// that do not hold them (in batches), calls the priority function for each
// job and sends the scores, in the jobs' order. A function that never
// returns keeps this goroutine; nothing waits for it.
func (d *Engine) scorePass(id uint64, jobs []scoreJob, queued int) {
	d.loadParams(jobs)
	out := make([]float64, len(jobs))
	for i, j := range jobs {
		t0 := time.Now()
		s, reason, detail := score(d.cfg.Priority, PriorityInput{Unit: *j.w, QueueDepth: queued, ServicePressure: j.pressure, WaitTime: j.wait})
		d.tel.callbackDur.Record(bg, time.Since(t0).Seconds(), metric.WithAttributes(attribute.String("outcome", "priority")))
		d.stats.PriorityCalls.Add(1)
		if reason != "" {
			d.cbErrs.report("priority", reason, detail, "work_id", j.w.ID, "task_type", j.w.Task, "score_used", s)
		}
		out[i] = s
	}
	d.in.Push(msgScores{pass: id, scores: out})
	d.helperDone()
}

// loadParams reads, in batches, the params of the jobs whose units do not
// hold them in memory. A unit that cannot be read is scored without them.
func (d *Engine) loadParams(jobs []scoreJob) {
	const batch = 500
	var ids []string
	at := make(map[string]*UnitView)
	flush := func() {
		if len(ids) == 0 {
			return
		}
		sus, err := d.st.ListUnits(context.Background(), store.ListFilter{IDs: ids, Limit: len(ids)})
		if err != nil {
			d.log.Warn("runcue: read params for scoring; scoring without them", "units", len(ids), "error", err)
		}
		for _, su := range sus {
			if w := at[su.ID]; w != nil {
				w.Params = su.Params
			}
		}
		ids = ids[:0]
		clear(at)
	}
	for _, j := range jobs {
		if !j.load {
			continue
		}
		ids = append(ids, j.w.ID)
		at[j.w.ID] = j.w
		if len(ids) == batch {
			flush()
		}
	}
	flush()
}

// scored applies a pass's answer: each unit still in the lane stay it was
// scored for holds its score from now on. A pass that overran already gave
// its units the default score; its late answer replaces it.
func (d *Engine) scored(m msgScores) {
	if m.pass != d.passID || !d.scoring {
		return
	}
	d.passTimer.Stop()
	now := d.now()
	for i, r := range d.passRefs {
		if r.live() {
			d.holdScore(r.u, m.scores[i], now)
		}
	}
	if !d.overran {
		d.overruns = 0
	}
	d.releaseLanes()
	d.scoring, d.overran, d.passRefs = false, false, nil
}

// releaseLanes lets the lanes that awaited the pass in flight dispatch.
func (d *Engine) releaseLanes() {
	for _, l := range d.passLanes {
		if l.awaitPass == d.passID {
			l.awaiting, l.awaitPass = false, 0
		}
	}
	d.passLanes = nil
}

// scoreOverrun handles a pass that took longer than CallbackTimeout: the
// units it has not scored hold the default score.
func (d *Engine) scoreOverrun(m msgScoreOverrun) {
	if m.pass != d.passID || !d.scoring || d.overran {
		return
	}
	d.overran = true
	d.overruns++
	d.cbErrs.report("priority", "timeout", fmt.Sprintf("a scoring pass of %d units overran %v; default scores used until it returns",
		len(d.passRefs), d.cfg.CallbackTimeout), "consecutive_overruns", d.overruns)
	now := d.now()
	for i, r := range d.passRefs {
		if r.live() && !r.u.scored {
			d.holdScore(r.u, defaultScore, now)
			d.passRefs[i].gen = r.u.scoreGen // the late answer replaces it
		}
	}
	d.releaseLanes()
}

// holdScore gives u (in a lane) the score s from now on, and queues it for
// re-scoring once the score is PriorityTTL old.
func (x *unitIndex) holdScore(u *unit, s float64, now time.Time) {
	u.scoreGen++
	u.score, u.scored, u.scoredAt = s, true, now.UnixNano()
	l := u.lane
	l.units.Fix(int(u.laneIdx))
	x.laneChanged(l)
	l.stale.push(unitRef{u, u.scoreGen})
}

// staleDue reports whether l's oldest held score is older than ttl.
func (l *lane) staleDue(now time.Time, ttl time.Duration) bool {
	for l.stale.len() > 0 {
		r := l.stale.front()
		if !r.live() {
			l.stale.pop()
			continue
		}
		return now.Sub(time.Unix(0, r.u.scoredAt)) >= ttl
	}
	return false
}

// takeStale moves l's held scores older than ttl, oldest first, to refs,
// up to scoreBatch in all, and reports whether it took any.
func (l *lane) takeStale(refs *[]unitRef, now time.Time, ttl time.Duration) bool {
	took := false
	for len(*refs) < scoreBatch && l.staleDue(now, ttl) {
		*refs = append(*refs, l.stale.pop())
		took = true
	}
	return took
}

// dropScoring empties l's scoring queues, which hold only units that left
// once l has no units.
func (l *lane) dropScoring() {
	l.fresh, l.stale = fifo[unitRef]{}, fifo[unitRef]{}
}

// fifo is a first-in first-out queue whose memory follows its length.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) push(x T) { q.items = append(q.items, x) }

func (q *fifo[T]) front() T { return q.items[q.head] }

func (q *fifo[T]) pop() T {
	var zero T
	x := q.items[q.head]
	q.items[q.head] = zero
	q.head++
	if n := q.len(); n == 0 {
		q.items, q.head = q.items[:0], 0
		if cap(q.items) > 64 {
			q.items = nil
		}
	} else if 2*q.head >= len(q.items) && q.head >= 32 {
		q.items = append(make([]T, 0, 2*n), q.items[q.head:]...)
		q.head = 0
	}
	return x
}
