package runcuetype

import (
	"testing"
	"time"

	"github.com/runcue/runcue/internal/testutil"

	"github.com/stretchr/testify/assert"
)

// A day is local midnight to local midnight, 23 or 25 hours across a
// daylight-saving change; a month runs from the 1st to the 1st.
func TestPeriodBounds(t *testing.T) {
	ny := testutil.Zone(t, "America/New_York")
	// Cuba moves its clocks at midnight: 2026-03-08 00:00 does not exist.
	havana := testutil.Zone(t, "America/Havana")
	for _, tc := range []struct {
		name       string
		p          Period
		loc        *time.Location
		at         time.Time
		start, end time.Time
		hours      float64
	}{
		{"ordinary day", PerDay, ny, time.Date(2026, 6, 10, 15, 0, 0, 0, ny),
			time.Date(2026, 6, 10, 0, 0, 0, 0, ny), time.Date(2026, 6, 11, 0, 0, 0, 0, ny), 24},
		{"spring forward", PerDay, ny, time.Date(2026, 3, 8, 12, 0, 0, 0, ny),
			time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny), 23},
		{"fall back", PerDay, ny, time.Date(2026, 11, 1, 1, 30, 0, 0, ny).Add(time.Hour), // the second 01:30
			time.Date(2026, 11, 1, 0, 0, 0, 0, ny), time.Date(2026, 11, 2, 0, 0, 0, 0, ny), 25},
		{"UTC midnight is not the zone's", PerDay, ny, time.Date(2026, 6, 11, 2, 0, 0, 0, time.UTC),
			time.Date(2026, 6, 10, 0, 0, 0, 0, ny), time.Date(2026, 6, 11, 0, 0, 0, 0, ny), 24},
		{"month over a year's end", PerMonth, ny, time.Date(2026, 12, 31, 23, 59, 0, 0, ny),
			time.Date(2026, 12, 1, 0, 0, 0, 0, ny), time.Date(2027, 1, 1, 0, 0, 0, 0, ny), 31 * 24},
		{"month with a change", PerMonth, ny, time.Date(2026, 3, 20, 0, 0, 0, 0, ny),
			time.Date(2026, 3, 1, 0, 0, 0, 0, ny), time.Date(2026, 4, 1, 0, 0, 0, 0, ny), 31*24 - 1},
		{"a skipped midnight", PerDay, havana, time.Date(2026, 3, 8, 12, 0, 0, 0, havana),
			time.Date(2026, 3, 8, 1, 0, 0, 0, havana), time.Date(2026, 3, 9, 0, 0, 0, 0, havana), 23},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, end := tc.p.Bounds(tc.loc, tc.at)
			assert.True(t, start.Equal(tc.start), "start %v, want %v", start, tc.start)
			assert.True(t, end.Equal(tc.end), "end %v, want %v", end, tc.end)
			assert.Equal(t, tc.hours, end.Sub(start).Hours())
			assert.False(t, tc.at.Before(start))
			assert.True(t, tc.at.Before(end))
		})
	}
}

// The budget turns over at local midnight by the wall clock, counts a
// start in the period its wall instant falls in, and reports exhaustion
// once per period.
