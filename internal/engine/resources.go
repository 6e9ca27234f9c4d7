package engine

import (
	"log/slog"
	"slices"
	"strings"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/internal/heaps"
	"github.com/runcue/runcue/store"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Admission: resources and lanes, the one refusal rule, taking and giving
// back capacity, parking lanes on a busy resource and waking them, rate
// windows rebuilt at recovery, and limits changed at run time. Owned by
// the dispatcher goroutine.

// resourceTable holds the resources (registered services, keyed service
// instances created on demand) and the lanes that use them, with the ready
// lanes by their oldest unit.
//
// Its methods reach, besides its own fields, only what it embeds: the
// dispatcher's environment, its timeline, its status board and its task
// table (read only), and persist, which hands an op to the writer.
type resourceTable struct {
	*env
	*timeline
	*statusBoard
	*taskTable
	persist func(...store.Op)

	services map[string]*resource
	keyed    map[string]*resource
	lanes    map[string]*lane
	ready    *heaps.Heap[*lane]
	// freshLanes are the lanes with units to score, listed when they were
	// ready (priority.go).
	freshLanes fifo[*lane]
	// stored is the persisted state of services (circuits, limits), by
	// name. classLogs caches, per class of keyed services, the log entries
	// of the previous owner (see priorLog).
	stored    map[string]store.ServiceRecord
	classLogs map[string]map[string][]store.Logged
	// shares are the fair classes' virtual times, by class (shares.go).
	shares map[string]*shareState
	// unmatched lists, by class, the amounts runs reported that no meter
	// of the class counts (see checkReported).
	unmatched map[string][]string
	// limitsGen counts the changes of limits applied at run time: a lane
	// whose loggedGen differs lists its logged resources again.
	limitsGen uint64
}

func newResourceTable(env *env, tl *timeline, board *statusBoard, tasks *taskTable, persist func(...store.Op),
	stored []store.ServiceRecord) resourceTable {
	t := resourceTable{env: env, timeline: tl, statusBoard: board, taskTable: tasks, persist: persist, services: make(map[string]*resource), keyed: make(map[string]*resource),
		lanes: make(map[string]*lane), stored: make(map[string]store.ServiceRecord),
		classLogs: make(map[string]map[string][]store.Logged), shares: make(map[string]*shareState)}
	for _, rec := range stored {
		t.stored[rec.Name] = rec
	}
	t.ready = heaps.New(t.laneBefore, func(l *lane, i int) { l.idx = i })
	return t
}

// resource is a broker.Resource (its admission state) with what the
// dispatcher keeps beside it: its name and class, its waiting lanes, its
// timer, its users and its status reporting.
type resource struct {
	broker.Resource
	name  string
	class string // the service whose limits apply; "" for a task cap
	// roomed: a task cap held at its executors' room (SetRoom).
	roomed bool
	// budgetSpecs are the Budgets that Resource.Budgets count, in order.
	budgetSpecs []store.BudgetDef
	// byPeriod are its metric attributes per budget period, built once.
	byPeriod map[rt.Period]metric.MeasurementOption
	keyed    bool
	waiters  *heaps.Heap[*lane]
	// timerAt is the pending wake-up timer, if any.
	timerAt time.Time
	// refs counts the lanes using a keyed instance, for eviction.
	refs int
	// status coalescing
	lastStatus  statusKey
	statusAt    time.Time
	statusTimer bool
	// svcAttrs is the metric attribute of its class, built once.
	svcAttrs metric.MeasurementOption
	// observed is, by amount, the instant of the latest report of the
	// service's limits it took (see observe).
	observed map[string]time.Time
	// aliases names, by a reported name a meter takes as an alias
	// (Meter.Aliases), the meter's amount.
	aliases map[string]string
	// adapt holds its adaptive limits' controllers (nil: not adaptive).
	adapt *adaptive
	// stated are the limits its provider stated, capped, by meter
	// (Meter.FromProvider; stated.go); nil until they are read.
	stated map[string]int64
	// finish is a keyed instance's virtual finish in its class's fair
	// shares, backlogged whether units of its waited at its last
	// dispatch; shareBy, weight and minimum are its class's Share and
	// its own Weight and MinConcurrent, as of its last applyLimits
	// (shares.go).
	finish     float64
	backlogged bool
	shareBy    string
	weight     float64
	minimum    int
}

func (r *resource) attrs() metric.MeasurementOption {
	if r.svcAttrs == nil {
		r.svcAttrs = metric.WithAttributes(attribute.String("service", r.class))
	}
	return r.svcAttrs
}

func (r *resource) periodAttrs(p rt.Period) metric.MeasurementOption {
	o, ok := r.byPeriod[p]
	if !ok {
		if r.byPeriod == nil {
			r.byPeriod = make(map[rt.Period]metric.MeasurementOption)
		}
		o = metric.WithAttributes(attribute.String("service", r.class), attribute.String("period", p.String()))
		r.byPeriod[p] = o
	}
	return o
}

func (t *resourceTable) newResource(name, class string, limit int) *resource {
	return &resource{Resource: broker.Resource{Cap: class == "", Limit: limit}, name: name, class: class,
		waiters: heaps.New(t.laneBefore, func(l *lane, i int) { l.idx = i })}
}

// lane is the queue of one task's units that need the same keyed
// services, in submission order. Owned by the dispatcher goroutine, like
// resource.
type lane struct {
	key       string
	task      *taskRT
	resources []*resource // the task cap, then services by name
	// logged are the service log entries of a start at cost one: one per
	// service and amount its meters count (rate windows, budgets), as of
	// limitsGen loggedGen (see loggedOf).
	logged    []store.LogEntry
	loggedGen uint64
	// services names its services (serviceNames).
	services []string
	units    *heaps.Heap[*unit]
	idx      int       // position in the ready heap or in parkedOn's waiters
	parkedOn *resource // nil when not parked
	inReady  bool
	running  int
	keyErr   error
	// With a priority function: units to score (fresh) and to re-score
	// (stale, oldest score first), and whether l is on freshLanes.
	fresh, stale fifo[unitRef]
	inFresh      bool
	// awaiting: l was woken with units to score and dispatches nothing
	// until the pass that scores them (awaitPass, once taken) answers.
	// rescore: l was woken with scores older than PriorityTTL, to be
	// re-scored by the next pass.
	awaiting  bool
	awaitPass uint64
	rescore   bool
	// fair is its keyed service whose class shares by Share (as of
	// limitsGen fairGen-1), nil for none; tag its virtual start and
	// underMin its key's being below MinConcurrent, when it last entered
	// a heap (shares.go).
	fair     *resource
	fairGen  uint64
	tag      float64
	underMin bool
	// batchTimer is l's entry on the timer heap while its batch waits
	// for more units (batches.go).
	batchTimer *timerEntry
}

// laneBefore orders lanes by their first unit: by submission, or with a
// priority function by unitBefore.
func (t *resourceTable) laneBefore(a, b *lane) bool {
	if before, ok := t.fairOrder(a, b); ok {
		return before // fair shares, among equal priorities
	}
	if t.cfg.Priority != nil {
		return unitBefore(a.units.Peek(), b.units.Peek())
	}
	return a.units.Peek().seq < b.units.Peek().seq
}

// unitLess orders a lane's units: by submission, or with a priority
// function by unitBefore.
func (t *resourceTable) unitLess() func(a, b *unit) bool {
	if t.cfg.Priority != nil {
		return unitBefore
	}
	return func(a, b *unit) bool { return a.seq < b.seq }
}

// effective returns the limits in force for service name: its override if
// one is stored, else its registration.
func (t *resourceTable) effective(name string) (store.ServiceDef, bool) {
	if s, ok := store.DecodeServiceDef(t.stored[name].Override); ok {
		return s, true
	}
	s, ok := t.regs[name]
	return s, ok
}

// limits returns the limits in force for resource name of class: a keyed
// instance's own override, else the class's (see effective).
func (t *resourceTable) limits(name, class string) (store.ServiceDef, bool) {
	if s, ok := store.DecodeServiceDef(t.stored[name].Override); ok && name != class {
		return s, true
	}
	return t.effective(class)
}

// pausedOf reports whether resource name of class is paused: its class
// is, or (a keyed instance) it is itself.
func (t *resourceTable) pausedOf(name, class string) bool {
	return t.stored[class].Paused || (name != class && t.stored[name].Paused)
}

// newServiceResource makes the resource of a service or keyed instance,
// with its persisted pause, circuit and Retry-After state, and its rate
// window rebuilt from the service log.
func (t *resourceTable) newServiceResource(name, class string, reg store.ServiceDef, now time.Time) *resource {
	s := reg
	if eff, ok := t.limits(name, class); ok {
		s = eff
	}
	r := t.newResource(name, class, s.MaxConcurrent)
	r.keyed = name != class
	r.Paused = t.pausedOf(name, class)
	t.applyLimits(r, s)
	for _, f := range t.hooks.Meters[class] {
		r.Extra = append(r.Extra, f())
	}
	if r.adapt.lowered() {
		t.publishAdaptGauges() // restored below a ceiling
	}
	if r.Counted() {
		t.restoreMeters(r, t.priorLog(name, class, s, extraHorizon(r), now), now)
	}
	if rec, ok := t.stored[name]; ok {
		if cs, ok := store.DecodeCircuitRecord(rec.Meters[store.MeterCircuit]); ok {
			t.restore(cs, r)
		}
	}
	r.CircuitChange() // the restored state is not a change
	return r
}

// applyLimits sets r's limits from s, keeping its window's entries and its
// circuit's state.
func (t *resourceTable) applyLimits(r *resource, s store.ServiceDef) {
	if r.class != "" && r.name != r.class {
		t.shareSettings(r, s)
	}
	s = t.statedLimits(r, s)
	s = t.adaptLimits(r, s)
	r.SetLimits(broker.Limits{Concurrency: s.MaxConcurrent, Rate: s.RateLimit, Window: s.RateWindow, Margin: margin(s), Pace: s.Pace,
		Threshold: s.CircuitThreshold, Timeout: s.CircuitTimeout})
	t.applyBudgets(r, s)
	var amounts []broker.AmountLimits
	r.aliases = nil
	for _, m := range s.Meters {
		amounts = append(amounts, broker.AmountLimits{Name: m.Name, Limit: m.Limit, Window: m.Window, Charge: chargeOf(m.Charge), Bucket: m.Bucket})
		for _, a := range m.Aliases {
			if r.aliases == nil {
				r.aliases = make(map[string]string, len(m.Aliases))
			}
			r.aliases[a] = m.Name
		}
	}
	r.SetAmounts(amounts, margin(s))
}

// laneFor returns (creating) the lane of a task's units with the given keyed
// services.
func (t *resourceTable) laneFor(rt *taskRT, keys []string, keyErr error, batch string) *lane {
	key := rt.name
	if len(keys) > 0 {
		key += "\x00" + strings.Join(keys, "\x00")
	}
	if batch != "" {
		key += "\x00#" + batch
	}
	if keyErr != nil {
		key += "\x00!"
	}
	if l, ok := t.lanes[key]; ok {
		return l
	}
	l := &lane{key: key, task: rt, keyErr: keyErr,
		units: heaps.New(t.unitLess(), func(u *unit, i int) { u.laneIdx = int32(i) })}
	l.resources = append(l.resources, rt.cap)
	svcs := slices.Clone(rt.services)
	if keyErr == nil {
		now := t.now()
		for _, k := range keys {
			r := t.keyed[k]
			if r == nil {
				class := k[:strings.IndexByte(k, ':')]
				r = t.newServiceResource(k, class, t.regs[class], now)
				t.keyed[k] = r
			}
			r.refs++
			svcs = append(svcs, r)
		}
	}
	slices.SortFunc(svcs, func(a, b *resource) int { return strings.Compare(a.name, b.name) })
	l.resources = append(l.resources, svcs...)
	l.loggedGen = t.limitsGen - 1 // listed at its first claim
	t.lanes[key] = l
	return l
}

// serviceNames returns the names of l's services (keyed instances
// included; the task cap is not a service), listed once.
func (l *lane) serviceNames() []string {
	if l.services == nil {
		l.services = make([]string, 0, len(l.resources))
		for _, r := range l.resources {
			if r.class != "" {
				l.services = append(l.services, r.name)
			}
		}
	}
	return l.services
}

// loggedOf returns what a start of a unit of costs on l logs: an entry
// per amount each of its services' meters count, with the unit's cost. A
// lane's entries at cost one are computed once per change of limits.
func (t *resourceTable) loggedOf(l *lane, costs rt.Costs) []store.LogEntry {
	if l.loggedGen != t.limitsGen {
		l.logged, l.loggedGen = nil, t.limitsGen
		var amounts []string
		for _, r := range l.resources {
			if r.class == "" {
				continue
			}
			for _, a := range r.Logs(amounts[:0]) {
				l.logged = append(l.logged, store.LogEntry{Service: r.name, Meter: a, Amount: 1})
			}
		}
	}
	if costs == nil {
		return l.logged
	}
	out := slices.Clone(l.logged)
	for i := range out {
		out[i].Amount = costs.Of(out[i].Meter)
	}
	return out
}

// maybeDropLane deletes an idle keyed lane, releasing its keyed services.
func (t *resourceTable) maybeDropLane(l *lane) {
	if l == l.task.base || l.units.Len() > 0 || l.running > 0 || l.inReady || l.parkedOn != nil {
		return
	}
	delete(t.lanes, l.key)
	for _, r := range l.resources {
		if r.keyed {
			r.refs--
			t.maybeEvict(r)
		}
	}
}

// maybeEvict forgets an idle keyed instance: nothing uses it, its window is
// empty, its circuit closed and no Retry-After holds it. If only its window
// keeps it, it is looked at again when the window empties.
func (t *resourceTable) maybeEvict(r *resource) {
	if !r.keyed || r.refs > 0 || r.waiters.Len() > 0 || t.keyed[r.name] != r {
		return
	}
	if quiet, recheck := r.Quiet(t.now()); !quiet {
		if !recheck.IsZero() {
			t.pushTimer(&timerEntry{at: recheck, kind: tEvict, res: r})
		}
		return
	}
	delete(t.keyed, r.name)
	delete(t.dirty, r)
}

// check reports whether r admits a dispatch of a unit of costs at now (see
// broker.Resource.Admit), and reports a circuit that turned half-open.
func (t *resourceTable) check(r *resource, now time.Time, costs rt.Costs, l *lane) (ok bool, until time.Time, probe bool) {
	t.syncBudgets(r)
	ok, until, probe = r.AdmitFor(now, costs, l)
	t.noteCircuit(r)
	return ok, until, probe
}

// reasons maps the broker's refusals to the reasons Explain and status
// report.
var reasons = [...]rt.ReasonKind{
	broker.RefusePaused:       rt.ReasonPaused,
	broker.RefuseNoRunner:     rt.ReasonNoExecutor,
	broker.RefuseBudget:       rt.ReasonBudgetExhausted,
	broker.RefuseRetryAfter:   rt.ReasonServiceRetryAfter,
	broker.RefuseCircuitOpen:  rt.ReasonCircuitOpen,
	broker.RefuseCircuitProbe: rt.ReasonCircuitProbe,
	broker.RefuseTaskCap:      rt.ReasonTaskCap,
	broker.RefuseBusy:         rt.ReasonServiceBusy,
	broker.RefuseRateLimited:  rt.ReasonRateLimited,
	broker.RefuseMeter:        rt.ReasonMeterFull,
}

// admit checks every resource of l for a unit of costs; it returns the
// first that refuses.
func (t *resourceTable) admit(l *lane, now time.Time, costs rt.Costs) (blocker *resource, until time.Time, probes []*resource) {
	for _, r := range l.resources {
		ok, u, probe := t.check(r, now, costs, l)
		if !ok {
			return r, u, nil
		}
		if probe {
			probes = append(probes, r)
		}
	}
	return nil, time.Time{}, probes
}

// acquire takes l's resources for a dispatch of a unit of costs decided at
// now. It returns the budget_exhausted events of the budgets this dispatch
// spent: the dispatch's claim stores them, in its transaction.
func (t *resourceTable) acquire(l *lane, now time.Time, probes []*resource, costs rt.Costs) (spent []store.Event) {
	l.running++
	t.chargeShare(l, costs)
	for _, r := range l.resources {
		r.Take(now, slices.Contains(probes, r), costs) // a window's or budget's charge counts at the handler's start
		if r.Held.For == l {
			r.Held = broker.Held{} // the room held for it is taken
		}
		t.markStatus(r)
		if len(r.Budgets) > 0 {
			spent = append(spent, t.announceBudgets(r, now)...)
		}
	}
	return spent
}

// release gives back l's resources held by a dispatch of a unit of costs
// that ended.
func (t *resourceTable) release(l *lane, costs rt.Costs) {
	l.running--
	for _, r := range l.resources {
		r.Return(costs)
		t.markStatus(r)
		t.wake(r)
	}
	t.reshare(l)
	t.maybeDropLane(l)
}

// park files l as a waiter of r, arming r's timer if r refuses until a known
// time. If l was woken by another resource that still has room, that
// resource wakes its next waiter, so capacity is never left idle while
// lanes wait for it.
func (t *resourceTable) park(l *lane, r *resource, until time.Time) {
	if r.Window != nil && !until.IsZero() && !r.Paused && !r.BlockedUntil.After(t.now()) &&
		(r.Limit == 0 || r.Active < r.Limit) {
		// Held back by the rate window.
		t.tel.rateLimited.Add(bg, 1, r.attrs())
		if t.log.Enabled(bg, slog.LevelDebug) {
			t.log.Debug("service_rate_limited", "service", r.name, "current_rate", r.Window.Used(t.now()),
				"limit", r.Window.Limit(), "window", r.Window.Length())
		}
	}
	l.parkedOn = r
	t.tagLane(l)
	r.waiters.Push(l)
	if !until.IsZero() {
		t.resourceTimer(r, t.budgetRecheck(r, until))
	}
	t.markStatus(r)
	for _, other := range l.resources {
		if other != r {
			t.wake(other)
		}
	}
}

// wake moves r's oldest waiter to the ready heap if r has room.
func (t *resourceTable) wake(r *resource) {
	if r.waiters.Len() == 0 {
		return
	}
	now := t.now()
	l := r.waiters.Peek()
	if h, ok := r.Held.For.(*lane); ok && h != l && now.Before(r.Held.Until) {
		if before, fair := t.fairOrder(l, h); fair && before {
			// Fair shares: the room is held for the lane whose turn it
			// is, not for the one refused last.
			r.Held = broker.Held{For: l, Costs: l.units.Peek().costs(), Until: r.Held.Until}
		} else if h.parkedOn == r {
			l = h // the lane room is held for goes first
		}
	}
	if ok, until, _ := t.check(r, now, l.units.Peek().costs(), l); !ok {
		if l.fair != nil {
			// Its turn in the fair shares: room accumulates for it, so
			// that smaller units of others do not keep taking it.
			t.hold(l, r, now, l.units.Peek().costs())
		}
		if !until.IsZero() {
			t.resourceTimer(r, t.budgetRecheck(r, until))
		}
		return
	}
	r.waiters.Remove(l.idx)
	l.parkedOn = nil
	l.inReady = true
	t.tagLane(l)
	t.ready.Push(l)
	t.noteFresh(l)
	if t.cfg.Priority != nil && l.staleDue(t.now(), t.cfg.PriorityTTL) {
		// Scores went stale while l was parked: l has them re-scored
		// before it dispatches again, as it would have while ready.
		l.rescore = true
		if !l.inFresh {
			l.inFresh = true
			t.freshLanes.push(l)
		}
	}
	if l.inFresh {
		// Units arrived while l was parked, or its scores went stale: l
		// waits for their scores before it dispatches again
		// (priority.go).
		l.awaiting, l.awaitPass = true, 0
	}
}

// wakeAll moves r's waiters to the ready heap while r has room for them:
// after a change that may have freed more than one place.
func (t *resourceTable) wakeAll(r *resource) {
	for range r.waiters.Len() {
		before := r.waiters.Len()
		t.wake(r)
		if r.waiters.Len() == before {
			break
		}
	}
}

func (t *resourceTable) resourceTimer(r *resource, at time.Time) {
	if !r.timerAt.IsZero() && !r.timerAt.After(at) {
		return
	}
	r.timerAt = at
	t.pushTimer(&timerEntry{at: at, kind: tResource, res: r})
}

// blockServices applies a Retry-After of length delay from now to the
// lane's services held (resource names; see heldServices). unknown, when
// set, is a service the Retry-After named that the unit does not use: it
// is logged (every service of the unit is held then).
func (t *resourceTable) blockServices(l *lane, held []string, unknown string, delay time.Duration) {
	until := t.now().Add(delay)
	if unknown != "" {
		t.log.Warn("runcue: RetryAfter names a service the unit does not use; holding all of its services",
			"service", unknown, "task_type", l.task.name, "services", l.serviceNames())
	}
	for _, r := range l.resources {
		if r.class == "" || !slices.Contains(held, r.name) {
			continue // a task cap, or a service not held
		}
		if until.After(r.BlockedUntil) {
			r.BlockedUntil, r.BlockedFor = until, delay
			t.persistBroker(r)
			t.markStatus(r)
		}
	}
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
