package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/inbox"
	"github.com/runcue/runcue/store"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Dependencies: when a unit's dependencies are done (the store says so),
// DependencySatisfied checks on the checker goroutine, dependency
// deadlines, and the release of dependents when an end commits.

// depGraph records who waits for whom. dependents maps a unit to the units
// waiting for it to complete; finishing holds units whose terminal outcome
// is decided but not committed: their dependents wait for the commit.
// checks feeds the checker goroutine (DependencySatisfied calls).
//
// Its methods reach, besides its own fields, the unit index it embeds (and
// what that embeds).
type depGraph struct {
	*unitIndex

	dependents map[string][]*unit
	finishing  map[string]struct{}
	checks     *inbox.Inbox[checkJob]
}

// checkDependency runs f for one dependency with a timeout. A timeout, a
// panic or an error counts as not satisfied. The call runs on its own
// goroutine so that a callback that ignores its context cannot hold the
// caller past the timeout; such a goroutine ends when the callback returns.
func checkDependency(f func(context.Context, rt.Dependency) (bool, error), dep rt.Dependency, timeout time.Duration) (ok bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	type answer struct {
		ok  bool
		err error
	}
	res := make(chan answer, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				res <- answer{err: fmt.Errorf("%w: %v", errCallbackPanic, v)}
			}
		}()
		ok, err := f(ctx, dep)
		res <- answer{ok: ok && err == nil, err: err}
	}()
	select {
	case a := <-res:
		return a.ok, a.err
	case <-ctx.Done():
		return false, fmt.Errorf("%w: no answer within %v", errCallbackTimeout, timeout)
	}
}

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
// unknown dependencies at once, on the reader goroutine; meanwhile the
// units are blocked, and the ends the loop sees are noted (noteEnded) so
// that the answer, read before them, is not taken for the present.
func (d *Engine) resolveDeps(units []*unit) {
	if len(units) == 0 {
		return
	}
	var unknown []string
	seen := map[string]bool{}
	for _, u := range units {
		for _, dep := range u.deps() {
			if !seen[dep] && !d.holds(dep) {
				seen[dep] = true
				unknown = append(unknown, dep)
			}
		}
	}
	if len(unknown) == 0 {
		for _, u := range units {
			d.waitDeps(u, nil)
		}
		return
	}
	for _, u := range units {
		u.state = uBlocked // until the answer
	}
	d.read(func(ctx context.Context) func(*Engine) {
		states, err := d.st.UnitStates(ctx, unknown)
		return func(d *Engine) {
			if err != nil {
				// Without an answer nothing may start: treat them as
				// pending. A unit so blocked waits until the next owner's
				// start.
				d.log.Error("runcue: read dependencies' states; their dependents wait", "dependencies", len(unknown), "error", err)
				states = make(map[string]store.State, len(unknown))
				for _, dep := range unknown {
					states[dep] = store.Queued
				}
			}
			// Every end seen since the read was asked counts, not only
			// those of the dependencies asked about: a dependency held
			// then may have ended since, and a skipped one must be told
			// from a completed one.
			for id, st := range d.ended {
				states[id] = st
			}
			for _, u := range units {
				if d.units[u.id] != u {
					continue // gone meanwhile
				}
				d.waitDeps(u, states)
			}
		}
	})
}

// waitDeps files u as waiting for its dependencies that have not completed
// (see resolveDeps); states holds the store's answer for dependencies this
// Cue does not hold, and the ends seen while it was read. A dependency
// neither held nor in states is complete: it ended before u was filed, and
// was not failed, cancelled or skipped (those are in states).
func (d *Engine) waitDeps(u *unit, states map[string]store.State) {
	m := u.ext()
	m.pending = 0
	var dead string
	var deadState store.State
	for _, dep := range m.deps {
		if d.holds(dep) {
			m.pending++
			d.dependents[dep] = append(d.dependents[dep], u)
			continue
		}
		switch st := states[dep]; st {
		case store.Queued, store.Running:
			m.pending++
			d.dependents[dep] = append(d.dependents[dep], u)
		case store.Failed, store.Cancelled:
			dead, deadState = dep, st
		case store.Skipped:
			if d.failsOnSkip(u) {
				if dead == "" {
					dead, deadState = dep, st
				}
			} else {
				u.noteSkipped(dep)
			}
		}
	}
	if dead != "" {
		// A dependency ended badly but u is queued (it was requeued on its
		// own, say): u cannot run; fail it as the store fails dependents.
		d.failDependent(u, dead, deadState)
		return
	}
	if !m.depsBy.IsZero() {
		d.dropTimer(m.depTimer)
		m.depTimer = &timerEntry{at: d.fromWall(m.depsBy), kind: tDepDeadline, u: u}
		d.pushTimer(m.depTimer)
	}
	if m.pending > 0 {
		u.state = uBlocked
		return
	}
	d.depsDone(u)
}

