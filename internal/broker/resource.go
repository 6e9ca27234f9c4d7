package broker

import (
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

// Resource is the admission state of one thing a dispatch needs room in: a
// task's concurrency cap, a service, or a keyed instance of one. Its limits
// are meters (see Limiter): the concurrency cap, the rate window, the
// calendar budgets and the circuit breaker are built in and kept in typed
// fields for status, and Extra holds any others; every admission,
// charge and release goes through all of them alike. Two gates stand before
// the meters: a pause, and a Retry-After hold. It states the one refusal
// rule (Refusal) that dispatch, Explain and status all read. It does no I/O
// and reads no clock: every method that depends on time takes it. A
// circuit change it makes is left for the caller to act on
// (CircuitChange), not acted on here. A Resource is not safe for
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
	Budgets []*Quota
	// Amounts are the sliding windows of amounts other than requests
	// (tokens, bytes), in the order they were configured.
	Amounts []AmountMeter
	// Extra are meters beyond the built-in ones.
	Extra []Limiter
	// Held is room in the amount windows kept for one waiting dispatch
	// that they refused, so that smaller ones do not take it first.
	Held Held
	// Ceilings are, by amount, the configured limits of meters whose
	// limit an adaptive controller has lowered (see AIMD): a dispatch
	// costing more than the lowered limit, but no more than the ceiling,
	// is admitted when the meter is otherwise empty (it starts alone)
	// instead of never.
	Ceilings map[string]int64
	// Paused refuses every dispatch (PauseService).
	Paused bool
	// NoRunner refuses every dispatch: nothing can run them now (a task
	// whose handlers run in executors, none of which is alive).
	NoRunner bool
	// BlockedUntil is a Retry-After hold's end; BlockedFor its length when
	// it was set.
	BlockedUntil time.Time
	BlockedFor   time.Duration

	// meters is Meters' list, rebuilt from the fields at each call.
	meters []Limiter
	// reported is the circuit state CircuitChange last returned.
	reported rt.CircuitState
}

// RefusalKind is why a resource refuses a dispatch.
type RefusalKind uint8

// The refusals, most fundamental first: when several hold, Refusal reports
// the first of them (and of one kind, the one that frees latest).
const (
	RefusePaused       RefusalKind = iota + 1 // the service is paused
	RefuseNoRunner                            // nothing can run the dispatch (no executor)
	RefuseBudget                              // a calendar budget is spent for its period
	RefuseRetryAfter                          // a Retry-After holds the service
	RefuseCircuitOpen                         // the circuit is open
	RefuseCircuitProbe                        // the half-open circuit's probe is running
	RefuseTaskCap                             // the task's cap is reached
	RefuseBusy                                // the service's concurrency is reached
	RefuseRateLimited                         // the rate window is full
	RefuseMeter                               // another meter (Extra) is full
)

// Refusal is why a resource refuses a dispatch, and until when (zero: until
// something happens, such as a run ending, a resume or a start). Limiter
// names the amount an Extra meter counts, for RefuseMeter; Held says that
// the room the dispatch needs is held for another (see Held).
type Refusal struct {
	Kind  RefusalKind
	Until time.Time
	Meter string
	Held  bool
}

// Held is room kept in a resource's amount windows for one dispatch they
// refused (For, the caller's token for it, of Costs), until it is taken
// or Until, whichever comes first. While it holds, any other dispatch is
// admitted by an amount window only if it fits beside the held costs, so
// a stream of small dispatches cannot keep a large one waiting: the
// entries that count when the hold begins leave within the window's hold,
// and the reservations within MaxStartDelay more, which is the bound the
// caller sets Until to; a small dispatch waits at most that long for each
// hold. The hold goes to the largest dispatch refused (see Hold): a
// larger one refused later takes it over, and the one it displaced holds
// again once that one has started.
type Held struct {
	For   any
	Costs rt.Costs
	Until time.Time
}

// active reports whether h holds room at now against a dispatch of who.
func (h *Held) active(now time.Time, who any) bool {
	return h.For != nil && h.For != who && now.Before(h.Until)
}

// rebuild lists the meters in the order Refusal reads them.
func (r *Resource) rebuild() {
	r.meters = r.meters[:0]
	for _, b := range r.Budgets {
		r.meters = append(r.meters, b)
	}
	if r.Circuit != nil {
		r.meters = append(r.meters, r.Circuit)
	}
	r.meters = append(r.meters, concurrency{r})
	if r.Window != nil {
		r.meters = append(r.meters, r.Window)
	}
	for _, a := range r.Amounts {
		r.meters = append(r.meters, a)
	}
	r.meters = append(r.meters, r.Extra...)
}

