//go:build unix

package runcue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/sqlite"
)

func init() {
	childModes["recurring"] = childMode{run: recurringChild}
}

// recurPolicies are the schedules of the kill test: one a second each,
// one per policy for the periods missed while no owner runs.
var recurPolicies = map[string]runcue.Schedule{
	"latest": {Missed: runcue.MissedLatest},
	"skip":   {Missed: runcue.MissedSkip},
	"each":   {Missed: runcue.MissedEach, MaxMissed: 3},
}

func registerRecurring(c *runcue.Cue, handler runcue.Handler) {
	must(c.Task("tick", runcue.Task{Handler: handler}))
	for name, s := range recurPolicies {
		s.Submission = runcue.Submission{Task: "tick"}
		s.Timing = runcue.Timing{Every: time.Second}
		must(c.Schedule(context.Background(), name, s))
	}
}

// recurringChild registers the schedules (as a program does at every
// start), owns the database and journals "<schedule> <period> <unit>
// <attempt>" at each handler's start, until killed, or for RUNCUE_LIFE_MS
// and then stops.
func recurringChild(c *runcue.Cue) int {
	j := openJournal()
	registerRecurring(c, func(ctx context.Context, w *runcue.Work) (any, error) {
		wi, err := c.Get(ctx, w.ID)
		if err != nil {
			return nil, err
		}
		return nil, j.line("%s %s %s %d", wi.Schedule, wi.Period, w.ID, w.Attempt)
	})
	ctx := context.Background()
	must(c.Start(ctx))
	fmt.Println("ready")
	if ms, err := strconv.Atoi(os.Getenv("RUNCUE_LIFE_MS")); err == nil {
		time.Sleep(time.Duration(ms) * time.Millisecond)
		must(c.Stop(ctx))
		must(c.Close())
		return 0
	}
	select {}
}

