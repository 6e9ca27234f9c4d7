package broker

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
	"github.com/stretchr/testify/assert"
)

func TestAmountWindowRefusal(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := NewAmountWindow("tokens", 100, time.Minute, 10*time.Millisecond, rt.ChargeActual)
	if _, refused := w.Refusal(t0, 101); !refused {
		t.Fatal("a cost above the limit is admitted")
	}
	w.Take(t0, 60)
	if rf, refused := w.Refusal(t0, 50); !refused || !rf.Until.IsZero() || rf.Meter != "tokens" {
		t.Fatalf("60 reserved, 50 more: %+v %v (only a start can make room)", rf, refused)
	}
	if _, refused := w.Refusal(t0, 40); refused {
		t.Fatal("60 reserved, 40 more is refused")
	}
	w.Start(t0.Add(time.Second), t0, 60)
	rf, refused := w.Refusal(t0.Add(2*time.Second), 50)
	if want := t0.Add(time.Second + time.Minute + 10*time.Millisecond); !refused || !rf.Until.Equal(want) {
		t.Fatalf("refusal %+v, want until %v", rf, want)
	}
	if _, refused := w.Refusal(rf.Until, 50); refused {
		t.Fatal("refused at the instant it said")
	}
	if _, refused := w.Refusal(t0, 0); refused {
		t.Fatal("a cost of zero is refused")
	}
	// The run used 20: the window frees 40 at once.
	if !w.Reconcile(t0.Add(time.Second), 60, 20) {
		t.Fatal("reconcile found no entry")
	}
	if got := w.Used(t0.Add(2 * time.Second)); got != 20 {
		t.Fatalf("used %d after reconciling to 20", got)
	}
	if w.Reconcile(t0.Add(time.Second), 60, 10) {
		t.Fatal("reconciled an entry whose charge is no longer 60")
	}
	if !w.Reconcile(t0.Add(time.Second), 20, 0) || w.Used(t0.Add(2*time.Second)) != 0 {
		t.Fatal("a charge reconciled to zero stays")
	}
	if q, _ := w.Quiet(t0.Add(2 * time.Second)); !q {
		t.Fatal("empty window not quiet")
	}
}

func TestChargePolicies(t *testing.T) {
	for _, c := range []struct {
		p               rt.Charge
		est, act, wantV int64
	}{{rt.ChargeActual, 50, 20, 20}, {rt.ChargeActual, 50, 80, 80}, {rt.ChargeLarger, 50, 20, 50}, {rt.ChargeLarger, 50, 80, 80},
		{rt.ChargeEstimate, 50, 20, 50}, {rt.ChargeEstimate, 50, 80, 50}} {
		if got := c.p.Charged(c.est, c.act); got != c.wantV {
			t.Errorf("policy %d: est %d actual %d: %d, want %d", c.p, c.est, c.act, got, c.wantV)
		}
	}
}

// TestAmountWindowProperty: dispatches of random costs decided whenever
// the window admits them, each started after a random delay (some never),
// some reconciled below their estimate, never sum to more than the limit
// in any interval of the hold, counted at the starts. Logged seed.
func TestAmountWindowProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	const limit = 1000
	hold := time.Second + 5*time.Millisecond
	starts, span := driveMeter(t, rand.New(rand.NewPCG(seed, 1)), NewAmountWindow("tokens", limit, time.Second, 5*time.Millisecond, rt.ChargeActual), limit/10)
	var total int64
	for i := range starts {
		var sum int64
		for j := i; j < len(starts) && starts[j].at.Sub(starts[i].at) < hold; j++ {
			sum += starts[j].amount
		}
		if sum > limit {
			t.Fatalf("%d in the hold from %v", sum, starts[i].at)
		}
		total += starts[i].amount
	}
	t.Logf("%d starts, %d charged over %v", len(starts), total, span)
}

// meterStart is a start a driven meter counted: when, and what it
// charged in the end.
type meterStart struct {
	at     time.Time
	amount int64
}