// Meters returns every meter of r, built in and extra, in the order
// Refusal reads them. The slice is r's own, valid until the next call.
func (r *Resource) Meters() []Limiter {
	r.rebuild() // from the fields as they are now: a few appends, no allocation
	return r.meters
}

// Refusal says whether r refuses a dispatch of a unit of costs at now,
// and why: the most fundamental refusal that holds (see RefusalKind), and
// of one kind the one that frees latest. It changes nothing: an expired
// window entry or an open circuit whose time is over is read as such,
// without being moved on.
func (r *Resource) Refusal(now time.Time, costs rt.Costs) (Refusal, bool) {
	return r.RefusalFor(now, costs, nil)
}

// RefusalFor is Refusal for a dispatch that who (the caller's token, as
// in Held.For) asks for: room held for another counts against it.
func (r *Resource) RefusalFor(now time.Time, costs rt.Costs, who any) (Refusal, bool) {
	if r.Paused {
		return Refusal{Kind: RefusePaused}, true
	}
	if r.NoRunner {
		return Refusal{Kind: RefuseNoRunner}, true
	}
	var best Refusal
	found := false
	better := func(rf Refusal) {
		if !found || rf.Kind < best.Kind || (rf.Kind == best.Kind && !best.Until.IsZero() && (rf.Until.IsZero() || rf.Until.After(best.Until))) {
			best, found = rf, true
		}
	}
	if r.BlockedUntil.After(now) {
		better(Refusal{Kind: RefuseRetryAfter, Until: r.BlockedUntil})
	}
	for _, m := range r.Meters() {
		if rf, refused := m.Refusal(now, r.asked(m, costs)); refused {
			if rf.Kind == 0 {
				rf.Kind, rf.Meter = RefuseMeter, m.Counts()
			}
			better(rf)
		}
	}
	if !found && r.Held.active(now, who) {
		for _, a := range r.Amounts {
			held, ok := r.Held.Costs[a.Name()]
			if !ok {
				continue
			}
			if rf, refused := a.Refusal(now, costs.Of(a.Name())+held); refused {
				// Until the room is there for both, or the hold lapses.
				if rf.Until.IsZero() || rf.Until.After(r.Held.Until) {
					rf.Until = r.Held.Until
				}
				rf.Held = true
				better(rf)
			}
		}
	}
	return best, found
}

// Hold keeps room in r's amount windows for the dispatch of who, of costs,
// refused at now by the window of amount, until it is taken or until. A
// hold in force for another stays unless this dispatch costs more of
// amount: the room goes to the largest refused dispatch, which small ones
// could keep waiting; a smaller one fits as soon as room frees.
func (r *Resource) Hold(who any, costs rt.Costs, amount string, now, until time.Time) {
	if len(r.Amounts) == 0 {
		return
	}
	if r.Held.active(now, who) && costs.Of(amount) <= r.Held.Costs.Of(amount) {
		return
	}
	r.Held = Held{For: who, Costs: costs, Until: until}
}

// amountOf is the amount m counts, for its cost: a meter that counts
// nothing costs one.
func amountOf(m Limiter) string { return m.Counts() }

// asked is the cost a dispatch of costs asks of m: its cost of m's
// amount, or m's limit where that is lower and Ceilings admits the cost
// (a lowered adaptive limit: the dispatch starts alone).
func (r *Resource) asked(m Limiter, costs rt.Costs) int64 {
	c := costs.Of(amountOf(m))
	if len(r.Ceilings) == 0 {
		return c
	}
	ceiling, ok := r.Ceilings[m.Counts()]
	if !ok || c > ceiling {
		return c
	}
	var limit int64
	switch m := m.(type) {
	case AmountMeter:
		limit = m.Limit()
	case *Window:
		limit = int64(m.Limit())
	default:
		return c
	}
	return min(c, limit)
}

// SpentBudget returns the budget that refuses r at now and frees latest,
// or nil if none does.
func (r *Resource) SpentBudget(now time.Time) *Quota {
	var spent *Quota
	for _, b := range r.Budgets {
		if !b.Allow(now) && (spent == nil || b.EndMono().After(spent.EndMono())) {
			spent = b
		}
	}
	return spent
}

// Admit decides whether a dispatch of a unit of costs may take r at now:
// the refusal rule, after which an open circuit whose time is over turns
// half-open and the dispatch is its probe. When it may not, until is when
// to ask again (zero: when something happens). Admit forgets the entries
// of windows that no longer count at now (Expirer).
func (r *Resource) Admit(now time.Time, costs rt.Costs) (ok bool, until time.Time, probe bool) {
	return r.AdmitFor(now, costs, nil)
}