// TestSchedulesAcrossKills: three schedules of one period a second, for a
// minute, on an owner SIGKILLed every 3-7 s and replaced after 2-5 s
// without one (SQLite). Counted at the handler and in the events: no
// period has two units; every period is handled once, submitted or
// skipped; the periods due while an owner ran are submitted, and every
// unit submitted runs; the periods due while none ran are missed and
// handled as each schedule's policy says (latest: the last of each run
// of missed periods; skip: none; each: the last three).
func TestSchedulesAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes for a minute")
	}
	t.Parallel()
	seed := testSeed(t, "RUNCUE_RECUR_SEED")
	rnd := rand.New(rand.NewPCG(seed, seed^3))
	dir := t.TempDir()
	db, jpath := filepath.Join(dir, "runcue.db"), filepath.Join(dir, "journal")
	env := []string{"RUNCUE_JOURNAL=" + jpath}
	type life struct{ ready, end time.Time }
	var lives []life
	began := time.Now()
	for time.Since(began) < time.Minute {
		cmd, out := child(t, "recurring", db, env...)
		for out.Scan() && out.Text() != "ready" {
		}
		ready := time.Now()
		time.Sleep(3*time.Second + time.Duration(rnd.Int64N(int64(4*time.Second))))
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		lives = append(lives, life{ready, time.Now()})
		t.Logf("owner %d: ready at %v, killed at %v", len(lives), ready.Sub(began).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
		time.Sleep(2*time.Second + time.Duration(rnd.Int64N(int64(3*time.Second))))
	}
	// A last owner runs what is queued and stops.
	cmd, out := child(t, "recurring", db, append(env, "RUNCUE_LIFE_MS=3000")...)
	for out.Scan() && out.Text() != "ready" {
	}
	ready := time.Now()
	require.NoError(t, cmd.Wait())
	lives = append(lives, life{ready, time.Now()})
	t.Logf("%d owners, %d killed", len(lives), len(lives)-1)

	// What ran, by the journal: schedule -> period -> units.
	ran := map[string]map[string]map[string]bool{}
	for _, f := range readJournal(t, jpath) {
		if len(f) != 4 {
			continue // cut by a kill
		}
		if ran[f[0]] == nil {
			ran[f[0]] = map[string]map[string]bool{}
		}
		if ran[f[0]][f[1]] == nil {
			ran[f[0]][f[1]] = map[string]bool{}
		}
		ran[f[0]][f[1]][f[2]] = true
	}
	st, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()

	// What was recorded, by the events: schedule -> period -> record.
	type record struct {
		unit   string // "" when skipped
		missed bool
	}
	recs := map[string]map[string]record{}
	var first time.Time
	lastSeq, err := st.LastSeq(ctx)
	require.NoError(t, err)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	sub, stop, err := c.Subscribe(sctx, runcue.SubscribeOptions{After: 0})
	require.NoError(t, err)
	defer stop()
	for ev := range sub {
		if ev.Type == runcue.EventScheduleSubmitted || ev.Type == runcue.EventScheduleSkipped {
			m := recs[ev.Schedule]
			if m == nil {
				m = map[string]record{}
				recs[ev.Schedule] = m
			}
			add := func(period string, r record) {
				_, dup := m[period]
				require.False(t, dup, "%s's period %s recorded twice", ev.Schedule, period)
				m[period] = r
				if p := periodTime(t, period); first.IsZero() || p.Before(first) {
					first = p
				}
			}
			if ev.Type == runcue.EventScheduleSkipped { // Skipped periods, FirstSkipped to Period
				require.Equal(t, ev.Period, periodTime(t, ev.FirstSkipped).Add(time.Duration(ev.Skipped-1)*time.Second).UTC().Format(time.RFC3339Nano))
				for k := range ev.Skipped {
					add(periodTime(t, ev.FirstSkipped).Add(time.Duration(k)*time.Second).UTC().Format(time.RFC3339Nano), record{missed: ev.Reason == "missed"})
				}
			} else {
				add(ev.Period, record{unit: ev.WorkID, missed: ev.Reason == "missed"})
			}
		}
		if ev.Seq >= lastSeq {
			break
		}
	}
	last := lives[len(lives)-1].end
	for name, s := range recurPolicies {
		m := recs[name]
		require.NotEmpty(t, m, name)
		missedRun := []time.Time{} // the current run of missed periods
		check := func() {
			if len(missedRun) == 0 {
				return
			}
			var submitted []time.Time
			for _, p := range missedRun {
				if m[p.UTC().Format(time.RFC3339Nano)].unit != "" {
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
			key := p.UTC().Format(time.RFC3339Nano)
			r, ok := m[key]
			if !ok {
				// Not recorded: due after the last owner stopped, or
				// before the schedule was first registered.
				assert.True(t, p.After(last.Add(-2*time.Second)) || p.Before(lives[0].ready), "%s's period %v was never handled", name, p)
				continue
			}
			for u := range ran[name][key] {
				assert.Equal(t, r.unit, u, "%s's period %s ran as a unit it did not submit", name, key)
			}
			alive, dead := false, false
			for i, l := range lives {
				alive = alive || (p.After(l.ready.Add(500*time.Millisecond)) && p.Before(l.end.Add(-500*time.Millisecond)))
				dead = dead || (i > 0 && p.After(lives[i-1].end.Add(200*time.Millisecond)) && p.Before(l.ready.Add(-time.Second)))
			}
			switch {
			case alive:
				assert.False(t, r.missed, "%s's period %s was due while an owner ran", name, key)
				assert.NotEmpty(t, r.unit, "%s's period %s was due while an owner ran", name, key)
			case dead:
				assert.True(t, r.missed, "%s's period %s was due while no owner ran", name, key)
			}
			if r.missed {
				missedRun = append(missedRun, p)
			} else {
				check()
			}
			if r.unit != "" {
				counts["submitted"]++
				if r.missed {
					counts["missed, submitted"]++
				}
				if len(ran[name][key]) == 0 {
					// Every unit submitted before the last owner's end ran.
					assert.True(t, p.After(last.Add(-2*time.Second)), "%s's period %s was submitted and never ran", name, key)
				}
			} else {
				counts["skipped"]++
			}
		}
		check()
		t.Logf("%s: %v", name, counts)
	}
}

// periodTime reads an Every schedule's period key.
func periodTime(t *testing.T, key string) time.Time {
	t.Helper()
	p, err := time.Parse(time.RFC3339Nano, key)
	require.NoError(t, err)
	return p
}
