package broker

import (
	"fmt"
	"sort"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

// Bucket is a continuously refilling bucket of an amount, as providers
// that document one count it (Anthropic's token limits): it holds at most
// Limit, refills at Limit per Length, and a start takes its amount out of
// it. Equivalently, the amounts of the starts within any interval of
// length d sum to at most Limit + d*Limit/Length: a full bucket lets a
// whole Limit start at once, then the refill rate. The bucket counts the
// starts it admitted at their start instants, as a window does, and the
// reservations of dispatches decided and not yet started as if they had
// started at the instant asked about (they start at or after it).
//
// The margin is the wire's: a service that counts each request when it
// arrives, at most Margin later than any other that started at the same
// instant, sees the starts of an interval spread over Margin more. So the
// bucket admits as if it held Margin's refill less than Limit, and the
// service never counts more than its bucket allows.
//
// Its state is what it has counted since Fold's horizon, one entry per
// start (so a start's charge can be replaced by what its run used,
// Reconcile), folded into a deficit once older than Length plus Margin,
// which no late report can reach. Rebuilt from the service log (Restore),
// it assumes the bucket was empty a window before the instant of
// recovery: of what started before that, nothing can count more.
//
// A Bucket reads no clock and is not safe for concurrent use.
type Bucket struct {
	amountSpec
	tc      int64 // the checkpoint (Unix ns, timeline): deficit dc then
	dc      float64
	es      []amountEntry // the starts after tc, sorted
	pending int64
	share   float64 // of the refill, what readings show taken from elsewhere
}

// NewBucket returns a full bucket of name: limit, refilling limit per
// length, with margin, reconciled per charge.
func NewBucket(name string, limit int64, length, margin time.Duration, charge rt.Charge) *Bucket {
	return &Bucket{amountSpec: newAmountSpec(name, limit, length, margin, charge)}
}

// rate is the refill per nanosecond left to the bucket's own starts: its
// limit per length, less the share that readings showed taken from
// elsewhere and a tenth more of it (the headroom, as for the room kept).
func (b *Bucket) rate() float64 {
	return b.fullRate() * (1 - min(b.share+b.share/headroom, maxShare))
}

// fullRate is the service's refill per nanosecond: limit per length.
func (b *Bucket) fullRate() float64 { return float64(b.limit) / float64(b.length) }

// FromElsewhere returns the use from elsewhere the bucket keeps room for
// at now, and the share of its refill it leaves to it.
func (b *Bucket) FromElsewhere(now time.Time) (int64, float64) {
	_, seen := b.others.figures(now, b.length)
	return seen, b.share
}

// maxShare bounds the share of the refill a bucket leaves to use from
// elsewhere, so that a reading wrong by much still leaves it a trickle.
const maxShare = 0.95

// Observe takes a reading of the service's bucket: remaining was its
// level when a request that started at arrival (on the timeline), charged
// charged, arrived and was counted. Use from elsewhere takes from the
// bucket steadily and in steps. The steady part is its share of the
// refill, which the bucket leaves it (its own refill slows by that and a
// tenth more), measured over the longest span of readings, at least half
// a window, whose starts the bucket still holds one by one (not folded),
// in which the level stayed below half the limit (so it cannot
// have been full, when refill is lost): the refill over the span, less the
// bucket's own starts in it, less the level's rise, is what was taken from
// elsewhere. A level of half the limit or more says the bucket is not
// drained, and its share is dropped until a span measures it again. The
// steps are what the bucket's deficit at the arrival (with that share)
// does not explain of the level read; the largest of the last half window
// is kept as room (see elsewhere).
//
// Starts at one instant reach the service one after the other: each
// end of a span is the level before the first of them, the largest of
// their readings' levels plus their charges.
func (b *Bucket) Observe(arrival time.Time, remaining, charged int64) {
	at := arrival.UnixNano()
	rs := b.others.live()
	if n := len(rs); n > 0 && rs[n-1].at < at-int64(b.length) {
		b.share = 0 // no reading for a window: what it showed is past
	}
	b.others.add(reading{at: at, others: b.limit - remaining - int64(ceil(b.deficit(arrival.Add(b.margin)))),
		level: remaining, before: remaining + charged}, b.limit, b.length)
	if remaining >= b.limit/2 {
		b.share = 0
		return
	}
	rs = b.others.live()
	before := func(i int) (int64, int) { // the level before the starts at rs[i].at, and the first reading of them
		l, j := int64(0), i
		for ; j >= 0 && rs[j].at == rs[i].at; j-- {
			l = max(l, rs[j].before)
		}
		for k := i + 1; k < len(rs) && rs[k].at == rs[i].at; k++ {
			l = max(l, rs[k].before)
		}
		return l, j + 1
	}
	last := len(rs) - 1
	for last >= 0 && rs[last].at != at {
		last-- // the reading taken, among later ones that came first
	}
	l2, first := before(last)
	from := -1
	for i := first - 1; i >= 0 && rs[i].at > b.tc && rs[i].level < b.limit/2 && rs[i+1].at-rs[i].at < int64(b.length/2); i-- {
		if at-rs[i].at >= int64(b.length/2) {
			from = i
		}
	}
	if from < 0 {
		return
	}
	l1, _ := before(from)
	var own int64
	for _, e := range b.es {
		if e.at >= rs[from].at && e.at < at {
			own += e.amount
		}
	}
	refill := b.fullRate() * float64(at-rs[from].at)
	taken := refill - float64(own) - float64(l2-l1)
	b.share = min(max(taken/refill, 0), maxShare)
}

// capacity is what the bucket admits against: Limit less the margin's
// refill.
func (b *Bucket) capacity() float64 {
	return float64(b.limit) - b.rate()*float64(b.margin)
}

// deficit returns how far below full the bucket is at t, counting the
// starts up to t: the largest amount started within an interval ending
// at t less that interval's refill.
func (b *Bucket) deficit(t time.Time) float64 {
	at := t.UnixNano()
	d, prev := b.dc, b.tc
	r := b.rate()
	for _, e := range b.es {
		if e.at > at {
			break
		}
		d = max(0, d-r*float64(e.at-prev)) + float64(e.amount)
		prev = e.at
	}
	return max(0, d-r*float64(at-prev))
}

// Used returns what is taken out of the bucket at now, reservations and
// the room kept for use from elsewhere included, rounded up.
func (b *Bucket) Used(now time.Time) int64 {
	return int64(ceil(b.deficit(now))) + b.pending + b.Elsewhere(now)
}

// Sum returns what the starts counted take out of the bucket at now.
func (b *Bucket) Sum(now time.Time) int64 { return int64(ceil(b.deficit(now))) }

// SumAt is Sum: the deficit at t counts the starts up to t only.
func (b *Bucket) SumAt(t time.Time) int64 { return b.Sum(t) }

func ceil(x float64) float64 {
	n := float64(int64(x))
	if x > n {
		return n + 1
	}
	return n
}

// Refusal admits a dispatch of cost at now while the bucket's deficit, the
// reservations, the room kept for use from elsewhere and cost fit its
// capacity (a cost of zero always fits). Refused, it says when the refill
// makes room or the room kept may fall, whichever is first, or zero when
// the reservations alone leave none.
func (b *Bucket) Refusal(now time.Time, cost int64) (Refusal, bool) {
	room := b.others.room(now, b.length)
	d := b.deficit(now)
	need := d + float64(b.pending+cost+room)
	if cost <= 0 || need <= b.capacity() {
		return Refusal{}, false
	}
	if float64(b.pending+cost) > b.capacity() {
		return Refusal{Kind: RefuseMeter, Meter: b.name}, true
	}
	if float64(b.pending+cost+room) > b.capacity() { // the room must fall, whatever refills
		return Refusal{Kind: RefuseMeter, Meter: b.name, Until: b.others.falls(now, b.length, int64(b.capacity())-b.pending-cost)}, true
	}
	falls := b.others.falls(now, b.length, int64(b.capacity()-d)-b.pending-cost)
	wait := time.Duration(ceil((need - b.capacity()) / b.rate()))
	return Refusal{Kind: RefuseMeter, Meter: b.name, Until: earliest(now.Add(wait), falls)}, true
}

// Expire folds the starts older than the hold into the deficit: no late
// report or reconciliation reaches them any more.
func (b *Bucket) Expire(now time.Time) {
	cut := now.UnixNano() - int64(b.Hold())
	if cut <= b.tc {
		return
	}
	i := sort.Search(len(b.es), func(i int) bool { return b.es[i].at > cut })
	if i == 0 {
		return
	}
	d, prev := b.dc, b.tc
	r := b.rate()
	for _, e := range b.es[:i] {
		d = max(0, d-r*float64(e.at-prev)) + float64(e.amount)
		prev = e.at
	}
	b.dc, b.tc = max(0, d-r*float64(cut-prev)), cut
	n := copy(b.es, b.es[i:])
	clear(b.es[n:])
	b.es = b.es[:n]
}

func (b *Bucket) Take(now time.Time, cost int64) {
	b.Expire(now)
	b.pending += max(cost, 0)
}

func (b *Bucket) Start(start, wall time.Time, cost int64) {
	b.pending = max(b.pending-max(cost, 0), 0)
	b.AddUsage(start, cost)
}

func (b *Bucket) Release(cost int64) { b.pending = max(b.pending-max(cost, 0), 0) }

func (b *Bucket) End(cost int64) {}

// AddUsage counts amount as taken out at at: a start, or usage from
// elsewhere the service reported. One older than the checkpoint counts
// in the deficit as of the checkpoint (more than it can have left).
func (b *Bucket) AddUsage(at time.Time, amount int64) {
	if amount <= 0 {
		return
	}
	t := at.UnixNano()
	if t <= b.tc {
		b.dc += float64(amount)
		return
	}
	i := sort.Search(len(b.es), func(i int) bool { return b.es[i].at > t })
	b.es = append(b.es, amountEntry{})
	copy(b.es[i+1:], b.es[i:])
	b.es[i] = amountEntry{t, amount}
}

// Reconcile replaces the charge from of the start at start with to; one
// folded already keeps its charge (more than it used, or as much).
func (b *Bucket) Reconcile(start time.Time, from, to int64) bool {
	at := start.UnixNano()
	i := sort.Search(len(b.es), func(i int) bool { return b.es[i].at >= at })
	for ; i < len(b.es) && b.es[i].at == at; i++ {
		if b.es[i].amount != from {
			continue
		}
		b.others.adjust(at, from-to, b.margin, b.Hold())
		if to > 0 {
			b.es[i].amount = to
		} else {
			b.es = append(b.es[:i], b.es[i+1:]...)
		}
		return true
	}
	return false
}

// Restore counts the logged starts of the last hold before now, on a
// bucket taken to be empty at the hold's beginning: whatever started
// before it, the bucket cannot be emptier then, and those starts cannot
// count more now (the refill since makes up for a full bucket's worth).
func (b *Bucket) Restore(starts []Logged, now time.Time) {
	cut := now.Add(-b.Hold()).UnixNano()
	if len(b.es) == 0 && b.tc == 0 {
		b.tc, b.dc = cut, b.capacity()
	}
	for _, s := range starts {
		if s.At.UnixNano() > cut {
			b.AddUsage(s.At, s.Amount)
		}
	}
}

// Quiet reports whether the bucket is full at now with nothing reserved;
// otherwise when it will be, if nothing else is taken.
func (b *Bucket) Quiet(now time.Time) (bool, time.Time) {
	if b.pending > 0 {
		return false, time.Time{}
	}
	d := b.deficit(now)
	if d <= 0 && (len(b.es) == 0 || b.es[len(b.es)-1].at <= now.UnixNano()) {
		return true, time.Time{}
	}
	return false, now.Add(time.Duration(ceil(d/b.rate())) + time.Nanosecond)
}

// Frees returns when the bucket is full again if nothing else is taken
// (zero if it is).
func (b *Bucket) Frees(now time.Time) time.Time {
	d := b.deficit(now)
	if d <= 0 {
		return time.Time{}
	}
	return now.Add(time.Duration(ceil(d / b.rate())))
}

// Unfit says why cost can never be admitted: it is above what the bucket
// holds (less the margin's refill).
func (b *Bucket) Unfit(cost int64) string {
	if float64(cost) > b.capacity() {
		return fmt.Sprintf("a cost of %d %s is above a bucket of %d refilling %d per %v", cost, b.name, b.limit, b.limit, b.length)
	}
	return ""
}
