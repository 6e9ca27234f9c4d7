package engine

// Time and timers of the dispatcher: its scheduling timeline (monotonic)
// against the wall clock, and the timer heap that wakes it for due units,
// deadlines, graces, retention passes and the other timed work. Owned by
// the dispatcher goroutine (now and wall are safe anywhere).

import (
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/heaps"
)

// timeline is the dispatcher's scheduling clock and its timer heap.
type timeline struct {
	clock clock.Clock
	// started is when this owner started, on the wall clock and on the
	// scheduling timeline (startMono); monoBase turns monotonic readings
	// into that timeline (see now). All three are fixed at creation, so
	// any goroutine may read them.
	started   time.Time
	startMono time.Time
	monoBase  time.Time
	timers    *heaps.Heap[*timerEntry]
	timerN    uint64
	// timer is armed for the earliest entry, at armedAt.
	timer   clock.Timer
	armedAt time.Time
}

func newTimeline(clk clock.Clock) timeline {
	t := timeline{clock: clk, started: clk.Now()}
	// The scheduling timeline reads as the wall clock at the start, then
	// moves with the monotonic clock only.
	t.monoBase = t.started.Round(0).Add(-clk.Monotonic())
	t.startMono = t.now()
	t.timers = heaps.New(func(a, b *timerEntry) bool {
		if !a.at.Equal(b.at) {
			return a.at.Before(b.at)
		}
		return a.n < b.n
	}, func(e *timerEntry, i int) { e.idx = i })
	return t
}

// arm sets the timer for the earliest entry and returns its channel, or nil
// (which never fires) when the heap is empty.
func (t *timeline) arm() <-chan time.Time {
	if t.timers.Len() == 0 {
		return nil
	}
	next := t.timers.Peek().at
	if t.timer == nil {
		t.timer = t.clock.NewTimer(next.Sub(t.now()))
	} else if !next.Equal(t.armedAt) {
		t.timer.Reset(next.Sub(t.now()))
	}
	t.armedAt = next
	return t.timer.C()
}

// fired records that the armed timer fired.
func (t *timeline) fired() { t.armedAt = time.Time{} }

func (t *timeline) stopTimer() {
	if t.timer != nil {
		t.timer.Stop()
	}
}

type timerKind uint8

const (
	tUnitDue     timerKind = iota
	tDeadline              // a run's timeout
	tGrace                 // a cancelled run's grace period ends
	tStartBy               // a rate-limited run's start is counted at the latest
	tGhost                 // an earlier owner's run's lease ends
	tPrune                 // time for a retention pass
	tResource              // a resource may have room again
	tStatus                // a coalesced service_status is due
	tEvict                 // a keyed service may be idle
	tDepDeadline           // a unit's DependencyTimeout
	tRecheck               // ask DependencySatisfied again
	tFeed                  // call Feed again
	tProgress              // a run's throttled progress is due
	tQueueStatus           // time for a queue_status event
	tBudgets               // the budget gauges' view may be refreshed
	tBatch                 // a lane's waiting batch is due
)

type timerEntry struct {
	at    time.Time
	n     uint64 // tie-break: insertion order
	kind  timerKind
	u     *unit
	gen   uint32
	r     *run
	res   *resource
	ghost *ghost
	l     *lane
	idx   int
}

func (t *timeline) pushTimer(e *timerEntry) {
	t.timerN++
	e.n = t.timerN
	t.timers.Push(e)
}

// dropTimer removes e from the timer heap if it is still there.
func (t *timeline) dropTimer(e *timerEntry) {
	if e != nil && e.idx >= 0 && e.idx < t.timers.Len() && t.timers.Items()[e.idx] == e {
		t.timers.Remove(e.idx)
	}
}

// fireTimers handles the timers that are due. Timer entries are on the
// monotonic timeline (d.now); what the handlers record is wall-clock time.
func (d *Engine) fireTimers() {
	now, wall := d.now(), d.wall()
	for d.timers.Len() > 0 && !d.timers.Peek().at.After(now) {
		e := d.timers.Pop()
		d.activity.Add(1)
		switch e.kind {
		case tUnitDue:
			if e.u.state == uWaiting && e.gen == e.u.timerGen {
				e.u.runAt = time.Time{}
				d.makeEligible(e.u)
			}
		case tDeadline:
			d.deadlinePassed(e.r, wall)
		case tStartBy:
			// Its Runner reported no start by then: it counts as started
			// at startBy, the latest instant it can affect. A run still
			// claiming was never handed to its Runner: it cannot have
			// started, and will not (claimed).
			if r := e.r; r.startByTimer == e {
				r.startByTimer = nil
				if r.state != runClaiming {
					d.settleReservations(r, r.startBy, d.toWall(r.startBy))
				}
			}
		case tGhost:
			if g := e.ghost; d.ghosts[g.id] == g && g.timer == e {
				d.leaseExpired(g)
			}
		case tGrace:
			if r := e.r; !r.over() {
				d.conclude(r, ending{err: ErrCancelled, cancelled: r.cancelled, at: wall})
			}
		case tPrune:
			d.prune(wall)
		case tResource:
			if e.at.Equal(e.res.timerAt) {
				e.res.timerAt = time.Time{}
				d.markStatus(e.res)
				d.wake(e.res)
			}
		case tStatus:
			e.res.statusTimer = false
			d.markStatus(e.res)
		case tBudgets:
			d.budgetsTimer = false // flushStatus refreshes the view, now due
		case tEvict:
			d.maybeEvict(e.res)
		case tDepDeadline:
			d.dependencyTimeout(e.u, wall)
		case tRecheck:
			if d.units[e.u.id] == e.u && e.u.state == uChecking && (e.u.more == nil || !e.u.more.checking) {
				d.requestCheck(e.u)
			}
		case tFeed:
			d.feedWait = false
		case tProgress:
			d.emitProgress(e.r)
		case tQueueStatus:
			d.queueStatus()
		case tBatch:
			d.batchDueNow(e)
		}
	}
}

// now returns the current instant on the dispatcher's scheduling timeline:
// the clock's monotonic reading, as a time.Time that read as the wall clock
// when the dispatcher started. Every duration the dispatcher measures
// (timers, rate windows, circuit cooldowns, holds) is on this timeline, so
// a step of the wall clock changes none of them. It is safe to call from
// any goroutine.
func (t *timeline) now() time.Time { return t.monoBase.Add(t.clock.Monotonic()) }

// wall returns the wall-clock time: what is stored and reported.
func (t *timeline) wall() time.Time { return t.clock.Now() }

// toWall converts an instant of the scheduling timeline to the wall clock
// as it reads now; fromWall converts back. The zero time stays zero.
func (t *timeline) toWall(at time.Time) time.Time {
	if at.IsZero() {
		return at
	}
	return t.wall().Add(at.Sub(t.now()))
}

func (t *timeline) fromWall(at time.Time) time.Time {
	if at.IsZero() {
		return at
	}
	return t.now().Add(at.Sub(t.wall()))
}
