package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/hub"
	"github.com/runcue/runcue/internal/writer"
	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// The engine's scenario tests: each file of testdata/scenarios is a script
// of commands, each followed by "----" and what the engine did in answer:
// the handlers it started and the events it committed, one a line, sorted.
// The engine runs on a SQLite store and a fake clock; its handlers are the
// script's (a run stays running until "done" ends it). Run with -rewrite
// to write what the engine does now as the expected output (then read the
// diff: the script is the specification).
//
// Commands:
//
//	service NAME [max=N] [rate=N/DUR] [circuit=N/DUR] [margin=DUR] [budget=N/day]
//	        [meter=AMOUNT:N/DUR] [adaptive] [share=AMOUNT]
//	task NAME [services=A,B] [max=N] [attempts=N] [backoff=DUR] [timeout=DUR] [hold]
//	        [keys=CLASS]     (a unit's keyed service is CLASS:its target)
//	        [failonskip]     a skipped dependency fails the task's units
//	        [reports]        its runner reports starts (Run.Started), no start gate
//	        [manual]         its runner reports nothing until "report" and "done"
//	start [priority]           the engine takes ownership and recovers (priority:
//	                           a unit's target, a number from 0 to 10, is ten
//	                           times its score)
//	submit ID TASK [after=ID,...] [at=DUR] [target=T] [cost=AMOUNT:N] [deptimeout=DUR]
//	       [| ID TASK ...]     several units in one batch
//	submit-elsewhere ...       the same, committed by another process
//	tick DUR                   the clock moves on; the engine settles
//	done ID ok|fail|permanent|skip|overloaded|retry-after=DUR|panic [used=AMOUNT:N]
//	cancel ID [cascade]
//	pause service NAME | pause queue | pause task NAME (resume likewise)
//	explain ID                 the reasons it is not running
//	status NAME                a service's active, in-window and circuit
//	start [depcheck] [feed=N] [maxqueued=N] [loadahead=N] [startdelay=DUR]
//	                           depcheck: DependencySatisfied refuses what "unready ID"
//	                           names; feed: a Feed that submits N units of task a
//	unready ID | ready ID      DependencySatisfied's answer for dependency ID
//	override NAME max=N        a service's stored override
//	room TASK N                the room executors have for TASK (SetRoom)
//	observe ID AMOUNT:N/DUR    the run's service said it has N left, whole after DUR
//	report ID DUR              a manual run's start, at the engine's now plus DUR
//	inspect                    the dispatcher's counts
//	stats                      the services' statistics, the queue and backpressure
//	progress ID                the handler reports progress and a heartbeat
//	drain                      whether the engine holds no work (waits 50ms at most)
//	kill                       the engine dies (its runs stay running in the store)
//	stop                       the engine stops, its handlers cancelled
var rewrite = flag.Bool("rewrite", false, "write the scenarios' expected outputs from what the engine does")

func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/scenarios/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

// step is one command of a script with its expected output.
type step struct {
	line   int
	cmd    string
	expect []string
	// pre holds the comment and blank lines before the command.
	pre []string
}

func parseScenario(t *testing.T, path string) []step {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var steps []step
	var pre []string
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			pre = append(pre, line)
			continue
		}
		s := step{line: n, cmd: line, pre: pre}
		pre = nil
		if !sc.Scan() || sc.Text() != "----" {
			t.Fatalf("%s:%d: %q is not followed by ----", path, n, line)
		}
		n++
		for sc.Scan() {
			n++
			if sc.Text() == "" {
				break
			}
			s.expect = append(s.expect, sc.Text())
		}
		steps = append(steps, s)
	}
	return steps
}

