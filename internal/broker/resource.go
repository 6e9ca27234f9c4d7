package broker

import "time"

// Resource is the admission state of one thing a dispatch needs room in: a
// task's concurrency cap, a service, or a keyed instance of one. It states
// the one refusal rule (Refusal) that dispatch, Explain and status all
// read. It does no I/O and reads no clock: every method that depends on
// time takes it. A circuit change it makes is left for the caller to act
// on (CircuitChange), not acted on here. A Resource is not safe for
// concurrent use.
type Resource struct {
	// Cap marks a task's cap, as opposed to a service.
	Cap bool
	// Limit bounds Active, the dispatches holding the resource; 0 means
	// unlimited.
	Limit  int
	Active int
	// Window, when set, bounds the starts per rate window; Circuit, when
	// set, is the resource's circuit breaker.
	Window  *Window
	Circuit *Circuit
	// Budgets are the calendar budgets, if any. The caller Syncs them
	// with the wall clock before asking Admit.
	Budgets []*Budget
	// Paused refuses every dispatch (PauseService).
	Paused bool
	// BlockedUntil is a Retry-After hold's end; BlockedFor its length when
	// it was set.
	BlockedUntil time.Time
	BlockedFor   time.Duration

	// reported is the circuit state CircuitChange last returned.
	reported CircuitState
}

// RefusalKind is why a resource refuses a dispatch.
type RefusalKind uint8

// The refusals, in the order Refusal checks them.
const (
	RefusePaused       RefusalKind = iota + 1 // the service is paused
	RefuseBudget                              // a calendar budget is spent for its period
	RefuseRetryAfter                          // a Retry-After holds the service
	RefuseCircuitOpen                         // the circuit is open
	RefuseCircuitProbe                        // the half-open circuit's probe is running
	RefuseTaskCap                             // the task's cap is reached
	RefuseBusy                                // the service's concurrency is reached
	RefuseRateLimited                         // the rate window is full
)

// Refusal is why a resource refuses a dispatch, and until when (zero: until
// something happens, such as a run ending, a resume or a start).
type Refusal struct {
	Kind  RefusalKind
	Until time.Time
}

// Refusal says whether r refuses a dispatch at now, and why. It changes
// nothing: an expired window entry or an open circuit whose time is over is
// read as such, without being moved on.
func (r *Resource) Refusal(now time.Time) (Refusal, bool) {
	c := r.Circuit
	switch {
	case r.Paused:
		return Refusal{Kind: RefusePaused}, true
	case r.spentBudget(now) != nil:
		return Refusal{Kind: RefuseBudget, Until: r.spentBudget(now).EndMono()}, true
	case r.BlockedUntil.After(now):
		return Refusal{Kind: RefuseRetryAfter, Until: r.BlockedUntil}, true
	case c != nil && c.State == Open && now.Before(c.Until):
		return Refusal{Kind: RefuseCircuitOpen, Until: c.Until}, true
	case c != nil && c.Probing && (c.State == HalfOpen || c.State == Open):
		return Refusal{Kind: RefuseCircuitProbe}, true
	case r.Limit > 0 && r.Active >= r.Limit:
		if r.Cap {
			return Refusal{Kind: RefuseTaskCap}, true
		}
		return Refusal{Kind: RefuseBusy}, true
	case r.Window != nil && !r.Window.Allow(now):
		return Refusal{Kind: RefuseRateLimited, Until: r.Window.NextFree(now)}, true
	}
	return Refusal{}, false
}

// spentBudget returns r's spent budget that frees latest, or nil.
func (r *Resource) spentBudget(now time.Time) *Budget {
	var spent *Budget
	for _, b := range r.Budgets {
		if !b.Allow(now) && (spent == nil || b.EndMono().After(spent.EndMono())) {
			spent = b
		}
	}
	return spent
}

// SpentBudget returns the budget that refuses r at now and frees latest,
// or nil if none does.
func (r *Resource) SpentBudget(now time.Time) *Budget { return r.spentBudget(now) }

// Admit decides whether a dispatch may take r at now: the refusal rule,
// after which an open circuit whose time is over turns half-open and the
// dispatch is its probe. When it may not, until is when to ask again (zero:
// when something happens). Admit forgets window entries older than now's
// window.
func (r *Resource) Admit(now time.Time) (ok bool, until time.Time, probe bool) {
	if r.Window != nil {
		r.Window.Expire(now)
	}
	if rf, refused := r.Refusal(now); refused {
		return false, rf.Until, false
	}
	if r.Circuit != nil {
		return r.Circuit.Allow(now)
	}
	return true, time.Time{}, false
}

