//go:build unix

package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// Limits as the service sees them: a request reaches the service some time
// after its handler starts, and the service counts it then. These tests
// journal every handler start in the child processes that own the
// database, kill the owners with SIGKILL, and check the limits at arrival:
// the journalled start plus a delay of 0-5 ms drawn from a logged seed.

func init() {
	childModes["wire"] = childMode{config: shiftedConfig, run: wireChild}
	childModes["changes"] = childMode{config: shiftedConfig, run: changesChild}
}

// shiftedClock is the real clock with its wall reading moved by off: the
// children of one test share the offset (RUNCUE_CLOCK_OFFSET, ns), so the
// test decides where midnight falls.
type shiftedClock struct{ off time.Duration }

func (c shiftedClock) Now() time.Time                       { return time.Now().Add(c.off) }
func (c shiftedClock) Monotonic() time.Duration             { return clock.Real().Monotonic() }
func (c shiftedClock) NewTimer(d time.Duration) clock.Timer { return clock.Real().NewTimer(d) }

func shiftedConfig(cfg *runcue.Config) {
	off, _ := strconv.ParseInt(os.Getenv("RUNCUE_CLOCK_OFFSET"), 10, 64)
	cfg.Clock = shiftedClock{time.Duration(off)}
	cfg.DrainOnSpentBudget = true
	cfg.PollInterval = 20 * time.Millisecond
}

// journal appends lines to RUNCUE_JOURNAL, one write each.
type journal struct {
	mu sync.Mutex
	f  *os.File
}

func openJournal() *journal {
	f, err := os.OpenFile(os.Getenv("RUNCUE_JOURNAL"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	must(err)
	return &journal{f: f}
}

func (j *journal) line(format string, args ...any) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, err := fmt.Fprintf(j.f, format+"\n", args...)
	return err
}

// wireChild owns the database and runs "fetch" units on keyed instances
// host:<target> (4 per second each) and "ask" units on llm (60 per 10 s,
// 70 a day), journalling "<service> <start ns> <id> <attempt>" before
// each request is "sent", until drained.
func wireChild(c *runcue.Cue) int {
	j := openJournal()
	pause := func() { time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond) }
	registerWireServices(c)
	must(c.Task("fetch", runcue.Task{ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if err := j.line("host:%s %d %s %d", w.Target, w.Started.UnixNano(), w.ID, w.Attempt); err != nil {
				return nil, err
			}
			pause()
			return nil, nil
		}}))
	must(c.Task("ask", runcue.Task{Services: []string{"llm"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		if err := j.line("llm %d %s %d", w.Started.UnixNano(), w.ID, w.Attempt); err != nil {
			return nil, err
		}
		pause()
		return nil, nil
	}}))
	return runToDrain(c)
}

// registerWireServices registers the services of the wire test on c.
func registerWireServices(c *runcue.Cue) {
	must(c.Service("host", runcue.Service{RateLimit: 4, RateWindow: time.Second}))
	must(c.Service("llm", runcue.Service{RateLimit: 60, RateWindow: 10 * time.Second,
		Budgets: []runcue.Budget{{Requests: 70, Per: runcue.PerDay}}}))
}

// registerChangesServices registers the services of the run-time changes
// test on c, as they are before the test changes them.
func registerChangesServices(c *runcue.Cue) {
	for _, name := range []string{"api", "spend", "capped", "flaky", "host"} {
		must(c.Service(name, runcue.Service{}))
	}
	must(c.Service("reg", runcue.Service{RateLimit: 3, RateWindow: time.Second}))
}

// runToDrain starts c, says "ready", drains it and says "drained".
func runToDrain(c *runcue.Cue) int {
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "start:", err)
		return 2
	}
	fmt.Println("ready")
	if err := c.Drain(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "drain:", err)
		return 2
	}
	must(c.Close())
	fmt.Println("drained")
	return 0
}

// started is a handler start read from a journal.
type started struct {
	service string
	id      string
	attempt int
	at      time.Time
	life    int
}

// serverWindows checks what a service counting arrivals in its own sliding
// window (t-window, t] sees: never more than limit.
func serverWindows(t *testing.T, name string, arrivals []time.Time, limit int, window time.Duration) int {
	t.Helper()
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range arrivals {
		for !arrivals[j].After(arrivals[i].Add(-window)) {
			j++
		}
		if n := i - j + 1; n > limit {
			t.Errorf("%s: the service counted %d arrivals in %v ending at %v (limit %d)", name, n, window,
				arrivals[i].Format("15:04:05.000000"), limit)
			return n
		} else {
			most = max(most, n)
		}
	}
	return most
}

