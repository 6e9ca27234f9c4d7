package broker

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestElsewhereRoom: each reading's figure holds for a window after its
// arrival, then falls to none over the next; the room kept is the largest,
// and a tenth more, at least a twentieth of the limit; a reading's figure
// is corrected when a run it counted at its estimate reports less.
func TestElsewhereRoom(t *testing.T) {
	t0 := time.Unix(1000, 0)
	win := 2 * time.Second
	var e elsewhere
	assert.Zero(t, e.room(t0, win))
	assert.True(t, e.falls(t0, win, 0).IsZero(), "no reading: no room to wait on")

	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	e.add(reading{at: at(0).UnixNano(), others: 4000}, 10_000, win)
	e.add(reading{at: at(500).UnixNano(), others: 3000}, 10_000, win)
	assert.Equal(t, int64(4500), e.room(at(600), win), "the largest, and a twentieth of the limit (more than a tenth of it)")
	assert.Equal(t, int64(4500), e.room(at(2000), win), "held for a window")
	assert.Equal(t, int64(2750), e.room(at(3000), win), "then less and less: 2,250 of the 3,000, half a window later")
	assert.Zero(t, e.room(at(4500), win), "none two windows after the latest")
	assert.InDelta(t, at(3000).UnixNano(), e.falls(at(600), win, 2750).UnixNano(), float64(time.Millisecond), "when every reading's room is down to the need")
	assert.True(t, e.falls(at(600), win, -1).IsZero(), "a need below zero: never")
	assert.True(t, e.falls(at(600), win, 4500).IsZero(), "the room is down to the need already")

	// A run counted at its estimate in the reading reports 500 less: the
	// reading said 500 too little of the others.
	var f elsewhere
	f.add(reading{at: at(3000).UnixNano(), others: 1000}, 10_000, win)
	f.adjust(at(2900).UnixNano(), 500, 10*time.Millisecond, win+10*time.Millisecond)
	assert.Equal(t, int64(2000), f.room(at(3100), win))
	f.adjust(at(3100).UnixNano(), 500, 10*time.Millisecond, win+10*time.Millisecond)
	assert.Equal(t, int64(2000), f.room(at(3100), win), "a start after the reading's arrival was not in its count")
	f.add(reading{at: at(7100).UnixNano(), others: 0}, 10_000, win)
	assert.Len(t, f.live(), 1, "the readings older than two windows before the latest are dropped")
}

// TestWindowKeepsRoom: an API shared with another client that uses 80% of
// its limit steadily for 20 s; the window, told only the API's remaining after each
// of its requests, keeps the other's share free, whatever its own
// estimates over-counted, and takes the room back once the other stops.
func TestWindowKeepsRoom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 1))
	t0 := time.Unix(1000, 0)
	const limit, win = 12_000, 2 * time.Second
	w := NewAmountWindow("tokens", limit, win, 0, rt.ChargeActual)
	type call struct {
		at       time.Time
		est, use int64
	}
	var api []call // what the API counted, by arrival
	apiUsed := func(at time.Time) int64 {
		var n int64
		for _, c := range api {
			if c.at.After(at.Add(-win)) && !c.at.After(at) {
				n += c.use
			}
		}
		return n
	}
	others := func(at time.Time) bool { return at.Before(t0.Add(20 * time.Second)) }
	nextOther := t0
	var inflight []call
	var maxTotal int64
	for now := t0; now.Before(t0.Add(30 * time.Second)); now = now.Add(10 * time.Millisecond) {
		w.Expire(now)
		for ; !nextOther.After(now); nextOther = nextOther.Add(100 * time.Millisecond) {
			if others(nextOther) {
				api = append(api, call{at: nextOther, use: 480})
			}
		}
		// Answers after 50 ms: usage reconciled, the API's remaining read.
		for len(inflight) > 0 && !inflight[0].at.After(now.Add(-50*time.Millisecond)) {
			c := inflight[0]
			inflight = inflight[1:]
			w.Reconcile(c.at, c.est, c.use)
			w.Observe(c.at, limit-apiUsed(c.at), c.use)
		}
		for {
			use := 100 + rnd.Int64N(200)
			est := use + 150
			if _, refused := w.Refusal(now, est); refused {
				break
			}
			w.Take(now, est)
			w.Start(now, now, est)
			c := call{at: now, est: est, use: use}
			api = append(api, c)
			inflight = append(inflight, c)
		}
		if now.After(t0.Add(5*time.Second)) && others(now) {
			maxTotal = max(maxTotal, apiUsed(now))
			assert.GreaterOrEqual(t, w.Elsewhere(now), int64(9600), "room for the other's 9,600 at %v", now.Sub(t0))
		}
	}
	assert.LessOrEqual(t, maxTotal, int64(limit), "once the other's use was read, the API's count stayed within its limit")
	assert.Zero(t, w.Elsewhere(t0.Add(30*time.Second)), "the other stopped: the room is taken back")
	assert.Greater(t, apiUsed(t0.Add(30*time.Second)), int64(limit*9/10), "and used")
}

