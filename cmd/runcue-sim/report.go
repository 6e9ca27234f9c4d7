package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/runcue/runcue"
)

// Report is a run's outcome: the configuration, every metric and the
// verdict of each invariant. A virtual run's report carries no unit IDs
// and no wall-clock times but Wall, so that two runs with one seed give
// the same report but for Wall.
type Report struct {
	Scenario string `json:"scenario"`
	Virtual  bool   `json:"virtual"`
	Config   Config `json:"config"`
	// Ended is the simulated time at the end, and why it ended ("drained",
	// "drain time out", "stopped").
	Ended     Duration `json:"ended"`
	EndReason string   `json:"end_reason"`
	// Wall is the real time the run took.
	Wall Duration `json:"wall"`

	Submission Submission                `json:"submission"`
	Units      UnitCounts                `json:"units"`
	Throughput Throughput                `json:"throughput"`
	Latency    Latencies                 `json:"latency"`
	Retries    Retries                   `json:"retries"`
	Services   map[string]ServiceMetrics `json:"services"`
	// Tenants are the tenants' shares (Workload.Tenants).
	Tenants    map[string]TenantShare `json:"tenants,omitempty"`
	Priority   PriorityMetrics        `json:"priority"`
	QueueDepth []DepthPoint           `json:"queue_depth"`
	// Recovery is filled by the recovery scenario; Patterns by a run
	// with Workload.Keys (patterns.go).
	Recovery   *RecoveryMetrics `json:"recovery,omitempty"`
	Patterns   *PatternReport   `json:"patterns,omitempty"`
	Invariants []Invariant      `json:"invariants"`
	Pass       bool             `json:"pass"`
}

// Submission counts the groups submitted and refused.
type Submission struct {
	Groups              int            `json:"groups"`
	Units               int            `json:"units"`
	RefusedCycles       int            `json:"refused_cycles"`
	RefusedBackpressure int            `json:"refused_backpressure"`
	RefusedOther        int            `json:"refused_other"`
	RefusedByPattern    map[string]int `json:"refused_by_pattern,omitempty"`
	BackpressureEvents  int            `json:"backpressure_events"`
}

// UnitCounts counts the accepted units by final state, and the checks of
// the units' records.
type UnitCounts struct {
	Completed  int `json:"completed"`
	Failed     int `json:"failed"`
	Skipped    int `json:"skipped"`
	Cancelled  int `json:"cancelled"`
	Unfinished int `json:"unfinished"`
	// Lost counts accepted units the database does not hold;
	// CompletedTwice units with more than one completion record (events
	// or attempts); DependencyViolations runs started before one of
	// their dependencies had completed.
	Lost                 int `json:"lost"`
	CompletedTwice       int `json:"completed_twice"`
	DependencyViolations int `json:"dependency_violations"`
	// StateMismatches counts units whose stored state differs from the
	// one their events reported.
	StateMismatches int `json:"state_mismatches"`
}

// Throughput is completions per simulated minute.
type Throughput struct {
	PerMinute []int   `json:"per_minute"`
	Mean      float64 `json:"mean_per_minute"`
	Peak      int     `json:"peak_per_minute"`
}

// Percentiles summarizes a distribution, in milliseconds.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// Histogram counts the values in Buckets (upper bounds, ms).
	Buckets   []float64 `json:"buckets_ms,omitempty"`
	Histogram []int     `json:"histogram,omitempty"`
}

// Latencies are queue wait (eligible to start) and run time (start to
// end), per run.
type Latencies struct {
	QueueWait Percentiles `json:"queue_wait"`
	Run       Percentiles `json:"run"`
	EndToEnd  Percentiles `json:"end_to_end"`
}

// Retries counts runs beyond the first.
type Retries struct {
	Runs int `json:"runs"`
	// Rate is the runs beyond each unit's first over the units that ran.
	Rate float64 `json:"rate"`
	// Retried counts units run more than once; SucceededAfterRetry those
	// of them that completed, SuccessAfterRetry their share.
	Retried             int     `json:"retried"`
	SucceededAfterRetry int     `json:"succeeded_after_retry"`
	SuccessAfterRetry   float64 `json:"success_after_retry"`
	Deferred            int     `json:"deferred"`
}

