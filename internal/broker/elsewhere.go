package broker

import (
	"math"
	"slices"
	"sort"
	"time"
)

// elsewhere is what an amount meter has learned, from the service's
// readings of its limit, about the use of that limit from elsewhere: other
// programs sharing the key, or a limit lower than the meter's. It keeps
// the readings of the last two windows and makes of them the room the
// meter keeps for that use ahead of it, so that the meter's own starts
// leave the others what they have been taking, not only until the reset
// of the reading that showed it.
//
// A reading's figure (others) is what the meter's own count at the
// request's arrival does not explain of what the service said it had used:
// Limit less the meter's count less Remaining. Each reading's figure holds
// for a window after its arrival, then falls to none over the next: the
// room is the largest of them, so that it rises at the first reading that
// shows more and falls only when a window of readings shows less. (The
// starts of one instant reach the service one after the other, and only
// the last of them reads all the others: the earlier ones read less, and
// must not lower the room.) When the other use stops, the meter takes the
// room back within two windows.
//
// The room is that use and some more (headroom: a tenth of it, at least a
// twentieth of the limit): a reading shows what the others' requests
// used, not what they asked for, so a room of exactly their use would keep
// them at whatever the meter once left them, refusals and all; with room
// to spare, their use grows back to what they ask for, window by window,
// and the readings follow it.
//
// The readings are grouped in blocks of blk, each with the largest figure
// among them, so that the room and when it falls are found without
// walking every reading: a block whose largest figure, held as long as its
// latest reading's, cannot change the answer is passed over. At thousands
// of requests a minute, a reading each, the walk is what costs.
type elsewhere struct {
	// rs[head:] are the readings of the last two windows, by arrival;
	// those before head are dropped, and compacted away once they are
	// half of rs.
	rs    []reading
	head  int
	bmax  []int64 // the largest figure of rs[k*blk:(k+1)*blk], dropped ones included
	limit int64   // the meter's

	// The room as last computed, while no reading changes: from (Unix
	// ns) until until.
	valid       bool
	kept, seen  int64
	from, until int64
}

// headroom: the room kept is the others' use and 1/headroom more.
const headroom = 10

// reading is one reading of the service's limit.
type reading struct {
	at     int64 // the request's arrival (Unix ns, on the timeline)
	others int64 // what the meter's own count did not explain of the use; may be negative
	level  int64 // what the service said remained
	before int64 // and before the request was counted (level + its charge)
}

// blk is how many readings a block holds.
const blk = 64

// live returns the readings of the last two windows, by arrival.
func (e *elsewhere) live() []reading { return e.rs[e.head:] }

// add records r, of a meter of limit, keeping the readings of the two
// windows before the latest.
func (e *elsewhere) add(r reading, limit int64, window time.Duration) {
	e.valid, e.limit = false, limit
	live := e.live()
	i := e.head + sort.Search(len(live), func(i int) bool { return live[i].at > r.at })
	e.rs = append(e.rs, reading{})
	copy(e.rs[i+1:], e.rs[i:])
	e.rs[i] = r
	e.reblock(i, len(e.rs))
	cut := e.rs[len(e.rs)-1].at - 2*int64(window)
	live = e.live()
	e.head += sort.Search(len(live), func(i int) bool { return live[i].at > cut })
	if e.head > 0 && 2*e.head >= len(e.rs) {
		n := copy(e.rs, e.rs[e.head:])
		clear(e.rs[n:])
		e.rs, e.head = e.rs[:n], 0
		e.reblock(0, n)
	}
}

// reblock sets the largest figure of the blocks holding rs[from:to].
func (e *elsewhere) reblock(from, to int) {
	nb := (len(e.rs) + blk - 1) / blk
	if cap(e.bmax) < nb {
		e.bmax = append(e.bmax[:cap(e.bmax)], make([]int64, nb-cap(e.bmax))...)
	}
	e.bmax = e.bmax[:nb]
	for k := from / blk; k*blk < to && k < nb; k++ {
		m := int64(math.MinInt64)
		for _, r := range e.rs[k*blk : min((k+1)*blk, len(e.rs))] {
			m = max(m, r.others)
		}
		e.bmax[k] = m
	}
}

// adjust corrects the readings whose figure counted a start at start
// (Unix ns) whose charge fell by less: the readings of requests that
// arrived from that start less the margin to a hold after it. A reading
// compares the service's count with the meter's, which counts the runs in
// flight at their estimates; each such run's report of what it used
// corrects the figures of the readings it was counted in.
func (e *elsewhere) adjust(start, less int64, margin, hold time.Duration) {
	if less == 0 {
		return
	}
	lo, hi := start-int64(margin), start+int64(hold)-int64(margin)
	live := e.live()
	i := e.head + sort.Search(len(live), func(i int) bool { return live[i].at >= lo })
	from := i
	for ; i < len(e.rs) && e.rs[i].at < hi; i++ {
		e.rs[i].others += less
		e.valid = false
	}
	e.reblock(from, i)
}

// bound returns an upper bound of the figures of rs[from:to] (to-from at
// most a block's, within one).
func (e *elsewhere) bound(from, to int) int64 {
	if to-from >= blk/4 || from == to {
		return e.bmax[from/blk]
	}
	m := int64(math.MinInt64)
	for _, r := range e.rs[from:to] {
		m = max(m, r.others)
	}
	return m
}

