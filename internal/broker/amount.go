package broker

import (
	"fmt"
	"sort"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

// AmountWindow is an exact sliding log of starts, each with an amount (the
// tokens or bytes it charged): the amounts of the starts within any
// interval of length Length plus Margin sum to at most Limit, counting the
// reservations of dispatches decided and not yet started as if they had
// started at the instant asked about. Its memory follows its entries, not
// its limit: a start of 4,000 tokens is one entry.
//
// The margin is the wire's, as for Window: a service that counts a request
// when it arrives, at most Margin later than any other started at the same
// instant, sees at most Limit in any interval of length Length.
//
// An entry's amount may be replaced once its run reports what it used
// (Reconcile): an actual charge smaller than the estimate frees the
// difference at once, a larger one holds later dispatches back. A start
// whose actual charge exceeds its estimate can make the window hold more
// than Limit; only estimates at least the actual charge keep the promise.
//
// An AmountWindow reads no clock and is not safe for concurrent use.
type AmountWindow struct {
	amountSpec
	es      []amountEntry // sorted by start; the live ones are es[head:]
	head    int
	sum     int64 // the amounts of es[head:]
	pending int64 // reserved, not yet started or released
}

type amountEntry struct {
	at     int64 // Unix ns on the scheduling timeline
	amount int64
}

// NewAmountWindow returns an empty window counting name: at most limit in
// any interval of length plus margin, reconciled per charge.
func NewAmountWindow(name string, limit int64, length, margin time.Duration, charge rt.Charge) *AmountWindow {
	return &AmountWindow{amountSpec: newAmountSpec(name, limit, length, margin, charge)}
}

// amountSpec is an amount meter's settings, the same for a window and a
// bucket: the amount it counts (Name), at most Limit per Length, the
// wire's Margin, and how a start's charge is reconciled.
type amountSpec struct {
	name   string
	limit  int64
	length time.Duration
	margin time.Duration
	charge rt.Charge
	others elsewhere // what the service's readings say of use from elsewhere
}

func newAmountSpec(name string, limit int64, length, margin time.Duration, charge rt.Charge) amountSpec {
	return amountSpec{name: name, limit: limit, length: length, margin: max(margin, 0), charge: charge}
}

// Name, Limit, Length and ChargePolicy return the meter's settings; Hold
// is how long a start's entry counts (or, in a bucket, is kept): Length
// plus Margin.
func (s *amountSpec) Name() string            { return s.name }
func (s *amountSpec) Limit() int64            { return s.limit }
func (s *amountSpec) Length() time.Duration   { return s.length }
func (s *amountSpec) Margin() time.Duration   { return s.margin }
func (s *amountSpec) ChargePolicy() rt.Charge { return s.charge }
func (s *amountSpec) Hold() time.Duration     { return s.length + s.margin }

// Counts is the amount the meter counts, its name.
func (s *amountSpec) Counts() string { return s.name }

// Horizon is how far back recovery reads the service log for it.
func (s *amountSpec) Horizon() time.Duration { return s.Hold() }

// SetLimits changes the meter's settings in place, keeping its entries
// and reservations.
func (s *amountSpec) SetLimits(limit int64, length, margin time.Duration, charge rt.Charge) {
	others := s.others
	*s = newAmountSpec(s.name, limit, length, margin, charge)
	s.others = others
}

// Elsewhere returns the room the meter keeps at now for use of its limit
// from elsewhere, which the service's readings showed (Observe).
func (s *amountSpec) Elsewhere(now time.Time) int64 {
	return s.others.room(now, s.length)
}

// FromElsewhere returns the use of the meter's limit from elsewhere that
// the service's readings showed, for which it keeps room at now (Elsewhere
// is that and a tenth more), and the share of its refill it leaves that
// use (a Bucket's; a window's is zero).
func (s *amountSpec) FromElsewhere(now time.Time) (int64, float64) {
	_, seen := s.others.figures(now, s.length)
	return seen, 0
}

// first returns the index of the first entry that counts at t.
func (w *AmountWindow) first(t time.Time) int {
	cut := t.UnixNano() - int64(w.Hold())
	live := w.es[w.head:]
	return w.head + sort.Search(len(live), func(i int) bool { return live[i].at > cut })
}

// SumAt returns the amounts of the entries that counted at t: those in
// the window ending at t, not the later ones.
func (w *AmountWindow) SumAt(t time.Time) int64 {
	var s int64
	end := t.UnixNano()
	for _, e := range w.es[w.first(t):] {
		if e.at > end {
			break
		}
		s += e.amount
	}
	return s
}

// Sum returns the amounts of the entries that count at t, reservations
// aside.
func (w *AmountWindow) Sum(t time.Time) int64 {
	s := w.sum
	for _, e := range w.es[w.head:w.first(t)] {
		s -= e.amount
	}
	return s
}

// Frees returns when the oldest start that counts at now leaves the
// window (zero if none counts).
func (w *AmountWindow) Frees(now time.Time) time.Time {
	if i := w.first(now); i < len(w.es) {
		return time.Unix(0, w.es[i].at+int64(w.Hold()))
	}
	return time.Time{}
}

// Used returns the amounts that count at now, reservations and the room
// kept for use from elsewhere included.
func (w *AmountWindow) Used(now time.Time) int64 {
	return w.Sum(now) + w.pending + w.Elsewhere(now)
}

// Observe takes a reading of the service's limit: remaining was left of it
// when a request that started at arrival (on the timeline), charged
// charged, arrived. What
// the window's count then (up to arrival plus the margin, the latest a
// start before it can arrive after it) does not explain of the use the
// reading implies was used from elsewhere (see elsewhere).
func (w *AmountWindow) Observe(arrival time.Time, remaining, charged int64) {
	own := w.SumAt(arrival.Add(w.margin))
	w.others.add(reading{at: arrival.UnixNano(), others: w.limit - own - remaining, level: remaining, before: remaining + charged}, w.limit, w.length)
}

// Expire drops the entries that left the window a Hold before now (which
// must not be ahead of the present): those of the last Hold are kept for
// SumAt, which reads the window as it stood when a request arrived, up
// to a Hold ago.
func (w *AmountWindow) Expire(now time.Time) {
	i := w.first(now.Add(-w.Hold()))
	for _, e := range w.es[w.head:i] {
		w.sum -= e.amount
	}
	w.head = i
	if w.head > 0 && 2*w.head >= len(w.es) {
		n := copy(w.es, w.es[w.head:])
		clear(w.es[n:])
		w.es, w.head = w.es[:n], 0
	}
}

// Refusal admits a dispatch of cost at now while the amounts counting at
// now, the reservations, the room kept for use from elsewhere and cost sum
// to at most Limit (a cost of zero is always admitted). Refused, it says
// until when enough entries leave the window or the room kept may fall,
// whichever is first, or zero when the reservations alone leave no room
// for cost (a start or release must come first).
func (w *AmountWindow) Refusal(now time.Time, cost int64) (Refusal, bool) {
	room := w.others.room(now, w.length)
	used := w.Sum(now) + w.pending + room
	if cost <= 0 || used+cost <= w.limit {
		return Refusal{}, false
	}
	if w.pending+cost > w.limit {
		return Refusal{Kind: RefuseMeter, Meter: w.name}, true
	}
	falls := w.others.falls(now, w.length, w.limit-(used-room)-cost)
	for _, e := range w.es[w.first(now):] { // the oldest leave first
		used -= e.amount
		if used+cost <= w.limit {
			return Refusal{Kind: RefuseMeter, Meter: w.name, Until: earliest(time.Unix(0, e.at+int64(w.Hold())), falls)}, true
		}
	}
	return Refusal{Kind: RefuseMeter, Meter: w.name, Until: falls}, true
}

// earliest returns the earlier of a and b, ignoring a zero one.
func earliest(a, b time.Time) time.Time {
	if b.IsZero() || (!a.IsZero() && a.Before(b)) {
		return a
	}
	return b
}

func (w *AmountWindow) Take(now time.Time, cost int64) {
	w.Expire(now)
	w.pending += max(cost, 0)
}

func (w *AmountWindow) Start(start, wall time.Time, cost int64) {
	w.pending = max(w.pending-max(cost, 0), 0)
	w.add(start.UnixNano(), cost)
}

func (w *AmountWindow) Release(cost int64) { w.pending = max(w.pending-max(cost, 0), 0) }

func (w *AmountWindow) End(cost int64) {}

// add logs a start of amount at (Unix ns), in order among the entries.
func (w *AmountWindow) add(at, amount int64) {
	if amount <= 0 {
		return
	}
	i := len(w.es)
	for i > w.head && w.es[i-1].at > at {
		i--
	}
	w.es = append(w.es, amountEntry{})
	copy(w.es[i+1:], w.es[i:])
	w.es[i] = amountEntry{at, amount}
	w.sum += amount
}

// AddUsage counts amount as used at at (on the timeline) by something
// the window did not admit: usage from elsewhere that the service
// reported.
func (w *AmountWindow) AddUsage(at time.Time, amount int64) { w.add(at.UnixNano(), amount) }

// Reconcile replaces the charge of the start at start (timeline) that was
// charged from with to. It reports whether such an entry was still in the
// window; one that has left it changes nothing.
func (w *AmountWindow) Reconcile(start time.Time, from, to int64) bool {
	at := start.UnixNano()
	live := w.es[w.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].at >= at })
	for ; i < len(live) && live[i].at == at; i++ {
		if live[i].amount != from {
			continue
		}
		w.sum -= from
		w.others.adjust(at, from-to, w.margin, w.Hold())
		if to > 0 {
			live[i].amount = to
			w.sum += to
		} else { // nothing used: the entry goes
			copy(w.es[w.head+i:], w.es[w.head+i+1:])
			w.es = w.es[:len(w.es)-1]
		}
		return true
	}
	return false
}