// ServiceMetrics is one service as its mock saw it, and its circuit.
type ServiceMetrics struct {
	Checks checks `json:"server_side"`
	// RateLimited is the time its rate window (runcue's limit) was full.
	RateLimited Duration `json:"rate_limited"`
	// Circuit lists the circuit's changes; Opened counts its openings.
	Circuit []CircuitChange `json:"circuit,omitempty"`
	Opened  int             `json:"circuit_opened"`
	// Usage is the calls in the window ending at each sample, and Limit
	// the limit the chart draws.
	Usage []int `json:"usage,omitempty"`
	Limit int   `json:"limit,omitempty"`
	// Completed and Failed count the units of tasks that use it alone.
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// CircuitChange is a change of a circuit's state.
type CircuitChange struct {
	At    Duration `json:"at"`
	State string   `json:"state"`
}

// PriorityMetrics counts priority inversions: a unit started while a unit
// of its task with a higher priority had been eligible and was waiting.
type PriorityMetrics struct {
	Inversions int `json:"inversions"`
	// LowWait and HighWait are the queue waits of priority 0 and 1 runs.
	LowWait  Percentiles `json:"low_wait"`
	HighWait Percentiles `json:"high_wait"`
}

// DepthPoint is the queue at a sample time.
type DepthPoint struct {
	At      Duration `json:"at"`
	Waiting int      `json:"waiting"`
	Running int      `json:"running"`
}

// RecoveryMetrics is what the recovery scenario adds.
type RecoveryMetrics struct {
	Kills int `json:"kills"`
	// Executions counts handler executions the parent's mocks saw;
	// Repeated those beyond one per unit that the kills caused.
	Executions int `json:"executions"`
	Repeated   int `json:"repeated_executions"`
	Restarts   int `json:"restarts"`
}

// Invariant is one check's verdict.
type Invariant struct {
	Name   string `json:"name"`
	Pass   bool   `json:"pass"`
	Detail string `json:"detail"`
}

// samples is the number of points of the time series.
const samples = 240

// report computes the report from the recorder, the mocks and the
// database.
func (e *engine) report(ctx context.Context) (*Report, error) {
	e.wall = time.Since(e.wallStart)
	r := &Report{Scenario: e.cfg.Name, Virtual: e.opt.Virtual, Config: e.cfg, Ended: Duration(e.ended),
		EndReason: e.endReason, Wall: Duration(e.wall.Round(time.Millisecond)), Services: map[string]ServiceMetrics{}}
	rec := e.rec
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r.Submission = Submission{Groups: rec.groups, Units: len(rec.order), RefusedCycles: rec.refusedCycles,
		RefusedBackpressure: rec.refusedBackpressure, RefusedOther: rec.refusedOther, BackpressureEvents: rec.backpressureOn}
	if len(rec.refusedPatterns) > 0 {
		r.Submission.RefusedByPattern = rec.refusedPatterns
	}
	stored, err := e.storedUnits(ctx)
	if err != nil {
		return nil, err
	}
	units := make([]*unitRec, 0, len(rec.order))
	for _, id := range rec.order {
		units = append(units, rec.units[id])
	}
	unitMetrics(r, units, stored, rec.units)
	e.serviceMetrics(r, units, rec.circuits)
	r.Tenants = e.tenantShares()
	r.Priority = inversions(units)
	r.QueueDepth = queueDepth(units, r.Ended.D())
	e.verdicts(r)
	e.patterns(r, units, func(name string, pass bool, format string, args ...any) {
		r.Invariants = append(r.Invariants, Invariant{Name: name, Pass: pass, Detail: fmt.Sprintf(format, args...)})
		r.Pass = r.Pass && pass
	})
	return r, nil
}

// storedUnits reads every unit's stored state and attempts.
func (e *engine) storedUnits(ctx context.Context) (map[string]runcue.WorkInfo, error) {
	out := map[string]runcue.WorkInfo{}
	o := runcue.ListOptions{Limit: 1000}
	for {
		page, err := e.cue.List(ctx, o)
		if err != nil {
			return nil, err
		}
		for _, w := range page.Units {
			out[w.ID] = w
		}
		if page.Next == "" {
			return out, nil
		}
		o.Cursor = page.Next
	}
}

// unitMetrics fills the unit counts, throughput, latencies and retries.
func unitMetrics(r *Report, units []*unitRec, stored map[string]runcue.WorkInfo, byID map[string]*unitRec) {
	var wait, run, e2e []float64
	perMinute := make([]int, int(r.Ended.D()/time.Minute)+1)
	c := &r.Units
	ranUnits := 0
	for _, u := range units {
		switch u.final {
		case "completed":
			c.Completed++
			if m := int(u.finalAt / time.Minute); m >= 0 && m < len(perMinute) {
				perMinute[m]++
			}
			e2e = append(e2e, ms(u.finalAt-u.submitted))
		case "failed":
			c.Failed++
		case "skipped":
			c.Skipped++
		case "cancelled":
			c.Cancelled++
		default:
			c.Unfinished++
		}
		w, ok := stored[u.spec.id]
		if !ok {
			c.Lost++
		} else {
			completions := 0
			for _, a := range w.Attempts {
				if a.Outcome == "completed" {
					completions++
				}
			}
			if completions > 1 || u.completions > 1 {
				c.CompletedTwice++
			}
			if u.final != "" && string(w.State) != u.final {
				c.StateMismatches++
			}
		}
		for _, x := range u.runs {
			for _, d := range u.spec.deps {
				if dep := byID[d]; dep == nil || !completedBy(dep, x.start) {
					c.DependencyViolations++
				}
			}
			if x.ended {
				run = append(run, ms(x.end-x.start))
			}
		}
		for _, iv := range waits(u, byID) {
			if iv.start != math.MaxInt64 { // a unit still waiting at the end has no wait yet
				wait = append(wait, ms(iv.start-iv.ready))
			}
		}
		if len(u.runs) > 0 {
			ranUnits++
			rt := &r.Retries
			rt.Runs += len(u.runs) - 1
			if len(u.runs) > 1 {
				rt.Retried++
				if u.final == "completed" {
					rt.SucceededAfterRetry++
				}
			}
			for _, x := range u.runs {
				if x.answer == answerTooMany.String() {
					rt.Deferred++
				}
			}
		}
	}
	if ranUnits > 0 {
		r.Retries.Rate = round4(float64(r.Retries.Runs) / float64(ranUnits))
	}
	if r.Retries.Retried > 0 {
		r.Retries.SuccessAfterRetry = round4(float64(r.Retries.SucceededAfterRetry) / float64(r.Retries.Retried))
	}
	r.Throughput.PerMinute = perMinute
	sum := 0
	for _, n := range perMinute {
		sum += n
		r.Throughput.Peak = max(r.Throughput.Peak, n)
	}
	if m := r.Ended.D().Minutes(); m > 0 {
		r.Throughput.Mean = round4(float64(sum) / m)
	}
	r.Latency = Latencies{QueueWait: percentiles(wait, true), Run: percentiles(run, true), EndToEnd: percentiles(e2e, false)}
}

// completedBy reports whether dep had completed (or been skipped) by t.
func completedBy(dep *unitRec, t time.Duration) bool {
	if dep.final != "completed" && dep.final != "skipped" {
		return false
	}
	if dep.finalAt <= t {
		return true
	}
	// The completion event's time may trail the handler's return: its
	// successful run's end counts.
	for _, x := range dep.runs {
		if x.ended && x.answer == answerOK.String() && x.end <= t {
			return true
		}
	}
	return false
}

// interval is a run's wait: eligible at ready, started at start (never
// started: math.MaxInt64).
type interval struct {
	ready, start time.Duration
	priority     int
	task         string
}

// waits returns the unit's waits, one per run (and one for a wait that
// never ended): the first from its submission or its last dependency's
// completion, each later one from the time its retry became eligible.
func waits(u *unitRec, byID map[string]*unitRec) []interval {
	ready := u.submitted
	for _, d := range u.spec.deps {
		dep := byID[d]
		if dep == nil || (dep.final != "completed" && dep.final != "skipped") {
			return nil // never eligible
		}
		ready = max(ready, dep.finalAt)
	}
	var out []interval
	for i, x := range u.runs {
		if i > 0 {
			ready = u.runs[i-1].end
			for _, rt := range u.retries {
				if rt.attempt == u.runs[i-1].attempt {
					ready = max(ready, rt.next)
				}
			}
		}
		out = append(out, interval{ready: ready, start: x.start, priority: u.spec.priority, task: u.spec.task})
	}
	if u.final == "" {
		if n := len(u.runs); n > 0 {
			if !u.runs[n-1].ended {
				return out
			}
			ready = u.runs[n-1].end
			for _, rt := range u.retries {
				if rt.attempt == u.runs[n-1].attempt {
					ready = max(ready, rt.next)
				}
			}
		}
		out = append(out, interval{ready: ready, start: math.MaxInt64, priority: u.spec.priority, task: u.spec.task})
	}
	return out
}

// inversions counts, for each run's start, whether a unit of the same
// task with a higher priority was eligible strictly before it and still
// waiting: a lower-priority unit started while an eligible higher-priority
// one waited.
func inversions(units []*unitRec) PriorityMetrics {
	byID := map[string]*unitRec{}
	for _, u := range units {
		byID[u.spec.id] = u
	}
	type key struct {
		task     string
		priority int
	}
	readies, starts := map[key][]time.Duration{}, map[key][]time.Duration{}
	var all []interval
	var pm PriorityMetrics
	var low, high []float64
	for _, u := range units {
		for _, iv := range waits(u, byID) {
			all = append(all, iv)
			if iv.start == math.MaxInt64 {
				// Still waiting at the end: counts as waiting at every
				// later start.
			} else if iv.priority == 0 {
				low = append(low, ms(iv.start-iv.ready))
			} else {
				high = append(high, ms(iv.start-iv.ready))
			}
			if iv.start > iv.ready {
				k := key{iv.task, iv.priority}
				readies[k] = append(readies[k], iv.ready)
				starts[k] = append(starts[k], iv.start)
			}
		}
	}
	for k := range readies {
		slices.Sort(readies[k])
		slices.Sort(starts[k])
	}
	prios := map[string][]int{}
	for k := range readies {
		prios[k.task] = append(prios[k.task], k.priority)
	}
	for _, iv := range all {
		if iv.start == math.MaxInt64 {
			continue
		}
		for _, q := range prios[iv.task] {
			if q <= iv.priority {
				continue
			}
			k := key{iv.task, q}
			// Waiting at t: ready < t < start.
			before := sort.Search(len(readies[k]), func(i int) bool { return readies[k][i] >= iv.start })
			startedBy := sort.Search(len(starts[k]), func(i int) bool { return starts[k][i] > iv.start })
			if before-startedBy > 0 {
				pm.Inversions++
				break
			}
		}
	}
	pm.LowWait, pm.HighWait = percentiles(low, false), percentiles(high, false)
	return pm
}

// queueDepth samples the units waiting (submitted, not running, not
// ended) and running over the run.
func queueDepth(units []*unitRec, end time.Duration) []DepthPoint {
	type edge struct {
		at              time.Duration
		dWait, dRunning int
	}
	var edges []edge
	for _, u := range units {
		edges = append(edges, edge{u.submitted, 1, 0})
		for _, x := range u.runs {
			edges = append(edges, edge{x.start, -1, 1})
			if x.ended {
				edges = append(edges, edge{x.end, 1, -1})
			}
		}
		if u.final != "" {
			edges = append(edges, edge{u.finalAt, -1, 0})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int { return int(a.at - b.at) })
	step := max(end/samples, time.Millisecond)
	var out []DepthPoint
	w, run, i := 0, 0, 0
	for t := time.Duration(0); t <= end; t += step {
		for i < len(edges) && edges[i].at <= t {
			w += edges[i].dWait
			run += edges[i].dRunning
			i++
		}
		out = append(out, DepthPoint{At: Duration(t), Waiting: max(w, 0), Running: run})
	}
	return out
}

// serviceMetrics fills each service's server-side checks, its time rate
// limited, its circuit and its usage series.
func (e *engine) serviceMetrics(r *Report, units []*unitRec, circuits []circuitRec) {
	for _, name := range e.cfg.serviceNames() {
		m := e.mocks[name]
		s := e.cfg.Services[name]
		sm := ServiceMetrics{Checks: m.check(), Limit: s.RateLimit}
		cs := m.sortedCalls()
		if s.RateLimit > 0 {
			sm.RateLimited = Duration(fullTime(cs, e.epoch, s.RateWindow.D(), s.RateLimit))
			sm.Usage = usage(cs, e.epoch, s.RateWindow.D(), r.Ended.D())
		} else {
			sm.Limit = s.MaxConcurrent
			sm.Usage = concurrency(cs, e.epoch, r.Ended.D())
		}
		for _, c := range circuits {
			if c.service == name {
				sm.Circuit = append(sm.Circuit, CircuitChange{At: Duration(c.at), State: c.state})
				if c.state == string(runcue.CircuitOpen) {
					sm.Opened++
				}
			}
		}
		for _, u := range units {
			if ts := e.cfg.Workload.TaskServices[u.spec.task]; len(ts) == 1 && ts[0] == name {
				switch u.final {
				case "completed":
					sm.Completed++
				case "failed":
					sm.Failed++
				}
			}
		}
		r.Services[name] = sm
	}
}

// fullTime returns how long the window held limit calls or more: each
// call counts from its start for w.
func fullTime(cs []call, ep time.Time, w time.Duration, limit int) time.Duration {
	type edge struct {
		at time.Duration
		d  int
	}
	var edges []edge
	for _, c := range cs {
		t := c.start.Sub(ep)
		edges = append(edges, edge{t, 1}, edge{t + w, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.d - b.d
	})
	var full time.Duration
	n := 0
	for i, x := range edges {
		n += x.d
		if n >= limit && i+1 < len(edges) {
			full += edges[i+1].at - x.at
		}
	}
	return full
}

// usage samples the calls in the window (t-w, t] at each sample time t.
func usage(cs []call, ep time.Time, w, end time.Duration) []int {
	step := max(end/samples, time.Millisecond)
	var out []int
	i, j := 0, 0
	for t := time.Duration(0); t <= end; t += step {
		for i < len(cs) && cs[i].start.Sub(ep) <= t {
			i++
		}
		for j < i && cs[j].start.Sub(ep) <= t-w {
			j++
		}
		out = append(out, i-j)
	}
	return out
}

// concurrency samples the calls in progress at each sample time.
func concurrency(cs []call, ep time.Time, end time.Duration) []int {
	step := max(end/samples, time.Millisecond)
	out := make([]int, int(end/step)+1)
	for _, c := range cs {
		from := c.start.Sub(ep)
		to := end + 1
		if !c.end.IsZero() {
			to = c.end.Sub(ep)
		}
		for k := int((from + step - 1) / step); k < len(out) && time.Duration(k)*step < to; k++ {
			out[k]++
		}
	}
	return out
}

func percentiles(xs []float64, hist bool) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	slices.Sort(xs)
	at := func(q float64) float64 {
		return round4(xs[min(len(xs)-1, int(math.Ceil(q*float64(len(xs))))-1)])
	}
	p := Percentiles{N: len(xs), P50: at(0.5), P95: at(0.95), P99: at(0.99), Max: round4(xs[len(xs)-1])}
	if hist {
		p.Buckets = []float64{10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, math.MaxFloat64}
		p.Histogram = make([]int, len(p.Buckets))
		for _, x := range xs {
			i, _ := slices.BinarySearch(p.Buckets, x)
			p.Histogram[min(i, len(p.Buckets)-1)]++
		}
		p.Buckets = p.Buckets[:len(p.Buckets)-1] // the last is "more"
	}
	return p
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

// verdicts checks the invariants.
func (e *engine) verdicts(r *Report) {
	add := func(name string, pass bool, format string, args ...any) {
		r.Invariants = append(r.Invariants, Invariant{Name: name, Pass: pass, Detail: fmt.Sprintf(format, args...)})
	}
	// expect adds a check of something the scenario must bring about
	// over its whole run: a run stopped early (the TUI's Q) is not judged
	// on it.
	expect := func(name string, pass bool, format string, args ...any) {
		if r.EndReason == "stopped" && !pass {
			add(name, true, "not judged, the run was stopped: "+format, args...)
			return
		}
		add(name, pass, format, args...)
	}
	var rate, conc, ra int
	for _, name := range e.cfg.serviceNames() {
		ch := r.Services[name].Checks
		rate += ch.RateViolations
		conc += ch.ConcurrencyViolations
		ra += ch.RetryAfterViolations
	}
	add("server_side_rate_limit", rate == 0, "%d calls beyond a mock's own sliding-window limit", rate)
	add("server_side_concurrency", conc == 0, "%d calls beyond a mock's concurrency limit", conc)
	add("retry_after_honoured", ra == 0, "%d calls during a Retry-After the mock answered", ra)
	for _, name := range e.cfg.serviceNames() {
		t := e.cfg.Services[name].Tokens
		if t == nil {
			continue
		}
		ch := r.Services[name].Checks
		if t.MockBucket {
			add("server_side_token_limit:"+name, ch.TokenViolations == 0, "%d calls found the mock's bucket (%d tokens, refilled per %v) short of their tokens at arrival",
				ch.TokenViolations, t.MockLimit, t.Window.D())
		} else {
			add("server_side_token_limit:"+name, ch.TokenViolations == 0, "%d calls beyond %d tokens per %v at the mock (busiest window %d)",
				ch.TokenViolations, t.MockLimit, t.Window.D(), ch.MaxTokensInWindow)
		}
		if x := e.cfg.Expect.TokenUtilisation; x > 0 {
			expect("token_utilisation:"+name, ch.TokenUtilisation >= x, "%.1f%% of %d tokens per %v used while work was submitted (bound %.0f%%)",
				100*ch.TokenUtilisation, t.MockLimit, t.Window.D(), 100*x)
		}
	}
	x := e.cfg.Expect
	for _, name := range e.cfg.serviceNames() {
		h := r.Services[name].Checks.Hidden
		if h == nil {
			continue
		}
		s := e.cfg.Services[name]
		if x.HiddenRefusals > 0 {
			expect("hidden_limit_refusals:"+name, h.RefusedPct < 100*x.HiddenRefusals, "%.2f%% of %d calls answered 429 from %v to %v (bound %.0f%%)",
				h.RefusedPct, h.Calls, h.From.D(), h.To.D(), 100*x.HiddenRefusals)
		}
		if x.HiddenThroughput > 0 {
			expect("hidden_limit_throughput:"+name, h.Throughput >= x.HiddenThroughput, "%.1f%% of the hidden %d per %v served from %v to %v (bound %.0f%%)",
				100*h.Throughput, s.Behavior.HiddenLimit, s.RateWindow.D(), h.From.D(), h.To.D(), 100*x.HiddenThroughput)
		}
		if x.HiddenFollow > 0 {
			expect("hidden_limit_follow:"+name, h.Follow >= 0 && h.Follow <= x.HiddenFollow, "90%% of %d per %v served in a window %v after the hidden limit was lifted (bound %v)",
				s.RateLimit, s.RateWindow.D(), h.Follow.D(), x.HiddenFollow.D())
		}
	}
	for _, name := range e.cfg.serviceNames() {
		sh := r.Services[name].Checks.Shared
		if sh == nil {
			continue
		}
		if x.SharedRefusals > 0 {
			expect("shared_key_refusals:"+name, sh.RefusedPct < 100*x.SharedRefusals, "%.2f%% of runcue's %d calls answered 429 (bound %.1f%%)",
				sh.RefusedPct, sh.Calls, 100*x.SharedRefusals)
		}
		if x.SharedForeign > 0 {
			expect("shared_key_others:"+name, sh.ForeignRefused <= sh.ForeignAlone+x.SharedForeign, "%.2f%% of the other client's %d requests refused, %.2f%% with runcue absent (bound %.1f points more)",
				sh.ForeignRefused, sh.Foreign, sh.ForeignAlone, x.SharedForeign)
		}
		if x.SharedOfLeft > 0 {
			expect("shared_key_throughput:"+name, sh.OfLeft >= x.SharedOfLeft, "runcue used %.1f%% of the tokens the other client left (bound %.0f%%)",
				100*sh.OfLeft, 100*x.SharedOfLeft)
		}
	}
	for _, name := range e.cfg.serviceNames() {
		h := r.Services[name].Checks.Headers
		if h == nil {
			continue
		}
		if x.HeadersReach > 0 {
			expect("headers_reach:"+name, h.Reached >= 1 && h.Reached <= 3, "%.1f%% of the mock's limit used in a window by window %d, from runcue's starting %d (bound %.0f%% within 3 windows; by window: %v)",
				100*h.Best, h.Reached, h.Start, 100*x.HeadersReach, h.Windows)
		}
		if x.HeadersRefusals > 0 {
			expect("headers_refusals:"+name, h.RefusedPct <= 100*x.HeadersRefusals, "%.2f%% of runcue's %d calls after the first window answered 429 (bound %.1f%%)",
				h.RefusedPct, h.Calls, 100*x.HeadersRefusals)
		}
	}
	if x.TenantShares {
		tenantChecks(r, expect)
	}
	u := r.Units
	add("no_lost_units", u.Lost == 0, "%d of %d accepted units not in the database", u.Lost, r.Submission.Units)
	add("no_double_completion", u.CompletedTwice == 0, "%d units with two completion records", u.CompletedTwice)
	add("dependency_order", u.DependencyViolations == 0, "%d runs started before a dependency completed", u.DependencyViolations)
	add("stored_state_matches_events", u.StateMismatches == 0, "%d units whose stored state differs from their events", u.StateMismatches)
	add("no_deadlock", u.Unfinished == 0 || r.EndReason == "stopped", "%d units unfinished at the end (%s after %v)", u.Unfinished, r.EndReason, r.Ended.D())
	add("no_unexpected_refusals", r.Submission.RefusedOther == 0, "%d groups refused for a reason other than a cycle or backpressure", r.Submission.RefusedOther)
	circular := e.cfg.Workload.Pattern == "circular" || e.cfg.Workload.PatternWeights["circular"] > 0
	if circular || e.cfg.Expect.Refused {
		n := r.Submission.RefusedByPattern["circular"]
		expect("circular_refused", r.Submission.RefusedCycles == n && n > 0,
			"%d circular groups refused at submit with ErrCycle (%d cycle refusals in all)", n, r.Submission.RefusedCycles)
	}
	if x.NoInversions {
		add("priority_order", r.Priority.Inversions == 0, "%d priority inversions", r.Priority.Inversions)
	}
	if x.MaxLowWait > 0 {
		expect("no_starvation", r.Priority.LowWait.N > 0 && r.Priority.LowWait.Max <= ms(x.MaxLowWait.D()),
			"low-priority wait max %.0f ms over %d runs (bound %v)", r.Priority.LowWait.Max, r.Priority.LowWait.N, x.MaxLowWait.D())
	}
	for _, s := range x.CircuitOpens {
		expect("circuit_opens:"+s, r.Services[s].Opened > 0, "circuit of %s opened %d times", s, r.Services[s].Opened)
	}
	for _, s := range x.Unaffected {
		sm := r.Services[s]
		add("unaffected:"+s, sm.Opened == 0 && sm.Failed == 0, "%s: circuit opened %d times, %d units failed, %d completed", s, sm.Opened, sm.Failed, sm.Completed)
	}
	if x.Backpressure {
		expect("backpressure", r.Submission.RefusedBackpressure > 0 && r.Submission.BackpressureEvents > 0,
			"%d groups refused, backpressure activated %d times", r.Submission.RefusedBackpressure, r.Submission.BackpressureEvents)
	}
	if x.Deferrals {
		expect("retry_after_deferrals", r.Retries.Deferred > 0, "%d runs answered 429", r.Retries.Deferred)
	}
	r.Pass = true
	for _, iv := range r.Invariants {
		r.Pass = r.Pass && iv.Pass
	}
}