// killLoop runs lives of a child in mode (numbered from life, in
// RUNCUE_LIFE) until kills have happened, each killed with SIGKILL a
// random time (in [lo, hi)) after it is ready; it returns the wall
// instants of the kills on the shifted clock.
func killLoop(t *testing.T, rnd *rand.Rand, mode, db string, life, kills int, lo, hi time.Duration, off time.Duration, env ...string) []time.Time {
	t.Helper()
	var at []time.Time
	for k := range kills {
		cmd, out := child(t, mode, db, append(env, fmt.Sprint("RUNCUE_LIFE=", life+k))...)
		for out.Scan() && out.Text() != "ready" {
		}
		time.Sleep(lo + time.Duration(rnd.Int64N(int64(hi-lo))))
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		at = append(at, time.Now().Add(off))
		for out.Scan() {
			if out.Text() == "drained" {
				t.Fatalf("the work ended before kill %d; the test needs more of it", k+1)
			}
		}
	}
	return at
}

// readStarts reads the lines of a journal that begin with "start" (the
// changes child) or a service name (the wire child).
func readJournal(t *testing.T, path string) [][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		out = append(out, strings.Fields(line))
	}
	return out
}

// storedEvents reads every event of st's log, in order.
func storedEvents(t *testing.T, st *sqlite.Store) []store.Event {
	t.Helper()
	var all []store.Event
	for after := int64(0); ; {
		evs, err := st.EventsAfter(context.Background(), after, 5000)
		require.NoError(t, err)
		if len(evs) == 0 {
			return all
		}
		all = append(all, evs...)
		after = evs[len(evs)-1].Seq
	}
}

// completedOnce checks that each of ids completed exactly once in the
// store (one work_completed event, one completed attempt), and returns how
// many completed.
func completedOnce(t *testing.T, st *sqlite.Store, ids []string) int {
	t.Helper()
	ctx := context.Background()
	events := map[string]int{}
	for _, ev := range storedEvents(t, st) {
		if ev.Type == string(runcue.EventWorkCompleted) {
			events[ev.WorkID]++
		}
	}
	done := 0
	for _, id := range ids {
		u, err := st.GetUnit(ctx, id)
		require.NoError(t, err)
		attempts := 0
		for _, a := range u.Attempts {
			if a.Outcome == "completed" {
				attempts++
			}
		}
		if u.State == store.Completed {
			done++
			require.Equal(t, 1, events[id], "one completion event for %s", id)
			require.Equal(t, 1, attempts, "one completed attempt of %s", id)
		} else {
			require.Zero(t, events[id], "%s is %s", id, u.State)
		}
	}
	return done
}

