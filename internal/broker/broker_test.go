package broker

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Unix(1_800_000_000, 0)

func TestWindowSliding(t *testing.T) {
	w := NewWindow(3, 10*time.Second)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, s := range []float64{0, 1, 2} {
		if !w.Allow(at(s)) {
			t.Fatalf("refused at %v", s)
		}
		w.Add(at(s))
	}
	if w.Allow(at(9.999)) {
		t.Fatal("a fourth dispatch within 10s")
	}
	if got := w.NextFree(at(5)); !got.Equal(at(10)) {
		t.Fatalf("next free %v, want t0+10s", got.Sub(t0))
	}
	if !w.Allow(at(10)) {
		t.Fatal("the oldest entry leaves at exactly t+length")
	}
	w.Add(at(10))
	if w.Count(at(10)) != 3 || w.Allow(at(10.5)) {
		t.Fatal("window should be full again")
	}
	if got := w.NextFree(at(10.5)); !got.Equal(at(11)) {
		t.Fatalf("next free %v", got.Sub(t0))
	}
	if w.Count(at(100)) != 0 {
		t.Fatal("everything expires")
	}
	if _, ok := w.Last(); ok {
		t.Fatal("empty window has no last entry")
	}
}

// TestWindowProperty: dispatching as fast as Allow permits never puts more
// than limit starts in any interval of length window, and the achieved
// count over a long run is the maximum.
func TestWindowProperty(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 7))
	for range 50 {
		limit := 1 + rnd.IntN(20)
		length := time.Duration(1+rnd.IntN(5000)) * time.Millisecond
		w := NewWindow(limit, length)
		now := t0
		var starts []time.Time
		for len(starts) < 500 {
			if w.Allow(now) {
				w.Add(now)
				starts = append(starts, now)
			} else {
				next := w.NextFree(now)
				if !next.After(now) {
					t.Fatal("NextFree does not advance")
				}
				// Sometimes jump exactly to it, sometimes past it.
				now = next.Add(time.Duration(rnd.IntN(3)) * time.Millisecond)
			}
			now = now.Add(time.Duration(rnd.IntN(int(length/time.Millisecond)/limit+1)) * time.Millisecond)
		}
		for i := limit; i < len(starts); i++ {
			if d := starts[i].Sub(starts[i-limit]); d < length {
				t.Fatalf("limit %d window %v: %d starts within %v", limit, length, limit+1, d)
			}
		}
	}
}

func TestWindowResize(t *testing.T) {
	w := NewWindow(5, time.Minute)
	for i := range 5 {
		w.Add(t0.Add(time.Duration(i) * time.Second))
	}
	small := w.Resize(2, time.Minute)
	if small.Count(t0.Add(5*time.Second)) != 2 {
		t.Fatal("resize keeps the newest entries that fit")
	}
	if last, _ := small.Last(); !last.Equal(t0.Add(4 * time.Second)) {
		t.Fatal("newest kept")
	}
	big := w.Resize(10, time.Minute)
	if big.Count(t0.Add(5*time.Second)) != 5 || !big.Allow(t0.Add(5*time.Second)) {
		t.Fatal("a larger window keeps all and has room")
	}
}

func TestCircuit(t *testing.T) {
	c := NewCircuit(3, time.Minute)
	now := t0
	fail := func(probe bool) bool { return c.Failure(now, probe) }
	if ok, _, _ := c.Allow(now); !ok {
		t.Fatal("closed refuses")
	}
	fail(false)
	fail(false)
	c.Success(false)
	if c.Failures != 0 {
		t.Fatal("success resets the count")
	}
	fail(false)
	fail(false)
	if !fail(false) || c.State != Open {
		t.Fatal("third consecutive failure opens")
	}
	if ok, until, _ := c.Allow(now.Add(59 * time.Second)); ok || !until.Equal(t0.Add(time.Minute)) {
		t.Fatal("open refuses until its timeout")
	}
	now = t0.Add(time.Minute)
	ok, _, probe := c.Allow(now)
	if !ok || !probe || c.State != HalfOpen {
		t.Fatal("half-open admits a probe")
	}
	c.Started(true)
	if ok, until, _ := c.Allow(now); ok || !until.IsZero() {
		t.Fatal("exactly one probe")
	}
	// A late failure of a run started before the circuit opened is not a verdict.
	if c.Failure(now, false) || c.State != HalfOpen {
		t.Fatal("only the probe's outcome decides")
	}
	c.Neutral(true) // the probe was cancelled
	if ok, _, probe := c.Allow(now); !ok || !probe {
		t.Fatal("after a neutral probe another may go")
	}
	c.Started(true)
	if !c.Failure(now, true) || c.State != Open || !c.Until.Equal(now.Add(time.Minute)) {
		t.Fatal("a failed probe reopens with a fresh timeout")
	}
	now = now.Add(time.Minute)
	_, _, probe = c.Allow(now)
	c.Started(probe)
	if !c.Success(true) || c.State != Closed {
		t.Fatal("a successful probe closes")
	}
}

func TestCircuitStatesAreStable(t *testing.T) {
	got := []string{string(Closed), string(Open), string(HalfOpen)}
	if !slices.Equal(got, []string{"closed", "open", "half_open"}) {
		t.Fatal(got)
	}
}
