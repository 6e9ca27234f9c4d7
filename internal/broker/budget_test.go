package broker

import (
	"testing"
	"time"

	"github.com/runcue/runcue/internal/testutil"

	"github.com/runcue/runcue/runcuetype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBudgetPeriods(t *testing.T) {
	ny := testutil.Zone(t, "America/New_York")
	wall := time.Date(2026, 3, 7, 23, 0, 0, 0, ny) // the eve of spring forward
	mono := t0
	at := func(d time.Duration) (time.Time, time.Time) { return wall.Add(d), mono.Add(d) }
	b := NewQuota(2, runcuetype.PerDay, ny, wall, mono)
	assert.True(t, b.EndMono().Equal(mono.Add(time.Hour)))

	b.Reserve()
	b.Commit(at(time.Minute))
	_, _, ok := b.Exhaustion(mono)
	assert.False(t, ok)
	b.Reserve() // decided at 23:30, started after midnight: counted on the 8th
	assert.False(t, b.Allow(mono.Add(30*time.Minute)))
	s, e, ok := b.Exhaustion(mono.Add(30 * time.Minute))
	require.True(t, ok)
	assert.True(t, s.Equal(time.Date(2026, 3, 7, 0, 0, 0, 0, ny)))
	assert.True(t, e.Equal(time.Date(2026, 3, 8, 0, 0, 0, 0, ny)))
	_, _, ok = b.Exhaustion(mono.Add(31 * time.Minute))
	assert.False(t, ok, "once per period")

	b.Commit(at(61 * time.Minute))
	b.Sync(at(61 * time.Minute)) // the present, as every decision syncs first
	assert.True(t, b.PeriodStart().Equal(time.Date(2026, 3, 8, 0, 0, 0, 0, ny)))
	assert.Equal(t, 1, b.Used(mono.Add(61*time.Minute)), "the late start counts in the new day")
	assert.True(t, b.Allow(mono.Add(61*time.Minute)))
	b.Reserve()
	b.Commit(at(2 * time.Hour))
	assert.False(t, b.Allow(mono.Add(2*time.Hour)))
	_, _, ok = b.Exhaustion(mono.Add(2 * time.Hour))
	assert.True(t, ok, "a new period reports again")

	// The 8th has 23 hours: it ends at 00:00 EDT on the 9th, 24 hours
	// after the 7th's end on the monotonic clock minus the hour skipped.
	assert.True(t, b.EndMono().Equal(mono.Add(time.Hour+23*time.Hour)))
	w, m := at(time.Hour + 23*time.Hour)
	assert.True(t, b.Allow(m), "the timeline reaches the end: no longer refused")
	b.Sync(w, m)
	assert.True(t, b.PeriodStart().Equal(time.Date(2026, 3, 9, 0, 0, 0, 0, ny)))
	assert.Zero(t, b.Used(m))
}

// The wall clock decides: set forward past midnight, the period turns over
// at once; set back into the previous day, the period is not reopened and
// its end moves out on the timeline.
func TestBudgetFollowsWallClockSteps(t *testing.T) {
	ny := testutil.Zone(t, "America/New_York")
	wall := time.Date(2026, 6, 10, 12, 0, 0, 0, ny)
	b := NewQuota(1, runcuetype.PerDay, ny, wall, t0)
	b.Reserve()
	b.Commit(wall, t0)
	assert.False(t, b.Allow(t0))

	// Set forward 13 hours while 1 minute passes.
	b.Sync(wall.Add(13*time.Hour), t0.Add(time.Minute))
	assert.True(t, b.Allow(t0.Add(time.Minute)))
	b.Reserve()
	b.Commit(wall.Add(13*time.Hour), t0.Add(time.Minute))
	assert.False(t, b.Allow(t0.Add(time.Minute)))

	// Set back to the 10th: still the 11th's budget, spent; its end is now
	// 23 hours away on the timeline.
	b.Sync(wall.Add(time.Hour), t0.Add(2*time.Minute))
	assert.True(t, b.PeriodStart().Equal(time.Date(2026, 6, 11, 0, 0, 0, 0, ny)))
	assert.False(t, b.Allow(t0.Add(2*time.Minute)))
	assert.True(t, b.EndMono().Equal(t0.Add(2*time.Minute+35*time.Hour)))
	// A start dated in the past period is not counted again.
	b.Reserve()
	b.Commit(wall.Add(time.Hour), t0.Add(2*time.Minute))
	assert.Equal(t, 1, b.Used(t0.Add(2*time.Minute)))
}

