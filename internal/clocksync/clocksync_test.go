package clocksync

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

func seed(t *testing.T) uint64 {
	if s := os.Getenv("RUNCUE_CLOCKSYNC_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := rand.Uint64()
	t.Logf("seed %d (set RUNCUE_CLOCKSYNC_SEED=%d to repeat)", v, v)
	return v
}

// TestBoundHolds: against a reference clock at a random offset drifting
// at up to the bound, over exchanges with random, asymmetric delays, the
// true offset always lies within the estimate and its uncertainty, and
// the uncertainty is at most half the fastest exchange's round trip
// plus the drift since. A step of the reference clock is detected by the
// first exchange whose proof excludes the bound in force, and the bound
// holds again from there.
func TestBoundHolds(t *testing.T) {
	s := seed(t)
	for run := range 200 {
		rnd := rand.New(rand.NewPCG(s, uint64(run)))
		e := &Estimator{MaxDrift: 50e-6}
		theta0 := time.Duration(rnd.Int64N(int64(10*time.Second))) - 5*time.Second
		rate := (rnd.Float64()*2 - 1) * 50e-6
		var step time.Duration
		stepAt := time.Duration(rnd.Int64N(int64(time.Hour)))
		epoch := time.Unix(1_800_000_000, 0)
		theta := func(local time.Time) time.Duration {
			d := local.Sub(epoch)
			th := theta0 + time.Duration(float64(d)*rate)
			if d >= stepAt {
				th += step
			}
			return th
		}
		if run%2 == 0 {
			step = time.Duration(rnd.Int64N(int64(2*time.Second))) + time.Millisecond // a step forward or back
			if rnd.IntN(2) == 0 {
				step = -step
			}
		}
		now := epoch
		var rtts []time.Duration // of the proofs held
		sawStep, fastAfter, sampledBefore := false, 0, false
		for range 120 {
			now = now.Add(time.Duration(rnd.Int64N(int64(time.Minute))))
			d1 := time.Duration(rnd.Int64N(int64(20 * time.Millisecond)))
			d2 := time.Duration(rnd.Int64N(int64(20 * time.Millisecond)))
			if rnd.IntN(10) == 0 {
				d1 += time.Second // a slow request
			}
			read := now.Add(d1)
			smp := Sample{Sent: now, Remote: read.Add(theta(read)), Received: read.Add(d2)}

			stepsBefore := e.Steps
			if !e.Add(smp) {
				t.Fatalf("run %d: sample refused", run)
			}
			now = smp.Received
			// Proofs narrower than half the step, on both sides of it,
			// cannot both hold: the step must be seen.
			narrow := d1+d2 < max(step, -step)/2
			sampledBefore = sampledBefore || (read.Sub(epoch) < stepAt && narrow)
			if read.Sub(epoch) >= stepAt && step != 0 {
				sawStep = true
			}
			if e.Steps > stepsBefore {
				rtts = rtts[:0] // the proofs before are dropped
			}
			rtts = append(rtts, d1+d2)
			if len(rtts) > 8 {
				rtts = rtts[1:]
			}
			minRTT := slices.Min(rtts)
			if sawStep && narrow {
				fastAfter++
			}
			for _, later := range []time.Duration{0, time.Second, 30 * time.Second} {
				at := now.Add(later)
				if step != 0 && at.Sub(epoch) >= stepAt && (read.Sub(epoch) < stepAt || e.Steps == 0) {
					// A step since the last exchange's reading, or one
					// not yet seen: an exchange whose proof is wide
					// enough to hold both offsets cannot tell.
					continue
				}
				off, unc, ok := e.Estimate(at)
				if !ok {
					t.Fatalf("run %d: no estimate", run)
				}
				if got := theta(at); got < off-unc || got > off+unc {
					t.Fatalf("run %d: true offset %v outside %v ± %v at +%v (step %v at %v)", run, got, off, unc, at.Sub(epoch), step, stepAt)
				}
				if later == 0 && unc > minRTT/2+time.Duration(float64(time.Hour)*2*50e-6)+time.Nanosecond {
					t.Fatalf("run %d: uncertainty %v above half the best round trip %v plus the drift", run, unc, minRTT)
				}
			}
		}
		if fastAfter > 0 && sampledBefore && e.Steps == 0 && (step > 50*time.Millisecond || step < -50*time.Millisecond) {
			t.Fatalf("run %d: a step of %v was not detected", run, step)
		}
	}
}

// TestLatestStart: a handler may start, on the local clock, no later than
// the deadline less the offset and its uncertainty; nothing may start
// before the first exchange.
func TestLatestStart(t *testing.T) {
	e := &Estimator{}
	local := time.Unix(1_800_000_000, 0)
	if _, ok := e.LatestStart(local, local); ok {
		t.Fatal("no exchange yet: no start")
	}
	// The reference is 2 s ahead; the exchange took 10 ms.
	e.Add(Sample{Sent: local, Remote: local.Add(2*time.Second + 5*time.Millisecond), Received: local.Add(10 * time.Millisecond)})
	deadline := local.Add(10 * time.Second)      // on the reference clock
	latest, ok := e.LatestStart(deadline, local) // asked at the exchange: no drift yet
	if !ok {
		t.Fatal("no estimate")
	}
	if want := local.Add(8*time.Second - 5*time.Millisecond); !latest.Equal(want) {
		t.Fatalf("latest start %v, want %v", latest.Sub(local), want.Sub(local))
	}
	if e.Add(Sample{Sent: local.Add(time.Second), Received: local, Remote: local}) {
		t.Fatal("a sample whose local clock went back proves nothing")
	}
}