// Restore adds the logged starts that still count at now.
func (w *AmountWindow) Restore(starts []Logged, now time.Time) {
	cut := now.Add(-w.Hold())
	for _, s := range starts {
		if s.At.After(cut) {
			w.add(s.At.UnixNano(), s.Amount)
		}
	}
}

func (w *AmountWindow) Quiet(now time.Time) (bool, time.Time) {
	if w.pending > 0 {
		return false, time.Time{}
	}
	if i := w.first(now); i < len(w.es) {
		return false, time.Unix(0, w.es[len(w.es)-1].at+int64(w.Hold()))
	}
	return true, time.Time{}
}

// AmountMeter is a meter of an amount other than requests: a sliding
// window (AmountWindow) or a refilling bucket (Bucket).
type AmountMeter interface {
	Reconciler
	Horizoned
	Expirer
	Unfit
	Name() string
	Limit() int64
	Length() time.Duration
	Margin() time.Duration
	Hold() time.Duration
	// Used is what counts at now, reservations included; Sum without them.
	Used(now time.Time) int64
	Sum(now time.Time) int64
	// SumAt is what counted at t, an instant that may be past: the starts
	// up to t only (Sum counts the later ones too).
	SumAt(t time.Time) int64
	// AddUsage counts amount as used at at by something it did not admit.
	AddUsage(at time.Time, amount int64)
	// Observe takes the service's reading of what remained of its limit
	// when a request started at arrival, charged charged, arrived;
	// Elsewhere is the room the meter keeps at now for the use from
	// elsewhere readings showed.
	Observe(arrival time.Time, remaining, charged int64)
	Elsewhere(now time.Time) int64
	// FromElsewhere is the use from elsewhere that room is kept for,
	// and the share of a bucket's refill left to it.
	FromElsewhere(now time.Time) (int64, float64)
	// Frees is when what counts at now has left (zero: nothing counts).
	Frees(now time.Time) time.Time
	SetLimits(limit int64, length, margin time.Duration, charge rt.Charge)
}

