package runcue

import (
	"context"
	"fmt"
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Priority: scoring only the units that could run now, off the loop with
// a timeout, with cached scores, and dispatching the best.

// scorer caches priority scores by unit; scoring is set while a scoring
// pass runs on its helper goroutine, overruns counts consecutive passes
// that overran.
type scorer struct {
	scores   map[string]scoreEntry
	scoring  bool
	overruns int
}

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
	for d.inflight < d.cfg.MaxConcurrent {
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
		spent := d.acquire(l, now, best.probes)
		if l.units.Len() == 0 && l.inReady {
			d.ready.Remove(l.idx)
			l.inReady = false
		} else if l.inReady {
			d.ready.Fix(l.idx)
		}
		d.start(best.u, l, now, best.probes, spent)
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

func (s *scorer) scoreOf(u *unit) float64 {
	if e, ok := s.scores[u.id]; ok {
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
		if e, ok := d.scores[c.u.id]; !ok || now.Sub(e.at) >= d.cfg.PriorityTTL {
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
			if r.Limit > 0 {
				p = min(1, float64(r.Active)/float64(r.Limit))
			}
			j.pressure[r.name] = p
		}
		jobs[i] = j
	}
	results := make(chan map[string]float64, 1)
	progress := make(chan struct{}) // closed when the pass finishes
	go d.scorePass(jobs, queued, results, progress)
	timer := time.NewTimer(d.cfg.CallbackTimeout)
	defer timer.Stop()
	select {
	case res := <-results:
		d.storeScores(res)
		d.overruns = 0
	case <-timer.C:
		d.scoring = true
		d.overruns++
		d.cbErrs.report("priority", "timeout", fmt.Sprintf("a scoring pass of %d units overran %v; cached or default scores used",
			len(jobs), d.cfg.CallbackTimeout), "consecutive_overruns", d.overruns)
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
			if su, err := d.st.GetUnit(context.Background(), j.w.ID); err == nil {
				j.w.Params = su.Params
			}
		}
		t0 := time.Now()
		s, reason, detail := score(d.cfg.Priority, PriorityContext{Work: j.w, QueueDepth: queued, ServicePressure: j.pressure, WaitTime: j.wait})
		d.tel.callbackDur.Record(bg, time.Since(t0).Seconds(), metric.WithAttributes(attribute.String("outcome", "priority")))
		d.stats.priorityCalls.Add(1)
		if reason != "" {
			d.cbErrs.report("priority", reason, detail, "work_id", j.w.ID, "task_type", j.w.Task, "score_used", s)
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
