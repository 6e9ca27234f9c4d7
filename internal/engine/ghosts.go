package engine

import (
	"context"
	"slices"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// Ghosts: runs an earlier owner left running whose leases still hold when
// this owner starts (store.Recover's Held). That owner took ownership at an
// older epoch and can no longer write, but it may be alive (a paused VM, a
// partitioned host) and its handler calling the service: until the run's
// lease expires, it counts against its task's cap and its services'
// concurrency (its start is in the service log, so its windows and budgets
// count it already). At the lease's end the engine asks the store to
// recover it (Recover with Only), and loads it if it came back queued.

// ghost is a run left by an earlier owner, held until its lease expires.
type ghost struct {
	id    string
	lane  *lane // nil: its task is not registered here, so it holds nothing
	costs rt.Costs
	timer *timerEntry
}

// ghostTable holds the ghosts by unit ID. Owned by the dispatcher goroutine.
type ghostTable struct {
	ghosts map[string]*ghost
}

// haunt holds su, a run an earlier owner left running, until its lease
// expires.
func (d *Engine) haunt(su *store.Unit) {
	if d.ghosts == nil {
		d.ghosts = make(map[string]*ghost)
	}
	g := &ghost{id: su.ID, costs: rt.Costs(su.Costs)}
	if rt := d.tasks[su.Task]; rt != nil {
		u := d.build(su)
		d.deriveKeys(u, rt)
		l := rt.base
		if m := u.more; m != nil && (len(m.keys) > 0 || m.keyErr != nil) {
			l = d.laneFor(rt, m.keys, m.keyErr, m.batch)
		}
		if l.keyErr == nil {
			g.lane = l
			l.running++
			now := d.now()
			for _, r := range l.resources {
				// Its slot only: its start is counted from the service log.
				r.Take(now, false, g.costs)
				r.Release(g.costs)
				d.markStatus(r)
			}
		}
	}
	g.timer = &timerEntry{at: d.fromWall(su.LeaseExpiresAt), kind: tGhost, ghost: g}
	d.pushTimer(g.timer)
	d.ghosts[g.id] = g
}

// leaseExpired asks the store to recover ghost g, whose lease has ended.
func (d *Engine) leaseExpired(g *ghost) {
	op := &store.Recover{Epoch: d.epoch, At: d.wall(), PreviousDead: false, Only: []string{g.id}}
	d.enqueue(&writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
		m := msgGhost{g: g, err: err}
		if err == nil {
			m.res = res[0]
		}
		d.in.Push(m)
	}})
}

// exorcised handles the store's answer for ghost g: it lets go of its slot
// and loads its unit if it came back queued, or holds it again if its
// lease was extended meanwhile.
func (d *Engine) exorcised(m msgGhost) {
	g := m.g
	switch {
	case m.err != nil:
		return // the store failed: nothing more is dispatched
	case m.res.Err != nil:
		d.noteNotOwner(m.res.Err)
		return
	case slices.Contains(m.res.Held, g.id):
		// Still leased (a heartbeat of its owner extended it before this
		// owner's epoch): look again when that lease ends.
		d.read(func(ctx context.Context) func(*Engine) {
			su, err := d.st.GetUnit(ctx, g.id)
			return func(d *Engine) {
				at := d.now().Add(time.Minute)
				if err == nil && su.State == store.Running {
					at = d.fromWall(su.LeaseExpiresAt)
				}
				g.timer = &timerEntry{at: at, kind: tGhost, ghost: g}
				d.pushTimer(g.timer)
			}
		})
		return
	}
	d.letGo(g)
	if slices.Contains(m.res.IDs, g.id) {
		d.read(func(ctx context.Context) func(*Engine) {
			units, err := d.st.ListUnits(ctx, store.ListFilter{IDs: []string{g.id}, States: []store.State{store.Queued}, Limit: 1})
			return func(d *Engine) {
				if err != nil {
					d.log.Error("runcue: load a unit recovered from an earlier owner", "work_unit_id", g.id, "error", err)
					return
				}
				d.addUnits(units)
			}
		})
	}
	d.applyEnded(m.res.Events)
}

// letGo releases what ghost g holds.
func (d *Engine) letGo(g *ghost) {
	delete(d.ghosts, g.id)
	d.dropTimer(g.timer)
	if l := g.lane; l != nil {
		g.lane = nil
		d.release(l, g.costs)
	}
}

// adopt makes su, a run an earlier owner handed to a Runner whose runs
// outlive it (an Adopter: an executor's), a run of this engine: it holds
// its services' slots (its start is counted from the service log), ends
// at its deadline if its Runner is silent, and its end is decided and
// recorded here, under the lease name its claim wrote. It reports false,
// having changed nothing, when su cannot be adopted (its task is not
// registered here, or its keys cannot be derived): it is then a ghost.
func (d *Engine) adopt(su *store.Unit) bool {
	rt := d.tasks[su.Task]
	if rt == nil {
		return false
	}
	a, ok := rt.spec.Runner.(Adopter)
	if !ok || su.LeasedBy == "" {
		return false
	}
	u := d.index(su)
	if u == nil {
		return false
	}
	l := rt.base
	if m := u.more; m != nil && (len(m.keys) > 0 || m.keyErr != nil) {
		l = d.laneFor(rt, m.keys, m.keyErr, m.batch)
	}
	if l.keyErr != nil {
		d.forget(u)
		return false
	}
	now := d.now()
	costs := u.costs()
	l.running++
	for _, res := range l.resources {
		res.Take(now, false, costs)
		res.Release(costs)
		d.markStatus(res)
	}
	u.state = uRunning
	timeout := rt.spec.Timeout
	if u.more != nil && u.more.timeout > 0 {
		timeout = u.more.timeout
	}
	if timeout <= 0 {
		timeout = d.cfg.DefaultTimeout
	}
	start := su.StartedAt
	r := &run{d: d, u: u, lane: l, no: su.Runs, start: start, deadline: start.Add(timeout), state: runLaunched}
	ctx, span := d.tel.startSpan(context.Background(), u.traceCtx(), u.task, u.id, r.no)
	r.span = span
	r.pub = Run{ID: u.id, Task: u.task, Target: u.target, Attempt: r.no, Deadline: r.deadline, Ctx: ctx,
		Owner: su.LeasedBy, Epoch: d.epoch, Adopted: true, r: r}
	d.runs[u.id] = r
	d.inflight++
	d.live++
	d.activity.Add(1)
	r.mem.deadline = timerEntry{at: d.fromWall(r.deadline), kind: tDeadline, r: r}
	r.deadlineTimer = &r.mem.deadline
	d.pushTimer(r.deadlineTimer)
	a.Adopt(&r.pub)
	return true
}