// failDependent fails queued unit u because its dependency dep is failed,
// cancelled or (when u's task says so) skipped, propagating to u's own
// dependents.
func (g *depGraph) failDependent(u *unit, dep string, st store.State) {
	for _, other := range u.deps() {
		if ws := g.dependents[other]; ws != nil {
			g.dependents[other] = slices.DeleteFunc(ws, func(w *unit) bool { return w == u })
		}
	}
	g.removeQueued(u)
	kind := "prerequisite_failed"
	switch st {
	case store.Cancelled:
		kind = "prerequisite_cancelled"
	case store.Skipped:
		kind = "prerequisite_skipped"
	}
	msg := fmt.Sprintf("dependency %s is %s", dep, st)
	g.persist(&store.FailQueued{Epoch: g.epoch, ID: u.id, At: g.wall(), Error: msg, ErrorKind: kind,
		Events: []store.Event{{Type: store.TypeWorkFailed, Task: u.task, Target: u.target, Data: store.EventData{Error: msg, ErrorKind: kind}.Encode()}}})
}

// holds reports whether this Cue holds unit id: queued, waiting or running
// here, finishing without a commit yet, or queued with an unregistered task.
func (g *depGraph) holds(id string) bool {
	if _, ok := g.units[id]; ok {
		return true
	}
	if _, ok := g.finishing[id]; ok {
		return true
	}
	for _, o := range g.orphans {
		if _, ok := o[id]; ok {
			return true
		}
	}
	return false
}

// waiting reports whether u waits for dep.
func (g *depGraph) waiting(u *unit, dep string) bool {
	return slices.Contains(g.dependents[dep], u)
}

// depsDone is called when u's dependencies have all completed.
func (d *Engine) depsDone(u *unit) {
	if d.cfg.DependencySatisfied == nil {
		d.makeEligible(u)
		return
	}
	u.state = uChecking
	d.requestCheck(u)
}

// settled handles the commit of a unit's terminal outcome.
func (d *Engine) settled(id string, state store.State, applied bool) {
	delete(d.finishing, id)
	if applied {
		d.noteEnded(id, state)
	}
	waiting := d.dependents[id]
	delete(d.dependents, id)
	if !applied || (state != store.Completed && state != store.Skipped) {
		return // failed or cancelled dependents were failed with it, in the store
	}
	for _, u := range waiting {
		if d.units[u.id] != u || u.state != uBlocked {
			continue // gone meanwhile
		}
		if state == store.Skipped {
			if d.failsOnSkip(u) {
				d.failDependent(u, id, state)
				continue
			}
			u.noteSkipped(id)
		}
		m := u.ext()
		if m.pending--; m.pending == 0 {
			d.depsDone(u)
		}
	}
}

// failsOnSkip reports whether u fails when a dependency of it is skipped
// (its task's FailOnSkippedDependency).
func (g *depGraph) failsOnSkip(u *unit) bool {
	t := g.tasks[u.task]
	return t != nil && t.spec.FailOnSkippedDependency
}

type checkJob struct {
	id   string
	deps []string
}

// requestCheck asks DependencySatisfied about u's dependencies, on the
// checker goroutine.
func (d *Engine) requestCheck(u *unit) {
	if d.checks == nil {
		d.checks = inbox.New[checkJob]()
		d.aux.Go(d.checker)
	}
	m := u.ext()
	m.checking = true
	d.helperStart()
	d.checks.Push(checkJob{id: u.id, deps: m.deps})
}

