package engine

import "github.com/runcue/runcue/store"

// Task registrations as the dispatcher sees them: per task its cap, its
// services, its base lane and its metric attributes, refreshed from the
// Cue's registry (msgRegistry).

// taskTable is the registry as the dispatcher holds it.
type taskTable struct {
	tasks map[string]*taskRT
	regs  map[string]store.ServiceDef // registered limits, from the last msgRegistry
	// pausedTasks and queuePaused are the stored pauses in force (see
	// applyPauses); a paused task's cap refuses every dispatch.
	pausedTasks map[string]bool
	queuePaused bool
	// remote: a task runs in executors, whose runs an earlier owner
	// assigned may start after this owner took over (adopted): the
	// service log's entries are not clamped to this owner's start.
	remote bool
}

type taskRT struct {
	name     string
	spec     *TaskSpec
	cap      *resource
	services []*resource
	base     *lane // the lane of units without keyed services
	// attrs and byOutcome are the task's metric attributes, built once.
	attrs     metricOpts
	byOutcome map[string]metricOpts
}

func (rt *taskRT) outcomeAttrs(outcome string) metricOpts {
	o, ok := rt.byOutcome[outcome]
	if !ok {
		o = taskOutcome(rt.name, outcome)
		rt.byOutcome[outcome] = o
	}
	return o
}

// refreshRegistry brings the dispatcher's view of tasks and services up to
// date with the Cue's registrations, and adopts orphans whose task type is
// now registered.
func (d *Engine) refreshRegistry(services map[string]store.ServiceDef, tasks map[string]*TaskSpec) {
	now := d.now()
	for _, t := range tasks {
		d.remote = d.remote || t.Remote
	}
	for name, s := range services {
		d.regs[name] = s
	}
	for name, s := range services {
		if _, ok := d.services[name]; !ok {
			d.services[name] = d.newServiceResource(name, name, s, now)
		}
	}
	for name, t := range tasks {
		if _, ok := d.tasks[name]; ok {
			continue
		}
		rt := &taskRT{name: name, spec: t, cap: d.newResource("task "+name, "", t.MaxConcurrent),
			attrs: taskAttr(name), byOutcome: map[string]metricOpts{}}
		rt.cap.Paused = d.pausedTasks[name]
		rt.cap.NoRunner = t.Remote // until its Runner tells its executors' room
		for _, s := range t.Services {
			rt.services = append(rt.services, d.services[s])
		}
		d.tasks[name] = rt
		rt.base = d.laneFor(rt, nil, nil, "")
		if t.Sequence != nil && t.HoldOnFailure {
			d.readHolders(rt)
		}
		if orphans := d.orphans[name]; orphans != nil {
			delete(d.orphans, name)
			var withDeps []*unit
			for _, u := range orphans {
				d.deriveKeys(u, rt)
				d.units[u.id] = u
				d.joinSequence(u, rt) // all of them before any is eligible
			}
			for _, u := range orphans {
				if len(u.deps()) > 0 {
					withDeps = append(withDeps, u)
				} else {
					d.makeEligible(u)
				}
			}
			d.resolveDeps(withDeps)
		}
	}
}

// setRoom holds task's cap at room, what the live executors that run it
// have room for (negative: no bound of theirs), under its MaxConcurrent; a
// room of zero refuses its dispatches (no executor).
func (d *Engine) setRoom(task string, room int) {
	rt := d.tasks[task]
	if rt == nil {
		return
	}
	c := rt.cap
	limit := rt.spec.MaxConcurrent
	c.roomed = room >= 0 && (limit == 0 || room < limit)
	if c.roomed {
		limit = room
	}
	if c.Limit == limit && c.NoRunner == (room == 0) {
		return
	}
	c.Limit, c.NoRunner = limit, room == 0
	d.markStatus(c)
	d.wakeAll(c)
}