// TestBucketLeavesShare: a bucket API shared with another client that
// takes 40% of its refill steadily; the bucket, told only the API's level
// after each of its requests, leaves the other its share of the refill
// and room for its requests: once the share is read, the other's requests
// always find the API's bucket holding enough, and the bucket's own starts
// use most of what the other leaves.
func TestBucketLeavesShare(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 2))
	t0 := time.Unix(1000, 0)
	const limit, win = 12_000, 2 * time.Second
	rate := float64(limit) / float64(win)
	b := NewBucket("tokens", limit, win, 0, rt.ChargeActual)
	level, last := float64(limit), t0
	take := func(at time.Time, n int64) bool {
		level = min(float64(limit), level+rate*float64(at.Sub(last)))
		last = at
		if level < float64(n) {
			return false
		}
		level -= float64(n)
		return true
	}
	type call struct {
		at       time.Time
		est, use int64
		level    int64
	}
	var inflight []call
	nextOther := t0
	var refusedOthers, refusedOwn, ownUsed int64
	var shares []float64
	warm := t0.Add(10 * time.Second)
	for now := t0; now.Before(t0.Add(40 * time.Second)); now = now.Add(5 * time.Millisecond) {
		b.Expire(now)
		if now.After(warm) {
			_, share := b.FromElsewhere(now)
			shares = append(shares, share)
		}
		for ; !nextOther.After(now); nextOther = nextOther.Add(100 * time.Millisecond) {
			if !take(nextOther, 240) && nextOther.After(warm) {
				refusedOthers++
			}
		}
		for len(inflight) > 0 && !inflight[0].at.After(now.Add(-80*time.Millisecond)) {
			c := inflight[0]
			inflight = inflight[1:]
			b.Reconcile(c.at, c.est, c.use)
			b.Observe(c.at, c.level, c.use)
		}
		for {
			use := 100 + rnd.Int64N(200)
			est := use + 150
			if _, refused := b.Refusal(now, est); refused {
				break
			}
			b.Take(now, est)
			b.Start(now, now, est)
			c := call{at: now, est: est, use: use}
			if !take(now, use) {
				c.use = 0
				if now.After(warm) {
					refusedOwn++
				}
			} else if now.After(warm) {
				ownUsed += use
			}
			c.level = int64(level)
			inflight = append(inflight, c)
		}
	}
	slices.Sort(shares)
	share := shares[len(shares)/2]
	t.Logf("after warm-up: share read %.3f (median; %.3f to %.3f), the other refused %d times, the bucket's own %d; own use %d",
		share, shares[0], shares[len(shares)-1], refusedOthers, refusedOwn, ownUsed)
	assert.InDelta(t, 0.4, share, 0.05, "the other's share of the refill")
	assert.Zero(t, refusedOthers, "the other's requests found room")
	assert.LessOrEqual(t, refusedOwn, int64(5), "the bucket's own requests found room")
	left := 0.6 * rate * float64(30*time.Second)
	assert.Greater(t, float64(ownUsed), 0.8*left, "most of what the other left was used")
}

