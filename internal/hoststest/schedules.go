package hoststest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// The schedules' kill and failover tests, shared by both backends: three
// schedules of one period a second, one per policy for missed periods,
// run by owners that die; what ran and what was recorded is checked
// against when an owner ran.

// RecurPolicies are the test's schedules, by name (Submission and Timing
// set by RegisterRecurring).
var RecurPolicies = map[string]runcue.Schedule{
	"latest": {Missed: runcue.MissedLatest},
	"skip":   {Missed: runcue.MissedSkip},
	"each":   {Missed: runcue.MissedEach, MaxMissed: 3},
}

// RegisterRecurring registers task "tick" with handler, and the
// schedules, as a program does at every start.
func RegisterRecurring(c *runcue.Cue, handler runcue.Handler) error {
	if err := c.Task("tick", runcue.Task{Handler: handler}); err != nil {
		return err
	}
	for name, s := range RecurPolicies {
		s.Submission = runcue.Submission{Task: "tick"}
		s.Timing = runcue.Timing{Every: time.Second}
		if err := c.Schedule(context.Background(), name, s); err != nil {
			return err
		}
	}
	return nil
}

// RanLine is what a handler journals: its schedule, period and unit.
func RanLine(ctx context.Context, c *runcue.Cue, w *runcue.Work) (string, error) {
	wi, err := c.Get(ctx, w.ID)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("ran %s %s %s", wi.Schedule, wi.Period, w.ID), nil
}

// Ran reads journal lines (RanLine's) into schedule -> period -> units.
func Ran(lines []string) map[string]map[string]map[string]bool {
	ran := map[string]map[string]map[string]bool{}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "ran" {
			continue // cut by a kill, or another line
		}
		if ran[f[1]] == nil {
			ran[f[1]] = map[string]map[string]bool{}
		}
		if ran[f[1]][f[2]] == nil {
			ran[f[1]][f[2]] = map[string]bool{}
		}
		ran[f[1]][f[2]][f[3]] = true
	}
	return ran
}

// takeoverLag bounds how long after a takeover the new owner's schedules
// may first be read, on a loaded machine.
const takeoverLag = 2 * time.Second

// Reign is when an owner ran the schedules: from its takeover to its end.
type Reign struct{ From, To time.Time }

// TakenLine is what a child prints when its Cue takes ownership (its
// ownership_taken event, at its time); Takeovers reads them back.
func TakenLine(at time.Time) string { return "taken " + at.UTC().Format(time.RFC3339Nano) }