// TestLimitsAtArrivalAcrossKills: keyed hosts at 4 per second each and an
// LLM at 60 per 10 s and 70 a day, a backlog for each, the default margin,
// the day ending mid-run (on the children's clock), and the owner killed
// with SIGKILL six times: at arrival (journalled start plus 0-5 ms), no
// service ever counts more than its limit in its own window or day.
func TestLimitsAtArrivalAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	// Waits on rate windows mostly (a quarter of a core): it runs beside
	// the suite's other kill tests.
	t.Parallel()
	seed := testSeed(t, "RUNCUE_WIRE_SEED")
	rnd := rand.New(rand.NewPCG(seed, seed^7))
	dir := t.TempDir()
	db, jpath := filepath.Join(dir, "runcue.db"), filepath.Join(dir, "journal")
	// The children's wall clock reaches midnight about 12 s into the run.
	midnight := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	off := midnight.Sub(time.Now().Add(12 * time.Second))
	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger, Clock: shiftedClock{off}})
	require.NoError(t, err)
	registerWireServices(c)
	require.NoError(t, c.Task("fetch", runcue.Task{Handler: noop}))
	require.NoError(t, c.Task("ask", runcue.Task{Services: []string{"llm"}, Handler: noop}))
	var subs []runcue.Submission
	for i := range 240 {
		subs = append(subs, runcue.Submission{Task: "fetch", Target: fmt.Sprintf("h%d", i%3)})
	}
	for range 150 {
		subs = append(subs, runcue.Submission{Task: "ask"})
	}
	rnd.Shuffle(len(subs), func(i, j int) { subs[i], subs[j] = subs[j], subs[i] })
	res, err := c.SubmitBatch(context.Background(), subs)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	env := []string{"RUNCUE_JOURNAL=" + jpath, fmt.Sprint("RUNCUE_CLOCK_OFFSET=", int64(off))}
	kills := killLoop(t, rnd, "wire", db, 0, 6, 1500*time.Millisecond, 3500*time.Millisecond, off, env...)
	runToEnd(t, "wire", db, 3*time.Minute, env...)

	byService := map[string][]time.Time{}
	days := map[string]int{}
	for _, f := range readJournal(t, jpath) {
		if len(f) != 4 {
			continue // cut by a kill: the request was not sent
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		require.NoError(t, err)
		attempt, err := strconv.Atoi(f[3])
		require.NoError(t, err)
		at := arrival(seed, f[2], attempt, time.Unix(0, ns))
		byService[f[0]] = append(byService[f[0]], at)
		if f[0] == "llm" {
			days[at.UTC().Format(time.DateOnly)]++
		}
	}
	for _, h := range []string{"host:h0", "host:h1", "host:h2"} {
		most := serverWindows(t, h, byService[h], 4, time.Second)
		t.Logf("%s: %d requests, at most %d in a second at arrival", h, len(byService[h]), most)
	}
	most := serverWindows(t, "llm", byService["llm"], 60, 10*time.Second)
	t.Logf("llm: %d requests, at most %d in 10 s at arrival; per day %v; kills at %v", len(byService["llm"]), most, days, kills)
	for day, n := range days {
		assert.LessOrEqual(t, n, 70, "llm requests arriving on %s", day)
	}
	require.Len(t, days, 2, "the day ended mid-run")

	st, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	var fetches, asks []string
	for i, r := range res {
		if subs[i].Task == "fetch" {
			fetches = append(fetches, r.ID)
		} else {
			asks = append(asks, r.ID)
		}
	}
	assert.Equal(t, len(fetches), completedOnce(t, st, fetches), "every fetch completed")
	t.Logf("%d of %d asks completed within the two days' budgets", completedOnce(t, st, asks), len(asks))
}