// AdmitFor is Admit for a dispatch of who (see RefusalFor).
func (r *Resource) AdmitFor(now time.Time, costs rt.Costs, who any) (ok bool, until time.Time, probe bool) {
	for _, m := range r.Meters() {
		if e, ok := m.(Expirer); ok {
			e.Expire(now)
		}
	}
	if rf, refused := r.RefusalFor(now, costs, who); refused {
		return false, rf.Until, false
	}
	if r.Circuit != nil {
		return r.Circuit.Allow(now)
	}
	return true, time.Time{}, false
}

// Take records that a dispatch of a unit of costs, admitted at now, took
// r: every meter holds its charge (a slot, a place in each window and
// budget), and its probe starts.
func (r *Resource) Take(now time.Time, probe bool, costs rt.Costs) {
	for _, m := range r.Meters() {
		m.Take(now, costs.Of(amountOf(m)))
	}
	if probe && r.Circuit != nil {
		r.Circuit.Started(true)
	}
}

// Start counts the charges of a dispatch that started at start (timeline)
// and wall (wall clock).
func (r *Resource) Start(start, wall time.Time, costs rt.Costs) {
	for _, m := range r.Meters() {
		m.Start(start, wall, costs.Of(amountOf(m)))
	}
}

// Release gives back the charges of a dispatch that never started.
func (r *Resource) Release(costs rt.Costs) {
	for _, m := range r.Meters() {
		m.Release(costs.Of(amountOf(m)))
	}
}

// Return frees what a dispatch that ended held (its slot).
func (r *Resource) Return(costs rt.Costs) {
	for _, m := range r.Meters() {
		m.End(costs.Of(amountOf(m)))
	}
}

// Counted reports whether r has a meter that counts starts (whose charge
// waits for the start: a window, a budget, an extra meter with an
// amount).
func (r *Resource) Counted() bool {
	for _, m := range r.Meters() {
		if m.Counts() != "" {
			return true
		}
	}
	return false
}

// Logs returns the amounts r's starts are logged under, each once.
func (r *Resource) Logs(out []string) []string {
	for _, m := range r.Meters() {
		if a := m.Counts(); a != "" && !contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// Restore counts, in each meter of an amount, the starts earlier owners
// logged of it (by amount), as of now.
func (r *Resource) Restore(starts map[string][]Logged, now time.Time) {
	for _, m := range r.Meters() {
		if a := m.Counts(); a != "" && len(starts[a]) > 0 {
			m.Restore(starts[a], now)
		}
	}
}

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
func (r *Resource) CircuitChange() (from, to rt.CircuitState, changed bool) {
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
		r.reported = rt.CircuitClosed
	default:
		r.Circuit.Threshold, r.Circuit.Timeout = l.Threshold, l.Timeout
	}
}

// AmountLimits are the limits of an amount meter: a sliding window, or
// a refilling bucket with Bucket.
type AmountLimits struct {
	Name   string
	Limit  int64
	Window time.Duration
	Charge rt.Charge
	Bucket bool
}

// SetAmounts makes r's amount meters those of ls, with margin: a meter of
// an amount already there, of the same kind, keeps its entries and
// reservations; one no longer listed is dropped.
func (r *Resource) SetAmounts(ls []AmountLimits, margin time.Duration) {
	old := r.Amounts
	r.Amounts = nil
	for _, l := range ls {
		var m AmountMeter
		for _, o := range old {
			if _, isBucket := o.(*Bucket); o.Name() == l.Name && isBucket == l.Bucket {
				m = o
				m.SetLimits(l.Limit, l.Window, margin, l.Charge)
			}
		}
		if m == nil && l.Bucket {
			m = NewBucket(l.Name, l.Limit, l.Window, margin, l.Charge)
		} else if m == nil {
			m = NewAmountWindow(l.Name, l.Limit, l.Window, margin, l.Charge)
		}
		r.Amounts = append(r.Amounts, m)
	}
}

// Amount returns r's meter of amount name, or nil.
func (r *Resource) Amount(name string) AmountMeter {
	for _, a := range r.Amounts {
		if a.Name() == name {
			return a
		}
	}
	return nil
}

// Quiet reports whether r holds no state that outlives its users at now: no
// Retry-After hold, and every meter quiet (no slot taken, a closed circuit,
// an empty window and budgets that count nothing). If only meters that
// empty with time keep it, recheck is when the last of them does.
func (r *Resource) Quiet(now time.Time) (quiet bool, recheck time.Time) {
	if r.BlockedUntil.After(now) {
		return false, time.Time{}
	}
	var until time.Time
	for _, m := range r.Meters() {
		q, u := m.Quiet(now)
		if q {
			continue
		}
		if u.IsZero() {
			return false, time.Time{}
		}
		if u.After(until) {
			until = u
		}
	}
	if !until.IsZero() {
		return false, until
	}
	return true, time.Time{}
}