var (
	_ AmountMeter = (*AmountWindow)(nil)
	_ AmountMeter = (*Bucket)(nil)
)

// Reconciler is implemented by a meter whose charges may be replaced by
// what a run actually used.
type Reconciler interface {
	Limiter
	// ChargePolicy says what a start's charge becomes (see Charge).
	ChargePolicy() rt.Charge
	// Reconcile replaces the charge from of the start at start with to.
	Reconcile(start time.Time, from, to int64) bool
}

// Expirer is implemented by a meter that drops what no longer counts when
// Admit is asked at the present.
type Expirer interface {
	Expire(now time.Time)
}

// Unfit is implemented by a meter that can tell a cost it can never admit,
// whatever ends or leaves it: one above its limit.
type Unfit interface {
	// Unfit says why cost can never be admitted, or "" if it can.
	Unfit(cost int64) string
}

func (w *AmountWindow) Unfit(cost int64) string {
	if cost > w.limit {
		return fmt.Sprintf("a cost of %d %s is above the limit of %d per %v", cost, w.name, w.limit, w.length)
	}
	return ""
}

func (w *Window) Unfit(cost int64) string {
	if cost > int64(w.limit) {
		return fmt.Sprintf("a cost of %d requests is above the limit of %d per %v", cost, w.limit, w.length)
	}
	return ""
}

func (b *Quota) Unfit(cost int64) string {
	if cost > int64(b.Limit) {
		return fmt.Sprintf("a cost of %d requests is above a budget of %d", cost, b.Limit)
	}
	return ""
}

// Unfit says why r can never admit a unit of costs (a cost above the limit
// of one of its meters), or "" if it can.
func (r *Resource) Unfit(costs rt.Costs) string {
	for _, m := range r.Meters() {
		if u, ok := m.(Unfit); ok {
			if why := u.Unfit(r.asked(m, costs)); why != "" {
				return why
			}
		}
	}
	return ""
}