// A spent budget refuses a resource until its period's end, before any
// other refusal but a pause, and keeps a keyed instance alive.
func TestResourceBudget(t *testing.T) {
	ny := testutil.Zone(t, "America/New_York")
	wall := time.Date(2026, 6, 10, 12, 0, 0, 0, ny)
	r := &Resource{}
	r.SetLimits(Limits{Rate: 10, Window: time.Second})
	r.Budgets = []*Quota{NewQuota(1, runcuetype.PerDay, ny, wall, t0), NewQuota(100, runcuetype.PerMonth, ny, wall, t0)}
	ok, _, _ := r.Admit(t0, nil)
	require.True(t, ok)
	r.Take(t0, false, nil)
	rf, refused := r.Refusal(t0, nil)
	require.True(t, refused)
	assert.Equal(t, Refusal{Kind: RefuseBudget, Until: t0.Add(12 * time.Hour)}, rf)
	r.Return(nil)
	r.Window.Commit(t0)
	for _, b := range r.Budgets {
		b.Commit(wall, t0)
	}
	quiet, recheck := r.Quiet(t0.Add(time.Hour))
	assert.False(t, quiet)
	assert.True(t, recheck.Equal(t0.Add((20*24+12)*time.Hour)), "until the month's end: %v", recheck.Sub(t0))
	r.Paused = true
	rf, _ = r.Refusal(t0, nil)
	assert.Equal(t, RefusePaused, rf.Kind)
}

// A start committed in the next period before the present reaches it (its
// latest bound, reported early) counts there, and the current period's
// starts go on counting.
func TestBudgetFutureStart(t *testing.T) {
	utc := time.UTC
	midnight := time.Date(2026, 6, 11, 0, 0, 0, 0, utc)
	wall := midnight.Add(-time.Second)
	b := NewQuota(3, runcuetype.PerDay, utc, wall, t0)
	mono := func(w time.Time) time.Time { return t0.Add(w.Sub(wall)) }
	for range 2 {
		b.Reserve()
		b.Commit(wall, mono(wall))
	}
	b.Reserve()
	bound := midnight.Add(500 * time.Millisecond)
	b.Commit(bound, mono(bound))
	now := midnight.Add(-900 * time.Millisecond)
	b.Sync(now, mono(now))
	assert.True(t, b.PeriodStart().Equal(midnight.Add(-24*time.Hour)), "still the 10th")
	assert.Equal(t, 2, b.Used(mono(now)), "the 10th's two starts still count")
	b.Reserve()
	assert.False(t, b.Allow(mono(now)), "a third place on the 10th is taken")
	b.Release(1)
	b.Sync(midnight, mono(midnight))
	assert.Equal(t, 1, b.Used(mono(midnight)), "the start bounded on the 11th counts there")
}

// A start within Margin of a period's end counts in that period and in the
// next; one earlier counts only in its own.
func TestBudgetMargin(t *testing.T) {
	utc := time.UTC
	midnight := time.Date(2026, 6, 11, 0, 0, 0, 0, utc)
	wall := midnight.Add(-time.Hour)
	b := NewQuota(2, runcuetype.PerDay, utc, wall, t0)
	b.Margin = 10 * time.Millisecond
	mono := func(w time.Time) time.Time { return t0.Add(w.Sub(wall)) }
	early := midnight.Add(-20 * time.Millisecond)
	b.Reserve()
	b.Commit(early, mono(early))
	late := midnight.Add(-5 * time.Millisecond)
	b.Reserve()
	b.Commit(late, mono(late))
	assert.Equal(t, 2, b.Used(mono(late)), "both count on the 10th")
	assert.Equal(t, 1, b.Used(mono(midnight)), "the one within the margin counts on the 11th too")
	b.Sync(midnight, mono(midnight))
	assert.True(t, b.PeriodStart().Equal(midnight))
	assert.Equal(t, 1, b.Used(mono(midnight)))
	// A start dated before the period whose margin reaches it counts.
	b.Reserve()
	b.Commit(midnight.Add(-time.Millisecond), mono(midnight))
	assert.Equal(t, 2, b.Used(mono(midnight)))
	assert.False(t, b.Allow(mono(midnight)))
	// Days later the carry is gone.
	later := midnight.Add(48 * time.Hour)
	b.Sync(later, mono(later))
	assert.Zero(t, b.Used(mono(later)))
}