// driveMeter decides dispatches of random costs (1 to maxCost) whenever m
// admits them, over 20,000 steps of 0-19 ms, starts each 0-29 ms after
// its decision (reported in the order the steps reach them, so out of
// order among themselves), releases one in 20 unstarted and reconciles one
// in 3 to a random part of its cost. It returns the starts with their
// final charges, sorted, and the time it covered.
func driveMeter(t *testing.T, rnd *rand.Rand, m AmountMeter, maxCost int64) ([]meterStart, time.Duration) {
	t.Helper()
	type pendingRun struct {
		startAt time.Time
		cost    int64
	}
	var starts []meterStart
	var runs []pendingRun
	now := time.Unix(0, 0)
	for step := 0; step < 20000; step++ {
		now = now.Add(time.Duration(rnd.IntN(20)) * time.Millisecond)
		kept := runs[:0]
		for _, r := range runs {
			if r.startAt.After(now) {
				kept = append(kept, r)
				continue
			}
			if rnd.IntN(20) == 0 {
				m.Release(r.cost)
				continue
			}
			m.Start(r.startAt, r.startAt, r.cost)
			amount := r.cost
			if rnd.IntN(3) == 0 {
				amount = rnd.Int64N(r.cost + 1)
				if !m.Reconcile(r.startAt, r.cost, amount) {
					t.Fatalf("step %d: no entry to reconcile", step)
				}
			}
			if amount > 0 {
				starts = append(starts, meterStart{r.startAt, amount})
			}
		}
		runs = kept
		cost := 1 + rnd.Int64N(maxCost)
		if _, refused := m.Refusal(now, cost); !refused {
			m.Take(now, cost)
			runs = append(runs, pendingRun{now.Add(time.Duration(rnd.IntN(30)) * time.Millisecond), cost})
		}
	}
	slices.SortStableFunc(starts, func(a, b meterStart) int { return a.at.Compare(b.at) })
	if len(starts) < 1000 {
		t.Fatalf("only %d starts", len(starts))
	}
	return starts, now.Sub(time.Unix(0, 0))
}

// TestHeld: room held for a refused dispatch counts against every other
// until it lapses; the largest refused dispatch takes the hold.
func TestHeld(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := &Resource{}
	r.SetAmounts([]AmountLimits{{Name: "tokens", Limit: 100, Window: time.Second}}, 0)
	r.Take(t0, false, rt.Costs{"tokens": 60})
	r.Start(t0, t0, rt.Costs{"tokens": 60})
	big, small, bigger := "big", "small", "bigger"
	if _, refused := r.RefusalFor(t0, rt.Costs{"tokens": 90}, big); !refused {
		t.Fatal("90 admitted beside 60")
	}
	r.Hold(big, rt.Costs{"tokens": 90}, "tokens", t0, t0.Add(2*time.Second))
	rf, refused := r.RefusalFor(t0, rt.Costs{"tokens": 20}, small)
	if !refused || !rf.Held || !rf.Until.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("a small dispatch beside the hold: %+v %v", rf, refused)
	}
	at := t0.Add(time.Second + time.Nanosecond) // the 60 left
	if _, refused := r.RefusalFor(at, rt.Costs{"tokens": 10}, small); refused {
		t.Fatal("10 fits beside the held 90 once the window is empty")
	}
	if _, refused := r.RefusalFor(at, rt.Costs{"tokens": 20}, small); !refused {
		t.Fatal("20 does not fit beside the held 90")
	}
	if _, refused := r.RefusalFor(at, rt.Costs{"tokens": 90}, big); refused {
		t.Fatal("the holder is refused by its own hold")
	}
	r.Hold(small, rt.Costs{"tokens": 20}, "tokens", t0, t0.Add(3*time.Second))
	if r.Held.For != big {
		t.Fatal("a smaller dispatch took the hold")
	}
	r.Hold(bigger, rt.Costs{"tokens": 95}, "tokens", t0, t0.Add(3*time.Second))
	if r.Held.For != bigger {
		t.Fatal("a larger dispatch did not take the hold")
	}
	if _, refused := r.RefusalFor(t0.Add(3*time.Second), rt.Costs{"tokens": 20}, small); refused {
		t.Fatal("the hold did not lapse")
	}
}