// checker runs dependency checks until the dispatcher exits.
func (d *Engine) checker() {
	d.checks.Serve(d.auxStop, func(jobs []checkJob) {
		// The callback sees each dependency's task and target: read them,
		// once for the batch (a dependency no longer stored is passed with
		// its ID alone).
		var ids []string
		for _, job := range jobs {
			ids = append(ids, job.deps...)
		}
		deps := make(map[string]rt.Dependency, len(ids))
		if units, err := d.st.ListUnits(d.auxCtx, store.ListFilter{IDs: ids, Limit: len(ids)}); err == nil {
			for _, u := range units {
				deps[u.ID] = rt.Dependency{ID: u.ID, Task: u.Task, Target: u.Target}
			}
		} else if d.auxCtx.Err() != nil {
			return // the dispatcher is exiting: no answer is wanted
		} else {
			d.log.Warn("runcue: read dependencies for DependencySatisfied; asking with their IDs alone", "units", len(jobs), "error", err)
		}
		for _, job := range jobs {
			d.in.Push(msgChecked{id: job.id, ok: d.askDependencies(job, deps)})
			d.helperDone()
		}
	})
}

// askDependencies asks DependencySatisfied about each of job's dependencies, in
// order, until one is not satisfied; deps holds what is known of them.
func (d *Engine) askDependencies(job checkJob, deps map[string]rt.Dependency) bool {
	f, timeout := d.cfg.DependencySatisfied, d.cfg.CallbackTimeout
	for _, id := range job.deps {
		dep, found := deps[id]
		if !found {
			dep = rt.Dependency{ID: id}
		}
		t0 := time.Now()
		sat, err := checkDependency(f, dep, timeout)
		d.tel.callbackDur.Record(bg, time.Since(t0).Seconds(), metric.WithAttributes(attribute.String("outcome", "dependency")))
		if err != nil {
			reason := "error"
			switch {
			case errors.Is(err, errCallbackPanic):
				reason = "panic"
			case errors.Is(err, errCallbackTimeout):
				reason = "timeout"
			}
			d.cbErrs.report("dependency", reason, err.Error(), "work_id", job.id, "dependency", id)
		}
		if !sat {
			return false
		}
	}
	return true
}

func (d *Engine) checked(id string, ok bool) {
	u := d.units[id]
	if u == nil || u.state != uChecking {
		return
	}
	m := u.ext()
	m.checking = false
	if ok {
		d.makeEligible(u)
		return
	}
	d.dropTimer(m.recheck)
	m.recheck = &timerEntry{at: d.now().Add(d.cfg.DependencyRecheck), kind: tRecheck, u: u}
	d.pushTimer(m.recheck)
}

// failUnfit fails queued unit u, which r can never admit (why).
func (g *depGraph) failUnfit(u *unit, r *resource, why string) {
	g.removeQueued(u)
	msg := fmt.Sprintf("%s: %s", r.name, why)
	g.persist(&store.FailQueued{Epoch: g.epoch, ID: u.id, At: g.wall(), Error: msg, ErrorKind: "cost_too_large",
		Events: []store.Event{{Type: store.TypeWorkFailed, Task: u.task, Target: u.target,
			Data: store.EventData{Error: msg, ErrorKind: "cost_too_large"}.Encode()}}})
}

// dependencyTimeout fails a unit whose dependencies were not satisfied by
// its DependencyTimeout.
func (g *depGraph) dependencyTimeout(u *unit, now time.Time) {
	if g.units[u.id] != u || (u.state != uBlocked && u.state != uChecking) {
		return
	}
	g.removeQueued(u)
	msg := "dependencies not satisfied within the dependency timeout"
	g.persist(&store.FailQueued{Epoch: g.epoch, ID: u.id, At: now, Error: msg, ErrorKind: "dependency_timeout",
		Events: []store.Event{{Type: store.TypeWorkFailed, Task: u.task, Target: u.target,
			Data: store.EventData{Error: msg, ErrorKind: "dependency_timeout"}.Encode()}}})
}
