package broker

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestAIMDBounds: whatever the signals, the limit stays in [Floor,
// Ceiling]; a burst of overloads from runs started before the last cut
// cuts once; successes bring it back to the ceiling. Logged seed.
func TestAIMDBounds(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 3))
	a := NewAIMD(60, 6, 0.8, 0.02)
	now := time.Unix(0, 0)
	for range 100_000 {
		now = now.Add(time.Duration(rnd.IntN(100)) * time.Millisecond)
		if rnd.IntN(10) == 0 {
			a.Overload(now.Add(-time.Duration(rnd.IntN(2000))*time.Millisecond), now)
		} else {
			a.Success(1)
		}
		if l := a.Limit(); l < 6 || l > 60 || a.Effective() < 6 || a.Effective() > 60 {
			t.Fatalf("limit %d (effective %v) outside [6, 60]", l, a.Effective())
		}
	}
	b := NewAIMD(60, 6, 0.5, 0.02)
	t0 := time.Unix(100, 0)
	if !b.Overload(t0.Add(-time.Second), t0) || b.Limit() != 30 {
		t.Fatalf("first overload: limit %d, want 30", b.Limit())
	}
	for i := range 10 { // the same burst: runs started before the cut
		if b.Overload(t0.Add(-time.Duration(i)*time.Millisecond), t0.Add(time.Duration(i)*time.Millisecond)) {
			t.Fatal("a second cut for one burst")
		}
	}
	if b.Limit() != 30 || b.Overloads() != 11 {
		t.Fatalf("limit %d after one burst, overloads %d", b.Limit(), b.Overloads())
	}
	if !b.Overload(t0.Add(time.Second), t0.Add(2*time.Second)) || b.Limit() != 15 {
		t.Fatalf("a run started after the cut cuts again: %d", b.Limit())
	}
	n := 0
	for b.Limit() < 60 {
		b.Success(1)
		n++
	}
	if b.Overloads() != 0 || n < 100 {
		t.Fatalf("back at the ceiling after %d successes, overloads %d", n, b.Overloads())
	}
	c := NewAIMD(60, 6, 0.5, 0.02)
	c.Restore(AIMDState{Effective: 42.5, Overloads: 3})
	if c.Limit() != 42 || c.Overloads() != 3 {
		t.Fatalf("restored %d, %d", c.Limit(), c.Overloads())
	}
	c.Restore(AIMDState{Effective: 1e9})
	if c.Limit() != 60 {
		t.Fatalf("a restored state above the ceiling: %d", c.Limit())
	}
	c.SetCeiling(30, 3)
	if c.Limit() != 30 {
		t.Fatalf("a lower ceiling: %d", c.Limit())
	}
}

// TestAIMDFindsHiddenLimit: a sender whose rate window follows an AIMD
// limit (ceiling 60 a minute) against a service that refuses (429) every
// request beyond 36 in its own sliding minute: over the second hour, at
// least 85% of the hidden limit goes through and under 2% of the requests
// are refused. Then the hidden limit rises to 60, and the sender follows.
func TestAIMDFindsHiddenLimit(t *testing.T) {
	const ceiling, hidden = 60, 36
	a := NewAIMD(ceiling, 6, 0.8, 0.02)
	w := NewWindow(ceiling, time.Minute)
	var served []time.Time // the service's own log of accepted requests
	now := time.Unix(0, 0)
	hiddenAt := func(at time.Time) int {
		if at.Sub(time.Unix(0, 0)) >= 2*time.Hour {
			return ceiling
		}
		return hidden
	}
	var sent, refused, ok2 int
	var recovered time.Duration
	for now.Sub(time.Unix(0, 0)) < 3*time.Hour {
		w.SetLimits(int(a.Limit()), time.Minute)
		if w.Allow(now) {
			w.Reserve(now)
			w.Commit(now)
			// The service's sliding window, counted at arrival.
			cut := 0
			for cut < len(served) && !served[cut].After(now.Add(-time.Minute)) {
				cut++
			}
			served = served[cut:]
			second := now.Sub(time.Unix(0, 0)) >= time.Hour && now.Sub(time.Unix(0, 0)) < 2*time.Hour
			if second {
				sent++
			}
			if len(served) >= hiddenAt(now) {
				a.Overload(now, now.Add(200*time.Millisecond)) // the refusal arrives a round trip later
				if second {
					refused++
				}
			} else {
				served = append(served, now)
				a.Success(1)
				if second {
					ok2++
				}
			}
			if recovered == 0 && hiddenAt(now) == ceiling && a.Limit() >= ceiling*9/10 {
				recovered = now.Sub(time.Unix(0, 2*int64(time.Hour)))
			}
		}
		now = now.Add(50 * time.Millisecond)
	}
	through := float64(ok2) / (hidden * 60)
	refusedShare := float64(refused) / float64(sent)
	t.Logf("second hour: %d sent, %d refused (%.2f%%), %.1f%% of the hidden limit through; after it rose, 90%% of the ceiling reached in %v",
		sent, refused, 100*refusedShare, 100*through, recovered)
	if through < 0.85 || refusedShare >= 0.02 {
		t.Fatalf("throughput %.3f of the hidden limit, %.3f refused", through, refusedShare)
	}
	if recovered == 0 || recovered > 45*time.Minute {
		t.Fatalf("did not follow the limit up within 45 minutes: %v", recovered)
	}
}