// Take records that a dispatch admitted at now took r: its slot, a
// reservation in its window (committed at the handler's start), and its
// probe.
func (r *Resource) Take(now time.Time, probe bool) {
	r.Active++
	if r.Window != nil {
		r.Window.Reserve(now)
	}
	for _, b := range r.Budgets {
		b.Reserve()
	}
	if probe && r.Circuit != nil {
		r.Circuit.Started(true)
	}
}

// Return gives back the slot of a dispatch that ended.
func (r *Resource) Return() { r.Active-- }

// Verdict is what a run's end says about a service's health.
type Verdict uint8

const (
	// Neutral says nothing: cancelled, interrupted, a permanent input
	// error, a Retry-After.
	Neutral Verdict = iota
	// Success closes a half-open circuit and resets the failure count.
	Success
	// Failure counts toward opening the circuit.
	Failure
)

// Judge passes the verdict of a run that ended at now to r's circuit; probe
// says whether the run was its probe. It reports whether the circuit can
// admit again where it could not (its state changed, or the probe slot was
// freed).
func (r *Resource) Judge(now time.Time, v Verdict, probe bool) bool {
	if r.Circuit == nil {
		return false
	}
	switch v {
	case Success:
		return r.Circuit.Success(probe)
	case Failure:
		return r.Circuit.Failure(now, probe)
	}
	r.Circuit.Neutral(probe)
	return probe
}

// CircuitChange returns the circuit's state change since it was last
// returned, if any, and marks it returned: the caller logs, persists and
// reports it.
func (r *Resource) CircuitChange() (from, to CircuitState, changed bool) {
	if r.Circuit == nil || r.Circuit.State == r.reported {
		return "", "", false
	}
	from, r.reported = r.reported, r.Circuit.State
	return from, r.reported, true
}

// Limits are the limits of a Resource: each zero value means none.
type Limits struct {
	// Concurrency bounds the dispatches holding the resource.
	Concurrency int
	// Rate starts per Window, each counted for Window+Margin; Pace spaces
	// the dispatches (see Window).
	Rate   int
	Window time.Duration
	Margin time.Duration
	Pace   bool
	// Threshold consecutive failures open the circuit for Timeout.
	Threshold int
	Timeout   time.Duration
}

// SetLimits applies l. A window or circuit already there keeps its
// history.
func (r *Resource) SetLimits(l Limits) {
	r.Limit = l.Concurrency
	switch {
	case l.Rate == 0:
		r.Window = nil
	case r.Window == nil:
		r.Window = NewWindow(l.Rate, l.Window)
	case r.Window.Limit() != l.Rate || r.Window.Length() != l.Window:
		r.Window.SetLimits(l.Rate, l.Window)
	}
	if r.Window != nil {
		r.Window.SetMargin(l.Margin)
		r.Window.SetPace(l.Pace)
	}
	switch {
	case l.Threshold == 0:
		r.Circuit = nil
	case r.Circuit == nil:
		r.Circuit = NewCircuit(l.Threshold, l.Timeout)
		r.reported = Closed
	default:
		r.Circuit.Threshold, r.Circuit.Timeout = l.Threshold, l.Timeout
	}
}

// Quiet reports whether r holds no state that outlives its users at now: no
// slot taken, no Retry-After hold, a closed circuit, an empty window and
// budgets that count nothing. If only the window or budgets keep it,
// recheck is when they empty.
func (r *Resource) Quiet(now time.Time) (quiet bool, recheck time.Time) {
	if r.Active > 0 || r.BlockedUntil.After(now) || (r.Circuit != nil && r.Circuit.State != Closed) {
		return false, time.Time{}
	}
	var until time.Time
	if r.Window != nil && r.Window.Count(now) > 0 {
		last, _ := r.Window.Last()
		until = last.Add(r.Window.Hold())
	}
	for _, b := range r.Budgets {
		if !b.Idle(now) && b.EndMono().After(until) {
			until = b.EndMono()
		}
	}
	if !until.IsZero() {
		return false, until
	}
	return true, time.Time{}
}