func runScenario(t *testing.T, path string) {
	steps := parseScenario(t, path)
	w := newWorld(t)
	defer w.close()
	var out strings.Builder
	for _, s := range steps {
		got := w.do(s.cmd)
		if *rewrite {
			for _, p := range s.pre {
				out.WriteString(p + "\n")
			}
			out.WriteString(s.cmd + "\n----\n")
			for _, g := range got {
				out.WriteString(g + "\n")
			}
			out.WriteString("\n")
			continue
		}
		if !slices.Equal(got, s.expect) {
			t.Errorf("%s:%d: %s\nwant:\n\t%s\ngot:\n\t%s", path, s.line, s.cmd,
				strings.Join(s.expect, "\n\t"), strings.Join(got, "\n\t"))
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// world is an engine on a store and a fake clock, with a script's
// handlers.
type world struct {
	t     *testing.T
	ctx   context.Context
	clk   *clock.Fake
	st    *sqlite.Store
	w     *writer.Writer
	hub   *hub.Hub
	tel   *Telemetry
	count Counters
	e     *Engine
	own   store.Ownership
	reg   Registry

	// priority: units run by their targets read as numbers, highest first.
	priority bool
	// opts are the start command's options (depcheck, feed=N, maxqueued=N).
	opts map[string]string
	// unready are the dependencies DependencySatisfied refuses (depcheck).
	unready map[string]bool
	fed     int
	// invariant, when set, gets the invariants' violations (default: the
	// test fails); hooks and settings, when set, adjust the engine's hooks
	// and settings at each start.
	invariant func(error)
	hooks     func(*Hooks)
	settings  func(*Settings)

	mu   sync.Mutex
	log  []string
	runs map[string]*scriptRun
	// stopped are runs the engine asked to stop, whose ends are on their
	// way: settle waits for them. launching counts the runs launched that
	// have not yet started or ended: settle waits for them too.
	stopped   []*scriptRun
	launching int // under mu
}

func newWorld(t *testing.T) *world { return newWorldOn(t, nil) }

// newWorldOn is newWorld whose writer commits through wrap's store (the
// engine's reads go to the SQLite store itself).
func newWorldOn(t *testing.T, wrap func(store.Store) store.Store) *world {
	ctx := t.Context()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var commits store.Store = st
	if wrap != nil {
		commits = wrap(st)
	}
	clk := clock.NewFake(time.Date(2026, 1, 5, 9, 0, 0, 0, time.UTC))
	w := &world{t: t, ctx: ctx, clk: clk, st: st, runs: map[string]*scriptRun{},
		reg: Registry{Services: map[string]store.ServiceDef{}, Tasks: map[string]*TaskSpec{}}}
	w.hub = hub.New(st, 64, 0)
	w.w = writer.New(writer.Settings{Store: commits, Clock: clk, Poll: time.Hour,
		Hooks: writer.Hooks{Publish: func(evs []store.Event, external bool) {
			w.hub.Publish(evs)
			w.mu.Lock()
			for _, ev := range evs {
				if ev.Type == store.TypeWorkQueued && !external {
					continue // the submit command says so
				}
				w.log = append(w.log, eventLine(ev))
			}
			w.mu.Unlock()
		}}})
	w.tel, err = NewTelemetry(metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider(),
		func() (int64, int64, bool) { return 0, 0, false }, func() (int64, time.Duration) { return 0, 0 })
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// eventLine is an event as the scripts show it.
func eventLine(ev store.Event) string {
	s := ev.Type + " " + ev.WorkID
	var d store.EventData
	if len(ev.Data) > 0 && json.Unmarshal(ev.Data, &d) == nil {
		if d.ErrorKind != "" {
			s += " kind=" + d.ErrorKind
		}
		if d.WillRetry {
			s += " retry"
		}
		if d.NextAttempt != 0 {
			s += " next=+" + time.Unix(0, d.NextAttempt).Sub(ev.Time).String()
		}
	}
	return strings.TrimSpace(s)
}

func (w *world) close() {
	if w.e != nil {
		w.stopEngine()
	}
	w.w.Close()
	w.hub.Close()
	w.st.Close()
}

// stopEngine stops the engine, ending the handlers it asks to stop (and
// any it left) until it exits.
func (w *world) stopEngine() {
	w.e.Stop(true) // the engine cancels its runs (Cancel ends them)
	select {
	case <-w.e.Done():
		return
	case <-time.After(5 * time.Second):
	}
	deadline := time.After(10 * time.Second)
	for {
		w.finishAll() // runs the engine did not cancel
		select {
		case <-w.e.Done():
			return
		case <-deadline:
			w.t.Error("the engine did not stop")
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// finishAll ends every running handler (as cancelled).
func (w *world) finishAll() {
	w.mu.Lock()
	runs := w.runs
	w.runs = map[string]*scriptRun{}
	w.mu.Unlock()
	for _, r := range runs {
		r.end <- Ending{Err: ErrShutdown, At: w.clk.Now()}
	}
}

func (w *world) settle() {
	for {
		w.waitLaunches()
		w.settleOnce()
		w.waitLaunches()
		w.mu.Lock()
		stopped := w.stopped
		w.stopped = nil
		w.mu.Unlock()
		if len(stopped) == 0 {
			return
		}
		for _, r := range stopped {
			<-r.sent
		}
	}
}

// waitLaunches waits until every run launched has started or ended (a
// generous deadline: a run's goroutine only passes the start gate).
func (w *world) waitLaunches() {
	deadline := time.Now().Add(time.Minute)
	for {
		w.mu.Lock()
		n := w.launching
		w.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%d runs launched never started", n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (w *world) settleOnce() {
	if w.e == nil {
		if err := w.w.Sync(w.ctx); err != nil {
			w.t.Fatal(err)
		}
		return
	}
	if _, err := w.e.Settle(w.ctx); err != nil {
		w.t.Fatal(err)
	}
}

// do runs one command and returns what happened, sorted.
func (w *world) do(cmd string) []string {
	f := strings.Fields(cmd)
	args := map[string]string{}
	var pos []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	var extra []string
	switch f[0] {
	case "service":
		def := store.ServiceDef{MaxConcurrent: atoi(args["max"]), Margin: -1}
		if r, ok := args["rate"]; ok {
			n, per, _ := strings.Cut(r, "/")
			def.RateLimit, def.RateWindow = atoi(n), dur(per)
		}
		if c, ok := args["circuit"]; ok {
			n, per, _ := strings.Cut(c, "/")
			def.CircuitThreshold, def.CircuitTimeout = atoi(n), dur(per)
		}
		if m, ok := args["margin"]; ok {
			def.Margin = dur(m)
		}
		if m, ok := args["meter"]; ok { // tokens:100/1s
			name, rest, _ := strings.Cut(m, ":")
			n, per, _ := strings.Cut(rest, "/")
			def.Meters = append(def.Meters, store.MeterDef{Name: name, Limit: int64(atoi(n)), Window: dur(per)})
		}
		if _, ok := args["adaptive"]; ok || slices.Contains(pos, "adaptive") {
			def.Adaptive = &store.AdaptDef{}
		}
		if sh, ok := args["share"]; ok {
			def.Share = sh
		}
		if b, ok := args["budget"]; ok {
			n, per, _ := strings.Cut(b, "/")
			def.Budgets = append(def.Budgets, store.BudgetDef{Requests: atoi(n), Per: per, Location: "UTC"})
		}
		w.reg.Services[pos[0]] = def
		w.write(&store.PutService{Name: pos[0], Def: def.Encode()})
	case "task":
		spec := &TaskSpec{Name: pos[0], MaxConcurrent: atoi(args["max"]), Timeout: dur(args["timeout"]),
			Retry:     fixedRetry{attempts: max(atoi(args["attempts"]), 1), delay: dur(args["backoff"])},
			Retryable: func(error) bool { return true }, MaxDeferrals: 10, Runner: &scriptRunner{w: w},
			HoldSlotsUntilReturn:    args["hold"] != "" || slices.Contains(pos, "hold"),
			FailOnSkippedDependency: slices.Contains(pos, "failonskip")}
		if slices.Contains(pos, "reports") {
			spec.Runner = &scriptRunner{w: w, reports: true}
		}
		if slices.Contains(pos, "manual") {
			// Not InProcess: Settle does not wait for its runs to start.
			spec.Runner = manualRunner{&scriptRunner{w: w, manual: true}}
		}
		if s := args["services"]; s != "" {
			spec.Services = strings.Split(s, ",")
		}
		if k := args["keys"]; k != "" { // the unit's target is its key
			spec.Keys = func(v UnitView) ([]string, error) { return []string{k + ":" + v.Target}, nil }
		}
		if spec.Timeout == 0 {
			spec.Timeout = time.Hour
		}
		w.reg.Tasks[pos[0]] = spec
		w.write(&store.PutTask{Name: pos[0], Def: []byte(`{}`)})
		if w.e != nil {
			w.e.SetRegistry(w.snapshot())
		}
	case "start":
		w.priority = slices.Contains(pos, "priority")
		w.opts = args
		if slices.Contains(pos, "depcheck") {
			w.opts["depcheck"] = "1"
		}
		w.start(nil)
	case "unready", "ready":
		w.mu.Lock()
		if w.unready == nil {
			w.unready = map[string]bool{}
		}
		w.unready[pos[0]] = f[0] == "unready"
		w.mu.Unlock()
	case "override":
		def := w.reg.Services[pos[0]]
		def.MaxConcurrent = atoi(args["max"])
		w.write(&store.PutService{Name: pos[0], Override: def.Encode()})
		w.e.ServiceChanged(w.ctx, pos[0])
	case "room":
		w.e.SetRoom(pos[0], atoi(pos[1]))
	case "observe": // observe ID AMOUNT:REMAINING/RESET
		w.mu.Lock()
		r := w.runs[pos[0]]
		w.mu.Unlock()
		name, rest, _ := strings.Cut(pos[1], ":")
		n, reset, _ := strings.Cut(rest, "/")
		r.p.Observe(rt.Observation{Limits: []rt.ObservedLimit{{Name: name, Remaining: int64(atoi(n)), Reset: dur(reset)}}})
	case "report": // report ID OFFSET: the run's start, at the engine's now plus OFFSET
		w.mu.Lock()
		r := w.runs[pos[0]]
		w.mu.Unlock()
		r.p.Started(r.p.Now().Add(dur(pos[1])))
	case "inspect":
		st, err := w.e.Inspect(w.ctx)
		if err != nil {
			w.t.Fatal(err)
		}
		extra = append(extra, fmt.Sprintf("live=%d inflight=%d lanes=%d units=%d keyed=%d", st.Live, st.Inflight, st.Lanes, st.Units, st.Keyed))
	case "submit", "submit-elsewhere":
		// submit ID TASK [k=v...] [| ID TASK [k=v...]]...: one batch
		var units []*store.Unit
		for _, spec := range strings.Split(strings.TrimPrefix(strings.TrimPrefix(cmd, "submit-elsewhere "), "submit "), "|") {
			units = append(units, w.unit(strings.Fields(spec)))
		}
		res := w.write(&store.Insert{Units: units, At: w.clk.Now(), MaxQueued: atoi(w.opts["maxqueued"])})
		if res.Err != nil {
			extra = append(extra, "refused "+res.Err.Error())
			break
		}
		var fresh []*store.Unit
		for i, iu := range res.Units {
			if iu.Refused != nil {
				extra = append(extra, "refused "+iu.ID+": "+iu.Refused.Error())
			} else if !iu.Duplicate && iu.State == store.Queued {
				fresh = append(fresh, units[i])
				extra = append(extra, "queued "+iu.ID)
			}
		}
		var ended []store.Event
		for _, ev := range res.Events {
			if ev.Type != store.TypeWorkQueued {
				ended = append(ended, ev)
			}
		}
		switch {
		case w.e == nil:
		case f[0] == "submit-elsewhere":
			w.e.External(res.Events) // as another process's commit, read from the log
		case len(fresh) > 0 || len(ended) > 0:
			w.e.Inserted(fresh, ended)
		}
	case "tick":
		w.settle()
		w.clk.Advance(dur(pos[0]))
	case "done":
		w.mu.Lock()
		r := w.runs[pos[0]]
		delete(w.runs, pos[0])
		w.mu.Unlock()
		if r == nil {
			extra = append(extra, "not running "+pos[0])
			break
		}
		e := scriptEnding(f[2], w.clk.Now())
		if u := args["used"]; u != "" { // tokens:20
			name, n, _ := strings.Cut(u, ":")
			e.Used = map[string]int64{name: int64(atoi(n))}
		}
		r.end <- e
		// The handler's goroutine hands the end to the engine; settle waits
		// for it to get there.
		<-r.sent
	case "cancel":
		rep, ok, err := w.e.Cancel(w.ctx, pos[0], rt.CancelOptions{Cascade: slices.Contains(pos, "cascade")})
		if err != nil || !ok {
			w.t.Fatalf("cancel %s: %v %v", pos[0], ok, err)
		}
		if rep.Err != nil {
			extra = append(extra, "cancel: "+rep.Err.Error())
		}
	case "pause", "resume":
		w.pause(f[0] == "pause", pos)
	case "explain":
		ex, _, err := w.e.Explain(w.ctx, pos[0])
		if err != nil {
			w.t.Fatal(err)
		}
		for _, r := range ex.Reasons {
			s := "reason " + string(r.Kind)
			if r.Service != "" {
				s += " " + r.Service
			}
			if r.Meter != "" {
				s += " meter=" + r.Meter
			}
			if !r.Until.IsZero() {
				s += " until=+" + r.Until.Sub(w.clk.Now()).String()
			}
			extra = append(extra, s)
		}
	case "status":
		if strings.Contains(pos[0], ":") {
			st, _, err := w.e.KeyStatus(w.ctx, pos[0])
			if err != nil || st == nil {
				extra = append(extra, fmt.Sprintf("%s unknown (%v)", pos[0], err))
				break
			}
			extra = append(extra, fmt.Sprintf("%s active=%d in_window=%d circuit=%s paused=%v", st.Name, st.Active, st.InWindow, st.Circuit, st.Paused))
			break
		}
		sts, _, err := w.e.Services(w.ctx)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, st := range sts {
			if st.Name == pos[0] {
				extra = append(extra, fmt.Sprintf("%s active=%d in_window=%d circuit=%s paused=%v", st.Name, st.Active, st.InWindow, st.Circuit, st.Paused))
			}
		}
	case "stats":
		sts, _, err := w.e.ServiceStats(w.ctx)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, st := range sts {
			extra = append(extra, fmt.Sprintf("stats %s active=%d keys=%d", st.Name, st.Active, len(st.Keys)))
		}
		bp, _, err := w.e.Backpressure(w.ctx)
		if err != nil {
			w.t.Fatal(err)
		}
		q, unloaded := w.e.Queued()
		extra = append(extra, fmt.Sprintf("queued=%d unloaded=%d backpressure=%v", q, unloaded, bp.Active))
	case "progress":
		w.mu.Lock()
		r := w.runs[pos[0]]
		w.mu.Unlock()
		r.p.Progress([]byte(`"half"`))
		r.p.Heartbeat()
	case "drain":
		dctx, cancel := context.WithTimeout(w.ctx, 50*time.Millisecond)
		err := w.e.Drain(dctx)
		cancel()
		extra = append(extra, fmt.Sprintf("drained=%v", err == nil))
	case "kill":
		w.settle()
		w.e.Abandon()
		<-w.e.Done()
		w.own.Release()
		w.mu.Lock()
		for _, r := range w.runs {
			close(r.end) // the dead process's handlers stop reporting
		}
		w.runs = map[string]*scriptRun{}
		w.mu.Unlock()
		w.e = nil
	case "stop":
		w.stopEngine()
		w.e = nil
	default:
		w.t.Fatalf("unknown command %q", cmd)
	}
	w.settle()
	w.mu.Lock()
	got := append(w.log, extra...)
	w.log = nil
	w.mu.Unlock()
	slices.Sort(got)
	return got
}

// unit is a submission: ID TASK [after=ID,...] [at=DUR] [target=T] [cost=AMOUNT:N].
func (w *world) unit(f []string) *store.Unit {
	args := map[string]string{}
	for _, a := range f[2:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		}
	}
	u := &store.Unit{ID: f[0], Task: f[1], Target: args["target"], State: store.Queued, CreatedAt: w.clk.Now()}
	if a := args["after"]; a != "" {
		u.DependsOn = strings.Split(a, ",")
	}
	if at := args["at"]; at != "" {
		u.RunAt = w.clk.Now().Add(dur(at))
	}
	if c := args["cost"]; c != "" { // tokens:50
		name, n, _ := strings.Cut(c, ":")
		u.Costs = map[string]int64{name: int64(atoi(n))}
	}
	if d := args["deptimeout"]; d != "" {
		u.DependencyDeadline = w.clk.Now().Add(dur(d))
	}
	return u
}

func (w *world) snapshot() Registry {
	reg := Registry{Services: make(map[string]store.ServiceDef, len(w.reg.Services)), Tasks: make(map[string]*TaskSpec, len(w.reg.Tasks))}
	for k, v := range w.reg.Services {
		reg.Services[k] = v
	}
	for k, v := range w.reg.Tasks {
		reg.Tasks[k] = v
	}
	return reg
}

func (w *world) start(ended []store.RunRef) {
	own, err := w.st.Acquire(w.ctx, store.Holder{Owner: "scenario", Host: "test", PID: 1, Since: w.clk.Now()})
	if err != nil {
		w.t.Fatal(err)
	}
	stored, err := w.st.Services(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	pauses, err := w.st.Pauses(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	cfg := Settings{
		MaxConcurrent: 100, MaxUncommitted: 1024, MaxPayload: 1 << 20, DefaultTimeout: time.Hour, LeaseBuffer: time.Minute,
		MaxStartDelay: 2 * time.Second, EventRetention: 7 * 24 * time.Hour, SubscriptionRetention: 30 * 24 * time.Hour,
		QueueStatusInterval: 5 * time.Second, CancelGrace: 30 * time.Second, DependencyRecheck: time.Second, PriorityTTL: time.Hour,
		CallbackTimeout: 20 * time.Second, FeedInterval: time.Second, LoadAhead: -1, StatsKeys: 10,
		Rand: rand.NewPCG(1, 2), Clock: w.clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Ended: ended,
	}
	cfg.MaxQueued = atoi(w.opts["maxqueued"])
	if d := w.opts["startdelay"]; d != "" {
		cfg.MaxStartDelay = dur(d)
	}
	if n := atoi(w.opts["loadahead"]); n > 0 {
		cfg.LoadAhead = n
	}
	if w.opts["depcheck"] != "" {
		cfg.DependencySatisfied = func(_ context.Context, dep rt.Dependency) (bool, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			return !w.unready[dep.ID], nil
		}
	}
	if n := atoi(w.opts["feed"]); n > 0 {
		cfg.FeedLowWater = 2
		cfg.Feed = func(ctx context.Context, want int) error {
			w.mu.Lock()
			i := w.fed
			w.fed++
			w.mu.Unlock()
			if i >= n {
				return ErrFeedExhausted
			}
			u := &store.Unit{ID: fmt.Sprintf("fed%d", i), Task: "a", State: store.Queued, CreatedAt: w.clk.Now()}
			res, err := w.w.Do(ctx, &store.Insert{Units: []*store.Unit{u}, At: w.clk.Now()})
			if err == nil && res[0].Err == nil {
				w.e.Inserted([]*store.Unit{u}, nil)
			}
			return err
		}
	}
	if w.priority {
		cfg.Priority = func(in PriorityInput) float64 {
			x, _ := strconv.ParseFloat(in.Unit.Target, 64)
			return x / 10 // scores are from 0 to 1
		}
	}
	hooks := Hooks{CheckInvariants: func(err error) { w.t.Errorf("invariant: %v", err) }}
	if w.invariant != nil {
		hooks.CheckInvariants = w.invariant
	}
	if w.hooks != nil {
		w.hooks(&hooks)
	}
	if w.settings != nil {
		w.settings(&cfg)
	}
	if cfg.LoadAhead > 0 && hooks.FirstLoad == 0 { // the load's pages as small as its bound
		hooks.FirstLoad, hooks.LoadBatch = cfg.LoadAhead, cfg.LoadAhead
	}
	w.own = own
	w.e = New(cfg, Deps{Store: w.st, Writer: w.w, Hub: w.hub, Tel: w.tel, Stats: &w.count,
		UnitRetry:     func([]byte) (RetryPolicy, error) { return fixedRetry{attempts: 1}, nil },
		Encode:        func(v any) []byte { b, _ := json.Marshal(v); return b },
		ReportOrphans: func(map[string]int) {}, Detach: func(*Engine) {},
		Hooks: hooks,
	}, "scenario", own, stored, pauses, w.snapshot())
	if err := w.e.Recover(w.ctx); err != nil {
		w.t.Fatal(err)
	}
	go w.e.Run()
}

func (w *world) write(op store.Op) store.Result {
	res, err := w.w.Do(w.ctx, op)
	if err != nil {
		w.t.Fatal(err)
	}
	return res[0]
}

func (w *world) pause(paused bool, pos []string) {
	switch pos[0] {
	case "service":
		w.write(&store.PutService{Name: pos[1], Paused: &paused})
		if w.e != nil {
			w.e.ServiceChanged(w.ctx, pos[1])
		}
	case "queue":
		w.write(&store.SetPause{Paused: paused})
		if w.e != nil {
			w.e.PausesChanged(w.ctx)
		}
	case "task":
		w.write(&store.SetPause{Task: pos[1], Paused: paused})
		if w.e != nil {
			w.e.PausesChanged(w.ctx)
		}
	}
}

// scriptEnding is the Ending a "done" command gives.
func scriptEnding(what string, at time.Time) Ending {
	e := Ending{At: at}
	switch {
	case what == "ok":
		e.Result = []byte(`"ok"`)
	case what == "fail":
		e.Err = fmt.Errorf("failed")
	case what == "permanent":
		e.Err, e.Permanent = fmt.Errorf("bad input"), true
	case what == "skip":
		e.Err, e.Class, e.SkipReason = fmt.Errorf("skipped"), ClassSkip, "nothing to do"
	case what == "overloaded":
		e.Err, e.Overload = fmt.Errorf("503"), true
	case what == "panic":
		e.Err, e.Class = fmt.Errorf("panic: boom"), ClassPanic
	case strings.HasPrefix(what, "retry-after="):
		e.Err, e.Class, e.Delay = fmt.Errorf("429"), ClassRetryAfter, dur(strings.TrimPrefix(what, "retry-after="))
	default:
		panic("unknown outcome " + what)
	}
	return e
}

// scriptRunner runs a script's handlers: each run starts at once (through
// the start gate) and stays running until "done" ends it.
type scriptRunner struct {
	w *world
	// reports: the runner reports its starts (Run.Started) instead of
	// passing the start gate, as a Runner whose handlers run elsewhere;
	// manual: the script reports them ("report").
	reports, manual bool
}

type scriptRun struct {
	p    *Run
	end  chan Ending
	sent chan struct{}
}

func (sr *scriptRunner) InProcess() {}

// manualRunner is a scriptRunner whose runs start elsewhere, when the
// script says.
type manualRunner struct{ sr *scriptRunner }

func (m manualRunner) Launch(p *Run)              { m.sr.Launch(p) }
func (m manualRunner) Cancel(p *Run, cause error) { m.sr.Cancel(p, cause) }

func (sr *scriptRunner) Launch(p *Run) {
	r := &scriptRun{p: p, end: make(chan Ending, 1), sent: make(chan struct{})}
	p.Handle = r
	if sr.manual {
		sr.w.mu.Lock()
		sr.w.runs[p.ID] = r
		sr.w.log = append(sr.w.log, "launched "+p.ID)
		sr.w.mu.Unlock()
		go func() {
			defer close(r.sent)
			if e, ok := <-r.end; ok {
				p.Done(e)
			}
		}()
		return
	}
	sr.w.mu.Lock()
	sr.w.launching++
	sr.w.mu.Unlock()
	go func() {
		defer close(r.sent)
		launched := false
		defer func() {
			if !launched {
				sr.w.mu.Lock()
				sr.w.launching--
				sr.w.mu.Unlock()
			}
		}()
		if _, err := p.Params(); err != nil {
			p.Done(Ending{Err: err, NotStarted: true, At: sr.w.clk.Now()})
			return
		}
		if sr.reports {
			p.Started(p.Now())
		} else if _, err := p.Begin(); err != nil {
			p.Done(Ending{Err: err, NotStarted: true, At: sr.w.clk.Now()})
			return
		}
		sr.w.mu.Lock()
		sr.w.runs[p.ID] = r
		sr.w.log = append(sr.w.log, "started "+p.ID)
		sr.w.launching--
		sr.w.mu.Unlock()
		launched = true
		e, ok := <-r.end
		if ok {
			p.Done(e)
		}
	}()
}

func (sr *scriptRunner) Cancel(p *Run, cause error) {
	r := p.Handle.(*scriptRun)
	sr.w.mu.Lock()
	_, running := sr.w.runs[p.ID]
	delete(sr.w.runs, p.ID)
	sr.w.mu.Unlock()
	if running {
		sr.w.mu.Lock()
		sr.w.log = append(sr.w.log, "stopped "+p.ID+" ("+cause.Error()+")")
		sr.w.stopped = append(sr.w.stopped, r)
		sr.w.mu.Unlock()
		r.end <- Ending{Err: cause, At: sr.w.clk.Now(), Class: scriptClass(cause)}
	}
}

func scriptClass(cause error) Class {
	if cause == ErrTimeout {
		return ClassTimeout
	}
	return ClassError
}

// fixedRetry retries attempts-1 times after delay.
type fixedRetry struct {
	attempts int
	delay    time.Duration
}

func (f fixedRetry) Attempts() int                    { return f.attempts }
func (f fixedRetry) Delay(int, float64) time.Duration { return f.delay }

func atoi(s string) int {
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

func dur(s string) time.Duration {
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}