// spans calls f for the pieces of rs[from:to] in its blocks, the latest
// first, until f returns false.
func (e *elsewhere) spans(from, to int, f func(lo, hi int) bool) {
	for hi := to; hi > from; {
		lo := max(from, (hi-1)/blk*blk)
		if !f(lo, hi) {
			return
		}
		hi = lo
	}
}

// room returns the room kept at now for use from elsewhere.
func (e *elsewhere) room(now time.Time, window time.Duration) int64 {
	room, _ := e.figures(now, window)
	return room
}

// figures returns the room kept at now, and the use from elsewhere it
// keeps room for.
func (e *elsewhere) figures(now time.Time, window time.Duration) (room, seen int64) {
	t := now.UnixNano()
	if e.valid && t >= e.from && t < e.until {
		return e.kept, e.seen
	}
	seen, steady := e.compute(t, int64(window))
	e.valid, e.kept, e.seen, e.from, e.until = true, e.withHeadroom(seen), max(seen, 0), t, steady
	return e.kept, e.seen
}

// withHeadroom is the room kept for a figure of others' use: that, and a
// tenth of it or a twentieth of the limit, whichever is more.
func (e *elsewhere) withHeadroom(others int64) int64 {
	if others <= 0 {
		return 0
	}
	return min(others+max(others/headroom, e.limit/20), max(e.limit, others))
}

// held returns what a reading of figure others taken at at (Unix ns)
// holds at t, for a window of window ns: its figure for a window, then
// less and less, none after two.
func held(others, at, t, window int64) int64 {
	switch over := t - at - window; {
	case others <= 0 || over >= window:
		return 0
	case over <= 0:
		return others
	default:
		return int64(float64(others) * (1 - float64(over)/float64(window)))
	}
}

// compute returns the use from elsewhere the room kept at t (Unix ns) is
// for, for a window of window ns, and until when it stays so if no reading
// comes.
func (e *elsewhere) compute(t, window int64) (int64, int64) {
	live := e.live()
	end := e.head + sort.Search(len(live), func(i int) bool { return live[i].at > t })
	mid := e.head + sort.Search(len(live), func(i int) bool { return live[i].at > t-window })   // from here on, held whole
	old := e.head + sort.Search(len(live), func(i int) bool { return live[i].at > t-2*window }) // before, none
	var most int64
	// A piece's readings hold at most its largest figure, for as long as
	// its latest reading holds (the later, the longer).
	e.spans(old, end, func(lo, hi int) bool {
		b := e.bound(lo, hi)
		if held(b, e.rs[hi-1].at, t, window) <= most {
			return true
		}
		for _, r := range e.rs[lo:hi] {
			most = max(most, held(r.others, r.at, t, window))
		}
		return true
	})
	// A reading that holds part of its figure falls: the room with it.
	// Otherwise the first one held whole ends the steady room.
	until := int64(math.MaxInt64)
	e.spans(old, mid, func(lo, hi int) bool {
		if e.bound(lo, hi) <= 0 {
			return true
		}
		for _, r := range e.rs[lo:hi] {
			if r.others > 0 {
				until = t + 1
				return false
			}
		}
		return true
	})
	if until == math.MaxInt64 {
		for lo := mid; lo < end; lo = (lo/blk + 1) * blk {
			hi := min(end, (lo/blk+1)*blk)
			if e.bound(lo, hi) <= 0 {
				continue
			}
			if i := slices.IndexFunc(e.rs[lo:hi], func(r reading) bool { return r.others > 0 }); i >= 0 {
				until = e.rs[lo+i].at + window + 1
				break
			}
		}
	}
	return most, until
}

// falls returns the first instant after now when the room kept is at
// most need if no reading comes; zero if never (need below zero) or if it
// is so already.
func (e *elsewhere) falls(now time.Time, window time.Duration, need int64) time.Time {
	if need < 0 {
		return time.Time{}
	}
	t, win := now.UnixNano(), int64(window)
	// The largest figure whose room is at most need.
	x := min(need-e.limit/20, need*headroom/(headroom+1))
	// When a reading of figure others, taken at at, holds x or less.
	down := func(others, at int64) int64 {
		if e.withHeadroom(others) <= need {
			return math.MinInt64
		}
		if x <= 0 {
			return at + 2*win
		}
		frac := 1 - float64(x)/float64(others)
		return at + win + int64(frac*float64(win)) + 1
	}
	live := e.live()
	end := e.head + sort.Search(len(live), func(i int) bool { return live[i].at > t })
	when := t
	e.spans(e.head, end, func(lo, hi int) bool {
		// The piece's largest figure, at its latest reading: none of
		// them falls later.
		if down(e.bound(lo, hi), e.rs[hi-1].at) <= when {
			return true
		}
		for _, r := range e.rs[lo:hi] {
			when = max(when, down(r.others, r.at))
		}
		return true
	})
	if when <= t {
		// The room is at most need already: a caller that finds it
		// more must not wait on it (nor come back at once).
		return time.Time{}
	}
	return time.Unix(0, when)
}
