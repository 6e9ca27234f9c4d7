package engine

import (
	"math"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// Fair shares: the keys of a keyed service whose class sets Share divide
// what they compete for (another service they all use, a meter of it,
// the Cue's MaxConcurrent) by weight, counted in cost. Dispatch order
// among the lanes of such keys is start-time fair queueing, the exact
// form of weighted deficit round robin: each key has a virtual finish
// (the cost it was given, divided by its weight, from the class's virtual
// time when it became busy), each lane is ordered by its key's next
// virtual start (the later of the two), and a dispatch moves its key's
// finish on by its cost over the weight. A key idle for a while comes
// back at the class's virtual time, with no credit saved up: a tenant
// cannot hoard a share it did not use. A key below its MinConcurrent goes
// before every key that is not. Owned by the dispatcher goroutine.
//
// Lanes are tagged when they enter a heap (ready, or a resource's
// waiters), so heap order never changes under them; a lane of a key with
// several lanes (several task types) can be ordered by a tag a dispatch
// of its sibling has since moved on, until it is next pushed.

// shareState is a fair class's virtual time.
type shareState struct {
	v float64
}

// fairOf returns the keyed resource of l whose class shares by Share,
// refreshed when limits change; nil for none.
func (t *resourceTable) fairOf(l *lane) *resource {
	if l.fairGen == t.limitsGen+1 {
		return l.fair
	}
	l.fair, l.fairGen = nil, t.limitsGen+1
	for _, r := range l.resources {
		if r.keyed && r.shareBy != "" {
			l.fair = r
			return r
		}
	}
	return nil
}

// shareSettings caches on keyed instance r the settings its shares read
// at every push and dispatch: its class's Share, and its Weight (at least
// a tiny positive number; zero means one) and MinConcurrent from s, its
// limits in force (its own override's, else its class's).
func (t *resourceTable) shareSettings(r *resource, s store.ServiceDef) {
	class, _ := t.effective(r.class)
	r.shareBy, r.minimum = class.Share, s.MinConcurrent
	r.weight = s.Weight
	if r.weight <= 0 || math.IsNaN(r.weight) || math.IsInf(r.weight, 0) {
		r.weight = 1
	}
	r.weight = max(r.weight, 1e-9)
}

// tagLane sets l's place among the lanes of its fair class, before it
// enters a heap.
func (t *resourceTable) tagLane(l *lane) {
	r := t.fairOf(l)
	if r == nil {
		return
	}
	l.tag = r.finish
	if !r.backlogged {
		// Idle until now: it starts at the class's virtual time, with
		// no credit saved up. A key that stayed backlogged keeps its
		// own finish: dispatches of others that fit beside room held
		// for it may run the class's time ahead of it.
		l.tag = max(t.shareClass(r.class).v, r.finish)
	}
	l.underMin = r.Active < r.minimum
}

func (t *resourceTable) shareClass(class string) *shareState {
	s := t.shares[class]
	if s == nil {
		s = &shareState{}
		t.shares[class] = s
	}
	return s
}

// chargeShare moves the virtual finish of l's key on by a dispatch of
// costs.
func (t *resourceTable) chargeShare(l *lane, costs rt.Costs) {
	r := t.fairOf(l)
	if r == nil {
		return
	}
	cls := t.shareClass(r.class)
	start := max(l.tag, r.finish) // a sibling lane of the key may have moved it on
	r.finish = start + float64(shareCost(r.shareBy, costs))/r.weight
	r.backlogged = l.units.Len() > 1 // more of its units wait
	cls.v = max(cls.v, start)
}

// shareUsed corrects the virtual finish of the key of run r by what it
// used of the shared amount, against the cost it was charged.
func (t *resourceTable) shareUsed(r *run, used map[string]int64) {
	res := t.fairOf(r.lane)
	if res == nil || len(used) == 0 {
		return
	}
	actual, ok := used[res.shareBy]
	if !ok || res.shareBy == store.MeterRequests {
		return
	}
	res.finish += float64(actual-shareCost(res.shareBy, r.costs())) / res.weight
}

// shareCost is what a dispatch of costs counts in a share of amount
// share: one for requests.
func shareCost(share string, costs rt.Costs) int64 {
	if share == store.MeterRequests {
		return 1
	}
	return costs.Of(share)
}

// reshare re-tags l where it waits, after a run of its key ended: a key
// that fell below its MinConcurrent goes first again.
func (t *resourceTable) reshare(l *lane) {
	if t.fairOf(l) == nil {
		return
	}
	t.tagLane(l)
	switch {
	case l.inReady:
		t.ready.Fix(l.idx)
	case l.parkedOn != nil:
		l.parkedOn.waiters.Fix(l.idx)
	}
}

// fairOrder orders two lanes by their fair shares, if that decides: they
// are lanes of one sharing class and, with a Priority function, their
// first units are scored alike (priority comes first; a unit waiting for
// its score goes by priority.go's rules, so shares are approximate while
// scoring lags behind a burst).
func (t *resourceTable) fairOrder(a, b *lane) (before, ok bool) {
	if t.cfg.Priority != nil {
		ua, ub := a.units.Peek(), b.units.Peek()
		if !ua.scored || !ub.scored || ua.score != ub.score {
			return false, false
		}
	}
	return fairBefore(a, b)
}

// fairBefore orders two lanes of one fair class: a key under its minimum
// first, then by virtual start; ok is false when they are not such lanes.
func fairBefore(a, b *lane) (before, ok bool) {
	if a.fair == nil || b.fair == nil || a.fair.class != b.fair.class {
		return false, false
	}
	if a.underMin != b.underMin {
		return a.underMin, true
	}
	if a.tag != b.tag {
		return a.tag < b.tag, true
	}
	return false, false
}