// Takeovers reads the instants of TakenLine's lines, in order.
func Takeovers(lines []string) []time.Time {
	var out []time.Time
	for _, line := range lines {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "taken" {
			if at, err := time.Parse(time.RFC3339Nano, f[1]); err == nil {
				out = append(out, at)
			}
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// CheckSchedules reads the schedule events through c and checks them,
// and what ran, against the reigns (in order; the last ended by a
// stop): no period has two units or two records; every period from the
// first reign on is handled, submitted or skipped; the periods due well
// inside a reign were submitted on time, and their units ran; those due
// well between two reigns are missed, and each run of missed periods is
// handled as its schedule's policy says.
//
// takeovers, if not nil, are every instant an owner took ownership, as the
// owners saw it (TakenLine), also those the test did not cause: a loaded
// owner may lose its lease and an owner take it again unseen by the test.
// A period due at most takeoverLag before a takeover that came before its
// handling may then be missed within a reign (the new owner's schedules
// run from their first read, which a loaded store delays); and a run of
// missed periods is split where a takeover came between two handlings.
// Without them, periods handled more than a second apart are taken for
// two handlings.
func CheckSchedules(t *testing.T, c *runcue.Cue, ran map[string]map[string]map[string]bool, reigns []Reign, takeovers []time.Time) {
	t.Helper()
	type record struct {
		unit   string // "" when skipped
		missed bool
		at     time.Time // the event's time (its owner's clock)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs := map[string]map[string]record{}
	period := func(key string) time.Time {
		p, err := time.Parse(time.RFC3339Nano, key)
		require.NoError(t, err)
		return p
	}
	key := func(p time.Time) string { return p.UTC().Format(time.RFC3339Nano) }
	takenBetween := func(from, to time.Time) bool { // an owner took over in (from, to]
		return slices.ContainsFunc(takeovers, func(at time.Time) bool { return at.After(from) && !at.After(to) })
	}
	var first time.Time
	sub, stop, err := c.Subscribe(ctx, runcue.SubscribeOptions{After: 0,
		Types: []runcue.EventType{runcue.EventScheduleSubmitted, runcue.EventScheduleSkipped, runcue.EventScheduleChanged}})
	require.NoError(t, err)
	defer stop()
	// A mark: the schedule_changed of a throwaway schedule, after every
	// event the owners wrote.
	require.NoError(t, c.Schedule(ctx, "zz-mark", runcue.Schedule{Submission: runcue.Submission{Task: "tick"}, Timing: runcue.Timing{Every: time.Hour}}))
	for ev := range sub {
		if ev.Type == runcue.EventScheduleChanged {
			if ev.Schedule == "zz-mark" {
				break
			}
			continue
		}
		m := recs[ev.Schedule]
		if m == nil {
			m = map[string]record{}
			recs[ev.Schedule] = m
		}
		add := func(k string, r record) {
			_, dup := m[k]
			require.False(t, dup, "%s's period %s recorded twice", ev.Schedule, k)
			m[k] = r
			if p := period(k); first.IsZero() || p.Before(first) {
				first = p
			}
		}
		if ev.Type == runcue.EventScheduleSkipped { // Skipped periods, FirstSkipped to Period
			require.Equal(t, ev.Period, key(period(ev.FirstSkipped).Add(time.Duration(ev.Skipped-1)*time.Second)))
			for k := range ev.Skipped {
				add(key(period(ev.FirstSkipped).Add(time.Duration(k)*time.Second)), record{missed: ev.Reason == "missed", at: ev.Time})
			}
		} else {
			add(ev.Period, record{unit: ev.WorkID, missed: ev.Reason == "missed", at: ev.Time})
		}
	}
	require.NoError(t, c.DeleteSchedule(ctx, "zz-mark"))
	last := reigns[len(reigns)-1].To
	for name, s := range RecurPolicies {
		m := recs[name]
		require.NotEmpty(t, m, name)
		var missedRun []time.Time // the current run of missed periods
		check := func() {
			if len(missedRun) == 0 {
				return
			}
			var submitted []time.Time
			for _, p := range missedRun {
				if m[key(p)].unit != "" {
					submitted = append(submitted, p)
				}
			}
			want := map[runcue.Missed]int{runcue.MissedLatest: 1, runcue.MissedSkip: 0, runcue.MissedEach: 3}[s.Missed]
			want = min(want, len(missedRun))
			if assert.Len(t, submitted, want, "%s: %d missed periods from %v", name, len(missedRun), missedRun[0]) && want > 0 {
				assert.Equal(t, missedRun[len(missedRun)-want:], submitted, "%s submits the latest", name)
			}
			missedRun = missedRun[:0]
		}
		counts := map[string]int{}
		for p := first; !p.After(last); p = p.Add(time.Second) {
			k := key(p)
			r, ok := m[k]
			if !ok {
				// Not handled: due as the last owner stopped.
				assert.True(t, p.After(last.Add(-2*time.Second)), "%s's period %v was never handled", name, p)
				continue
			}
			for u := range ran[name][k] {
				assert.Equal(t, r.unit, u, "%s's period %s ran as a unit it did not submit", name, k)
			}
			reigning, between := false, false
			for i, rg := range reigns {
				reigning = reigning || (p.After(rg.From.Add(500*time.Millisecond)) && p.Before(rg.To.Add(-500*time.Millisecond)))
				between = between || (i > 0 && p.After(reigns[i-1].To.Add(200*time.Millisecond)) && p.Before(rg.From.Add(-time.Second)))
			}
			if reigning && r.missed && takenBetween(p.Add(-takeoverLag), r.at) {
				t.Logf("%s: period %s missed within a reign: an owner took over at most %v before it was handled", name, k, takeoverLag)
				reigning = false
			}
			switch {
			case reigning:
				assert.False(t, r.missed, "%s's period %s was due while an owner ran", name, k)
				assert.NotEmpty(t, r.unit, "%s's period %s was due while an owner ran", name, k)
			case between:
				assert.True(t, r.missed, "%s's period %s was due while no owner ran", name, k)
			}
			if r.missed {
				// Two owners' handlings may meet in one run: an owner
				// that handled what it found missed and was gone within a
				// period (on a loaded machine, deposed unseen by the
				// test: its lease lost). With the owners' takeovers, a
				// takeover between two handlings splits the run; without
				// them, a gap of more than a second does (a new owner's
				// handling comes about a lease after the last one's).
				if n := len(missedRun); n > 0 && takeovers != nil && takenBetween(m[key(missedRun[n-1])].at, r.at) {
					t.Logf("%s: an owner took over between the handlings of the missed periods before %s and from it", name, k)
					check()
				} else if n > 0 && takeovers == nil && r.at.Sub(m[key(missedRun[n-1])].at) > time.Second {
					t.Logf("%s: the missed periods before %s and from it were handled %v apart: two handlings", name, k, r.at.Sub(m[key(missedRun[n-1])].at).Round(time.Millisecond))
					check()
				}
				missedRun = append(missedRun, p)
			} else {
				check()
			}
			switch {
			case r.unit == "":
				counts["skipped"]++
			case r.missed:
				counts["missed, submitted"]++
			default:
				counts["on time"]++
			}
			if r.unit != "" && len(ran[name][k]) == 0 {
				// Every unit submitted before the last owner's end ran.
				assert.True(t, p.After(last.Add(-2*time.Second)), "%s's period %s was submitted and never ran", name, k)
			}
		}
		check()
		t.Logf("%s: %v", name, counts)
	}
}