// TestBucket: a full bucket lets its whole limit start at once, then
// refills at limit per length; a reservation counts as taken; a reconciled
// charge gives the difference back; a restored bucket was empty a hold
// before the restore.
func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := NewBucket("tokens", 600, time.Minute, 0, rt.ChargeActual) // 10 a second
	if _, refused := b.Refusal(t0, 600); refused {
		t.Fatal("a full bucket refuses its limit")
	}
	b.Take(t0, 600)
	rf, refused := b.Refusal(t0, 1)
	if !refused || !rf.Until.IsZero() {
		t.Fatalf("the reservation empties it: %+v %v", rf, refused)
	}
	b.Start(t0, t0, 600)
	rf, refused = b.Refusal(t0, 50)
	if want := t0.Add(5 * time.Second); !refused || !rf.Until.Equal(want) {
		t.Fatalf("50 after emptying: %+v, want until %v", rf, want)
	}
	if _, refused := b.Refusal(rf.Until, 50); refused {
		t.Fatal("refused when it said")
	}
	if !b.Reconcile(t0, 600, 100) {
		t.Fatal("no entry to reconcile")
	}
	if got := b.Used(t0); got != 100 {
		t.Fatalf("used %d after reconciling to 100", got)
	}
	if q, until := b.Quiet(t0); q || !until.After(t0.Add(10*time.Second)) {
		t.Fatalf("quiet %v until %v", q, until)
	}
	r := NewBucket("tokens", 600, time.Minute, 0, rt.ChargeActual)
	r.Restore([]Logged{{At: t0.Add(-30 * time.Second), Amount: 100}}, t0)
	// Empty at t0-60s: 300 refilled by t0-30s, then 100 taken: 400 taken
	// at t0-30s, 100 at t0.
	if got := r.Used(t0); got != 100 {
		t.Fatalf("restored: used %d, want 100", got)
	}
	if got := r.Used(t0.Add(-30 * time.Second)); got != 400 {
		t.Fatalf("restored: used %d at the entry, want 400", got)
	}
}

// TestBucketProperty: dispatches of random costs decided whenever the
// bucket admits them, started after a random delay (some never), some
// reconciled below their estimate, folded as time passes: the amounts
// started within any interval of length d never exceed limit plus d's
// refill, counted at the starts. Logged seed.
func TestBucketProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	const limit = 1000
	length := time.Second
	starts, span := driveMeter(t, rand.New(rand.NewPCG(seed, 2)), NewBucket("tokens", limit, length, 0, rt.ChargeActual), limit/5)
	rate := float64(limit) / float64(length)
	for i := range starts {
		var sum int64
		for j := i; j < len(starts); j++ {
			sum += starts[j].amount
			if allowed := float64(limit) + rate*float64(starts[j].at.Sub(starts[i].at)); float64(sum) > allowed+1e-6 {
				t.Fatalf("%d started in [%v, %v], allowed %.0f", sum, starts[i].at, starts[j].at, allowed)
			}
			if starts[j].at.Sub(starts[i].at) > 20*length {
				break
			}
		}
	}
	t.Logf("%d starts over %v", len(starts), span)
}

// TestCountedAt: SumAt and CountAt count what the window held at a past
// instant: the entries in the window ending there, not the later ones
// (Sum and Count count those too).
func TestCountedAt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := NewAmountWindow("tokens", 10_000, time.Minute, 0, rt.ChargeActual)
	r := NewWindow(100, time.Minute)
	for i, amount := range []int64{100, 200, 400} {
		at := t0.Add(time.Duration(i) * 10 * time.Second)
		w.AddUsage(at, amount)
		r.Add(at)
	}
	at := t0.Add(15 * time.Second)
	assert.Equal(t, int64(300), w.SumAt(at), "the first two")
	assert.Equal(t, int64(700), w.Sum(at), "Sum counts the later one too")
	assert.Equal(t, 2, r.CountAt(at))
	assert.Equal(t, 3, r.Count(at))
	late := t0.Add(65 * time.Second) // the first has left
	assert.Equal(t, int64(600), w.SumAt(late))
	assert.Equal(t, 2, r.CountAt(late))
	assert.Equal(t, int64(0), w.SumAt(t0.Add(-time.Second)))
	assert.Equal(t, 0, r.CountAt(t0.Add(-time.Second)))
}