// changesChild owns the database and runs one task per service of the
// run-time changes test, journalling "start <service> <id> <attempt> <ns>
// <life>" and "end ..." around each request. It says "applied" once its
// own status shows the changes the test makes first, and "reset" once reg
// is back to its registered limits after that.
func changesChild(c *runcue.Cue) int {
	j := openJournal()
	life := os.Getenv("RUNCUE_LIFE")
	clk := shiftedClock{}
	off, _ := strconv.ParseInt(os.Getenv("RUNCUE_CLOCK_OFFSET"), 10, 64)
	clk.off = time.Duration(off)
	task := func(name string, fail bool, hold time.Duration) runcue.Task {
		t := runcue.Task{Services: []string{name}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
			Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
				svc := name
				if name == "host" {
					svc = "host:" + w.Target
				}
				if err := j.line("start %s %s %d %d %s", svc, w.ID, w.Attempt, w.Started.UnixNano(), life); err != nil {
					return nil, err
				}
				if hold > 0 {
					time.Sleep(hold/2 + time.Duration(rand.Int64N(int64(hold))))
				}
				_ = j.line("end %s %s %d %d %s", svc, w.ID, w.Attempt, clk.Now().UnixNano(), life)
				if fail {
					return nil, errors.New("503 service unavailable")
				}
				return nil, nil
			}}
		if name == "host" {
			t.Services = nil
			t.ServiceKeys = func(w *runcue.Work) []string { return []string{"host:" + w.Target} }
		}
		return t
	}
	registerChangesServices(c)
	must(c.Task("api", task("api", false, 0)))
	must(c.Task("spend", task("spend", false, 0)))
	must(c.Task("capped", task("capped", false, 60*time.Millisecond)))
	must(c.Task("flaky", task("flaky", true, 0)))
	must(c.Task("reg", task("reg", false, 0)))
	must(c.Task("host", task("host", false, 0)))
	ctx := context.Background()
	must(c.Start(ctx))
	fmt.Println("ready")
	status := func(name string) runcue.ServiceStatus {
		st, err := c.ServiceStatus(ctx, name)
		must(err)
		return st
	}
	applied := func() bool {
		return status("api").Limits.RateLimit == 5 && len(status("spend").Limits.Budgets) == 1 &&
			status("capped").Limits.MaxConcurrent == 2 && status("flaky").Limits.CircuitThreshold == 2 &&
			status("reg").Overridden && status("host:a").Limits.RateLimit == 2
	}
	for !applied() {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("applied")
	for status("reg").Overridden {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("reset")
	select {} // until killed
}

// TestRunTimeChangesSurviveKills: limits changed at run time by another
// process, on services whose lanes already exist, hold across SIGKILLs of
// the owner as configured ones do: a rate window and a keyed instance's
// window (at arrival), a budget (no more starts than it allows, and one
// budget_exhausted event), a concurrency cap (in the journal of starts and
// ends), a circuit (restored open by the new owners), and a registered
// window that ResetService brings back (logged again).
func TestRunTimeChangesSurviveKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	seed := testSeed(t, "RUNCUE_WIRE_SEED")
	rnd := rand.New(rand.NewPCG(seed, seed^11))
	dir := t.TempDir()
	db, jpath := filepath.Join(dir, "runcue.db"), filepath.Join(dir, "journal")
	// Noon on the children's clock: the test stays within one day.
	off := time.Until(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger, Clock: shiftedClock{off}, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	defer c.Close()
	registerChangesServices(c)
	for _, name := range []string{"api", "spend", "capped", "flaky", "reg", "host"} {
		require.NoError(t, c.Task(name, runcue.Task{Handler: noop}))
	}
	submit := func(task string, n int, target string) []string {
		subs := make([]runcue.Submission, n)
		for i := range subs {
			subs[i] = runcue.Submission{Task: task, Target: target}
		}
		res, err := c.SubmitBatch(ctx, subs)
		require.NoError(t, err)
		ids := make([]string, n)
		for i, r := range res {
			ids[i] = r.ID
		}
		return ids
	}
	waitAll := func(ids []string) {
		for _, id := range ids {
			_, err := c.Wait(ctx, id)
			require.NoError(t, err)
		}
	}
	env := []string{"RUNCUE_JOURNAL=" + jpath, fmt.Sprint("RUNCUE_CLOCK_OFFSET=", int64(off))}

	// The first owner makes every lane before the limits change.
	first, out := child(t, "changes", db, append(env, "RUNCUE_LIFE=0")...)
	for out.Scan() && out.Text() != "ready" {
	}
	warm := slices.Concat(submit("api", 1, ""), submit("spend", 1, ""), submit("capped", 1, ""), submit("flaky", 1, ""),
		submit("host", 1, "a"))
	waitAll(warm)
	require.NoError(t, c.SetService(ctx, "api", runcue.Service{RateLimit: 5, RateWindow: time.Second}))
	require.NoError(t, c.SetService(ctx, "spend", runcue.Service{Budgets: []runcue.Budget{{Requests: 10, Per: runcue.PerDay}}}))
	require.NoError(t, c.SetService(ctx, "capped", runcue.Service{MaxConcurrent: 2}))
	require.NoError(t, c.SetService(ctx, "flaky", runcue.Service{MaxConcurrent: 1, CircuitThreshold: 2, CircuitTimeout: time.Hour}))
	require.NoError(t, c.SetService(ctx, "host:a", runcue.Service{RateLimit: 2, RateWindow: time.Second}))
	require.NoError(t, c.SetService(ctx, "reg", runcue.Service{MaxConcurrent: 10})) // no window
	for out.Scan() && out.Text() != "applied" {
	}
	waitAll(submit("reg", 1, "")) // reg's lane, made while it has no window
	require.NoError(t, c.ResetService(ctx, "reg"))
	for out.Scan() && out.Text() != "reset" {
	}
	changed := time.Now().Add(off)

	api, capped := submit("api", 40, ""), submit("capped", 40, "")
	submit("spend", 25, "")
	submit("flaky", 3, "")
	reg, hosts := submit("reg", 24, ""), submit("host", 16, "a")
	// Killed 1.5 s after the change, then three more times.
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	kills := []time.Time{time.Now().Add(off)}
	kills = append(kills, killLoop(t, rnd, "changes", db, 1, 3, 700*time.Millisecond, 2000*time.Millisecond, off, env...)...)
	last, out := child(t, "changes", db, append(env, fmt.Sprint("RUNCUE_LIFE=", len(kills)))...)
	for out.Scan() && out.Text() != "ready" {
	}
	waitAll(slices.Concat(api, capped, reg, hosts))
	// Spend: ten complete, the rest wait for tomorrow; flaky: two fail and
	// open the circuit, the third waits for it.
	for {
		spent, err := c.List(ctx, runcue.ListOptions{Tasks: []string{"spend"}, States: []runcue.State{runcue.StateCompleted}})
		require.NoError(t, err)
		failed, err := c.List(ctx, runcue.ListOptions{Tasks: []string{"flaky"}, States: []runcue.State{runcue.StateFailed}})
		require.NoError(t, err)
		if len(spent.Units) >= 11 && len(failed.Units) >= 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("spend: %d completed; flaky: %d failed", len(spent.Units), len(failed.Units))
		case <-time.After(50 * time.Millisecond):
		}
	}
	time.Sleep(300 * time.Millisecond) // time for a run the limits should not allow
	require.NoError(t, last.Process.Signal(syscall.SIGKILL))
	_ = last.Wait()
	kills = append(kills, time.Now().Add(off))

	var starts []started
	ends := map[string]time.Time{}
	for _, f := range readJournal(t, jpath) {
		if len(f) != 6 {
			continue // cut by a kill
		}
		attempt, _ := strconv.Atoi(f[3])
		ns, _ := strconv.ParseInt(f[4], 10, 64)
		life, _ := strconv.Atoi(f[5])
		if f[0] == "start" {
			starts = append(starts, started{service: f[1], id: f[2], attempt: attempt, at: time.Unix(0, ns), life: life})
		} else {
			ends[f[2]+"#"+f[3]] = time.Unix(0, ns)
		}
	}
	after := func(svc string) []started {
		var out []started
		for _, s := range starts {
			if s.service == svc && !s.at.Before(changed) {
				out = append(out, s)
			}
		}
		return out
	}
	arrivals := func(ss []started) []time.Time {
		var out []time.Time
		for _, s := range ss {
			out = append(out, arrival(seed, s.id, s.attempt, s.at))
		}
		return out
	}
	for _, w := range []struct {
		svc   string
		limit int
	}{{"api", 5}, {"reg", 3}, {"host:a", 2}} {
		ss := after(w.svc)
		most := serverWindows(t, w.svc, arrivals(ss), w.limit, time.Second)
		t.Logf("%s: %d requests after the change, at most %d in a second at arrival", w.svc, len(ss), most)
	}
	assert.Equal(t, 10, len(after("spend")), "the budget added at run time allows 10 starts today, across owners")
	// The cap: at each start, the runs of capped in progress (an end
	// journalled, or the kill of its owner) are at most 2.
	capRuns := after("capped")
	most := 0
	for _, s := range capRuns {
		n := 0
		for _, o := range capRuns {
			end, ok := ends[o.id+"#"+strconv.Itoa(o.attempt)]
			if !ok {
				end = kills[o.life]
			}
			if !o.at.After(s.at) && end.After(s.at) {
				n++
			}
		}
		most = max(most, n)
	}
	assert.LessOrEqual(t, most, 2, "runs of capped in progress at once")
	t.Logf("capped: %d runs, at most %d at once; kills at %v", len(capRuns), most, kills)
	// Two flaky units failed and opened the circuit; the third never ran
	// (a kill may make a unit's run happen twice: count units, not runs).
	ran := map[string]bool{}
	for _, s := range after("flaky") {
		ran[s.id] = true
	}
	assert.Len(t, ran, 2, "the circuit opened after two failures, and the new owners kept it open")
	st, err := c.ServiceStatus(ctx, "flaky")
	require.NoError(t, err)
	assert.Equal(t, runcue.CircuitOpen, st.Circuit)

	exhausted := 0
	st2, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st2.Close()
	for seq := int64(0); ; {
		evs, err := st2.EventsAfter(ctx, seq, 5000)
		require.NoError(t, err)
		if len(evs) == 0 {
			break
		}
		for _, ev := range evs {
			if ev.Type == string(runcue.EventBudgetExhausted) {
				exhausted++
			}
		}
		seq = evs[len(evs)-1].Seq
	}
	assert.Equal(t, 1, exhausted, "one budget_exhausted event for the period")
}
