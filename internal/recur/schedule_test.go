package recur

import (
	"testing"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

func sched(t *testing.T, missed rt.Missed, maxMissed int, cursor time.Time) *Sched {
	t.Helper()
	spec, err := Compile("s", rt.Timing{Every: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if maxMissed == 0 {
		maxMissed = DefaultMaxMissed
	}
	return &Sched{Name: "s", Spec: spec, Cursor: Cursor{Nominal: cursor}, Def: Def{Missed: missed, MaxMissed: maxMissed}}
}

// TestPlan: the periods before since are missed and handled by policy;
// the ones after are submitted; of a backlog after since, the latest
// maxOnTime are submitted and the older ones skipped as missed.
func TestPlan(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	since, now := t0.Add(10*time.Second), t0.Add(12*time.Second)
	// Periods 1 to 9 fall due before since (missed), 10 to 12 after.
	for _, c := range []struct {
		policy                     rt.Missed
		max                        int
		submitted, missedSubmitted int
		skipped                    int
	}{
		{rt.MissedLatest, 0, 4, 1, 8},
		{rt.MissedSkip, 0, 3, 0, 9},
		{rt.MissedEach, 4, 7, 4, 5},
	} {
		fs := Plan(sched(t, c.policy, c.max, t0), since, now)
		submitted, missed, skipped := 0, 0, 0
		for _, f := range fs {
			if f.Submit {
				submitted++
				if f.Reason == "missed" {
					missed++
				}
			}
			skipped += f.Skipped
			if f.Skipped > 0 && f.FirstSkipped != t0.Add(time.Second).Format(time.RFC3339Nano) {
				t.Errorf("%s: first skipped %s", c.policy, f.FirstSkipped)
			}
		}
		if submitted != c.submitted || missed != c.missedSubmitted || skipped != c.skipped {
			t.Errorf("%s: %d submitted (%d missed), %d skipped: %+v", c.policy, submitted, missed, skipped, fs)
		}
	}
	// A backlog of 5,000 periods after since (a host that slept).
	fs := Plan(sched(t, rt.MissedLatest, 0, t0), t0, t0.Add(5000*time.Second))
	if len(fs) != maxOnTime+1 || fs[0].Submit || fs[0].Skipped != 5000-maxOnTime || !fs[len(fs)-1].Period.Nominal.Equal(t0.Add(5000*time.Second)) {
		t.Errorf("%d firings, the first skipping %d", len(fs), fs[0].Skipped)
	}
}