// BenchmarkElsewhereRoom: the room kept, computed at an admission of a
// meter of a one-minute window, after a new reading (each request's
// answer brings one, and a reading changes the room). The readings of two
// windows are walked: the cost grows with the requests a minute.
func BenchmarkElsewhereRoom(b *testing.B) {
	for _, rpm := range []int{1_000, 10_000, 60_000} {
		b.Run(fmt.Sprintf("rpm=%d", rpm), func(b *testing.B) {
			const win = time.Minute
			var e elsewhere
			rnd := rand.New(rand.NewPCG(1, 2))
			step := win / time.Duration(rpm)
			now := time.Unix(1000, 0)
			for range 2 * rpm {
				e.add(reading{at: now.UnixNano(), others: rnd.Int64N(50_000)}, 1_000_000, win)
				now = now.Add(step)
			}
			for b.Loop() {
				e.add(reading{at: now.UnixNano(), others: rnd.Int64N(50_000)}, 1_000_000, win)
				_ = e.room(now, win)
				now = now.Add(step)
			}
		})
	}
}

// TestElsewhereBlocks: the room, until when it holds and when it falls,
// found through the blocks, are those of a walk of every reading, through
// readings out of order, corrections, drops and compactions (seeded).
func TestElsewhereBlocks(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 3))
	const win = 10 * time.Second
	const limit = 100_000
	var e elsewhere
	naive := func(tt int64) (most, until int64) {
		until = math.MaxInt64
		for _, r := range e.live() {
			if r.at > tt {
				break
			}
			h := held(r.others, r.at, tt, int64(win))
			most = max(most, h)
			switch {
			case r.others > 0 && tt-r.at >= 2*int64(win):
			case r.others > 0 && tt-r.at >= int64(win):
				until = tt + 1 // falling
			case r.others > 0:
				until = min(until, r.at+int64(win)+1)
			}
		}
		return most, until
	}
	naiveFalls := func(tt, need int64) int64 {
		x := min(need-limit/20, need*headroom/(headroom+1))
		when := tt
		for _, r := range e.live() {
			if r.at > tt || e.withHeadroom(r.others) <= need {
				continue
			}
			if x <= 0 {
				when = max(when, r.at+2*int64(win))
				continue
			}
			when = max(when, r.at+int64(win)+int64((1-float64(x)/float64(r.others))*float64(win))+1)
		}
		if when <= tt {
			return 0
		}
		return when
	}
	now := int64(1e12)
	for i := range 20_000 {
		now += rnd.Int64N(int64(5 * time.Millisecond))
		others := rnd.Int64N(60_000) - 10_000
		if rnd.IntN(10) == 0 {
			others = 0
		}
		at := now - rnd.Int64N(int64(2*time.Second)) // answers come out of order
		e.add(reading{at: at, others: others}, limit, win)
		if rnd.IntN(4) == 0 {
			e.adjust(now-rnd.Int64N(int64(3*time.Second)), rnd.Int64N(2_000)-500, 10*time.Millisecond, time.Second)
		}
		q := now - rnd.Int64N(int64(time.Second)) + rnd.Int64N(int64(3*win))
		most, until := e.compute(q, int64(win))
		wm, wu := naive(q)
		require.Equal(t, wm, most, "step %d: the room's figure at %d", i, q)
		require.Equal(t, wu, until, "step %d: until", i)
		need := rnd.Int64N(limit)
		got := e.falls(time.Unix(0, q), win, need)
		want := naiveFalls(q, need)
		if want == 0 {
			require.True(t, got.IsZero(), "step %d: falls", i)
		} else {
			require.Equal(t, want, got.UnixNano(), "step %d: falls", i)
		}
	}
}
