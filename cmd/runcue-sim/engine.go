package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/httplimit"
)

// epoch is the start of every virtual run: reports count from it, so a
// virtual run carries no wall-clock time.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// options are how a run is driven, besides its Config.
type options struct {
	// Virtual drives the Cue on a fake clock (see virtualLoop).
	Virtual bool
	// DB is the database path; a temporary one when empty.
	DB string
	// Logger receives runcue's logs (discarded when nil).
	Logger *slog.Logger
}

// engine runs one simulation: a Cue, its mock services, the workload and
// the recorder.
type engine struct {
	cfg   Config
	opt   options
	clk   clock.Clock
	fake  *clock.Fake // when Virtual
	epoch time.Time
	cue   *runcue.Cue
	mocks map[string]*mock
	gen   *generator
	rec   *recorder
	park  parking
	dir   string // the temporary directory to remove, if any
	// batches counts the batches' calls (Workload.Batch).
	batches batchLog

	// Interactive controls (the TUI), real-clock runs only.
	stop      chan struct{} // closed to end the run early (stopOnce)
	stopOnce  sync.Once
	paused    atomic.Bool
	rateScale atomic.Uint64 // math.Float64bits

	// Set when the run ends (read by the report).
	wallStart time.Time
	wall      time.Duration
	ended     time.Duration // virtual time of the end, since epoch
	endReason string
}

func newEngine(cfg Config, opt options) (*engine, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	e := &engine{cfg: cfg, opt: opt, mocks: map[string]*mock{}, stop: make(chan struct{})}
	e.rateScale.Store(math.Float64bits(1))
	if opt.Virtual {
		e.fake = clock.NewFake(epoch)
		e.clk, e.epoch = e.fake, epoch
	} else {
		e.clk = clock.Real()
		e.epoch = e.clk.Now()
	}
	e.rec = newRecorder(e.epoch)
	e.gen = newGenerator(cfg.Workload, cfg.Seed)
	e.gen.rateScale = func() float64 { return math.Float64frombits(e.rateScale.Load()) }
	e.park.moved = make(chan struct{}, 1)
	for _, name := range cfg.serviceNames() {
		e.mocks[name] = newMock(name, cfg.Services[name], cfg.Seed, e.epoch)
		e.mocks[name].reach = cfg.Expect.HeadersReach
		e.mocks[name].until = cfg.Duration.D()
	}
	db := opt.DB
	if db == "" {
		dir, err := os.MkdirTemp("", "runcue-sim-")
		if err != nil {
			return nil, err
		}
		e.dir, db = dir, filepath.Join(dir, "sim.db")
	}
	c, err := runcue.Open(db, e.cueConfig())
	if err != nil {
		e.cleanup()
		return nil, err
	}
	e.cue = c
	if err := e.register(c, e.handler); err != nil {
		c.Close()
		e.cleanup()
		return nil, err
	}
	return e, nil
}

// cueConfig is the Config of the simulation's Cue.
func (e *engine) cueConfig() runcue.Config {
	logger := e.opt.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	w := e.cfg.Workload
	conc := 0
	for _, s := range e.cfg.Services {
		conc += s.MaxConcurrent
	}
	cfg := runcue.Config{
		Clock:               e.clk,
		Logger:              logger,
		EventBuffer:         1 << 16,
		QueueStatusInterval: -1,
		MaxConcurrent:       max(conc, 100),
		MaxQueued:           w.MaxQueued,
		ShutdownTimeout:     5 * time.Second,
		Priority:            priorityFunc(w.Aging.D()),
	}
	if e.opt.Virtual {
		cfg.Rand = rand.NewPCG(e.cfg.Seed, 0xc0e)
		// CallbackTimeout is real time: on a loaded machine a scoring pass
		// could overrun a short one, and its units would take the default
		// score: a seed would no longer give one run.
		cfg.CallbackTimeout = time.Hour
	}
	return cfg
}

// priorityFunc scores a unit by its params' priority ("p"), or, with
// aging, by the larger of that and its wait over aging.
func priorityFunc(aging time.Duration) runcue.PriorityFunc {
	byWait := runcue.PriorityByWaitTime(aging)
	return func(pc runcue.PriorityContext) float64 {
		var p prioParams
		if len(pc.Work.Params) > 0 {
			_ = json.Unmarshal(pc.Work.Params, &p)
		}
		x := float64(p.P)
		if aging > 0 {
			x = max(x, byWait(pc))
		}
		return x
	}
}

// register registers the services and task types on c, each task with
// the handler handle(task) makes.
func (e *engine) register(c *runcue.Cue, handle func(task string) runcue.Handler) error {
	for _, name := range e.cfg.serviceNames() {
		s := e.cfg.Services[name]
		svc := runcue.Service{MaxConcurrent: s.MaxConcurrent, RateLimit: s.RateLimit,
			RateWindow: s.RateWindow.D(), CircuitThreshold: s.CircuitThreshold, CircuitTimeout: s.CircuitTimeout.D(),
			Margin: s.Margin.D()}
		if s.Adaptive {
			svc.Adaptive = &runcue.Adaptive{}
		}
		if t := s.Tokens; t != nil {
			var charge runcue.Charge
			_ = charge.UnmarshalText([]byte(t.Charge)) // checked by normalize
			svc.Meters = []runcue.Meter{{Name: "tokens", Limit: t.Limit, Window: t.Window.D(), Charge: charge,
				FromProvider: t.FromProvider, MaxLimit: t.MaxLimit, Bucket: t.Bucket}}
		}
		if err := c.Service(name, svc); err != nil {
			return fmt.Errorf("service %s: %w", name, err)
		}
	}
	if err := e.registerTenants(c); err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	w := e.cfg.Workload
	for _, t := range w.TaskTypes {
		task := runcue.Task{Services: w.TaskServices[t], Handler: handle(t), Timeout: w.Timeout.D(), ServiceKeys: e.serviceKeys(),
			Retry:                runcue.RetryPolicy{MaxAttempts: w.MaxAttempts, BaseDelay: w.BaseDelay.D(), Jitter: runcue.JitterFull},
			HoldSlotsUntilReturn: true}
		if w.Debounce > 0 {
			task.Debounce = &runcue.Debounce{Period: w.Debounce.D()}
		}
		if w.Sequence {
			task.Sequence = &runcue.Sequence{}
		}
		if b := w.Batch; b != nil {
			task.Handler, task.Batch = nil, e.batch(t, b)
		}
		if err := c.Task(t, task); err != nil {
			return fmt.Errorf("task %s: %w", t, err)
		}
	}
	return nil
}

func (e *engine) cleanup() {
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

// handler returns the handler of a task type: it makes the call (see
// call) and returns the error of its answer.
func (e *engine) handler(task string) runcue.Handler {
	ms := e.taskMocks(task)
	return func(ctx context.Context, w *runcue.Work) (any, error) {
		// report gives runcue the response's headers (the mock's own count
		// of its limit, as of the call's arrival) with its status.
		report := func(status int) {
			now := e.clk.Now()
			for _, m := range ms {
				if m.cfg.Tokens != nil && m.cfg.Tokens.Headers != "none" {
					arrival := w.Started.Add(m.wire(w.ID, w.Attempt))
					_ = httplimit.Report(w, m.tokenHeaders(arrival, now), status, now) // the answer's own error is answerErr's
				}
			}
		}
		streamed := false
		v, bad, _, cut, idx := e.call(ctx, ms, w.ID, w.Attempt, w.Started, func([]int) {
			streamed = true
			report(http.StatusOK)
		})
		if cut {
			return nil, context.Cause(ctx) // a stream cut short: its usage never came
		}
		for i, m := range ms {
			if m.cfg.Tokens != nil {
				// What the call used (nothing if refused).
				w.Used(runcue.Costs{"tokens": m.counted(idx[i])})
			}
		}
		if !streamed {
			status := http.StatusOK
			if v == answerTooMany {
				status = http.StatusTooManyRequests
			}
			report(status)
		}
		return nil, answerErr(v, bad)
	}
}

// costs returns a submission's cost: the tokens of its call to the first
// token-limited service of its task, as estimated at submit.
func (e *engine) costs(s runcue.Submission) runcue.Costs {
	for _, m := range e.taskMocks(s.Task) {
		if m.cfg.Tokens != nil {
			_, est := m.tokens(s.ID)
			return runcue.Costs{"tokens": est}
		}
	}
	return nil
}

// taskMocks returns the mocks of a task type's services.
func (e *engine) taskMocks(task string) []*mock {
	var ms []*mock
	for _, s := range e.cfg.Workload.TaskServices[task] {
		ms = append(ms, e.mocks[s])
	}
	return ms
}

// call makes one run's call to the mocks ms: its arrival at each after
// the wire's delay from the handler-start instant start, the wait for the
// slowest answer (virtually: parked until the driver releases it), and
// its end. It returns the first failing answer and its mock, the answer as
// recorded, whether ctx ended the call first ("cut", unless it was a
// timeout), and the call's index at each mock.
//
// A successful answer of mocks that stream (Behavior.Stream) reaches the
// handler first at its first byte: firstByte (if not nil) is called then
// with the calls' indexes, before the wait for the last event.
func (e *engine) call(ctx context.Context, ms []*mock, id string, attempt int, start time.Time, firstByte func([]int)) (verdict, *mock, string, bool, []int) {
	lat, v, bad, idx := e.callMocks(ms, id, attempt, start)
	e.rec.runStarted(id, attempt, start)
	var end time.Time
	cut := false
	if fb := streamFirstByte(ms, id, attempt, lat); firstByte != nil && v == answerOK && fb > 0 {
		if end, cut = e.wait(ctx, id, attempt, start, fb, false); !cut {
			firstByte(idx)
		}
	}
	if !cut {
		end, cut = e.wait(ctx, id, attempt, start, lat, v == answerTimeout)
	}
	answer := v.String()
	if cut && v != answerTimeout {
		answer = "cut"
	}
	for i, m := range ms {
		m.leave(idx[i], end, v, m.cfg.Behavior.RetryAfter.D())
	}
	e.rec.runEnded(id, attempt, end, answer)
	return v, bad, answer, cut, idx
}

// streamFirstByte returns when, after its start, the first byte of an
// answer of latency lat (from the start) comes from mocks ms that stream
// (zero if none does): after the wire, at the largest of their Stream
// fractions of the answer's time at the mock.
func streamFirstByte(ms []*mock, id string, attempt int, lat time.Duration) time.Duration {
	f, wire := 0.0, time.Duration(0)
	for _, m := range ms {
		f, wire = max(f, m.cfg.Behavior.Stream), max(wire, m.wire(id, attempt))
	}
	if f == 0 {
		return 0
	}
	return wire + time.Duration(f*float64(max(lat-wire, 0)))
}

// callMocks records a call's arrival at each mock (its start plus the
// wire's delay to that mock) and returns the time from start to the
// slowest answer, the first failing answer and its service, and the
// calls' indexes.
func (e *engine) callMocks(ms []*mock, id string, attempt int, start time.Time, batch ...string) (time.Duration, verdict, *mock, []int) {
	var (
		lat time.Duration
		v   = answerOK
		bad *mock
		idx = make([]int, len(ms))
	)
	for i, m := range ms {
		wire := m.wire(id, attempt)
		at := start.Add(wire)
		l, a := m.decide(id, attempt, at)
		var hidden bool
		idx[i], hidden = m.arrive(id, attempt, at, batch...)
		if hidden {
			l, a = min(l, m.wire(id, attempt)), answerTooMany // refused at once
		}
		lat = max(lat, wire+l)
		if v == answerOK && a != answerOK {
			v, bad = a, m
		}
	}
	return lat, v, bad, idx
}

// answerErr is the error a handler returns for a mock's answer.
func answerErr(v verdict, m *mock) error {
	switch v {
	case answerOK:
		return nil
	case answerPermanent:
		return runcue.Permanent(fmt.Errorf("%s: 400 bad request", m.name))
	case answerTooMany:
		return runcue.RetryAfter(m.cfg.Behavior.RetryAfter.D(), fmt.Errorf("%s: 429 too many requests", m.name), m.name)
	case answerOutage:
		return fmt.Errorf("%s: 503 unavailable (outage)", m.name)
	}
	return fmt.Errorf("%s: 500 internal error", m.name)
}

// wait waits out a call: until lat after start (forever when hang) or ctx
// ends. It returns the end instant and whether ctx ended it.
func (e *engine) wait(ctx context.Context, id string, attempt int, start time.Time, lat time.Duration, hang bool) (time.Time, bool) {
	if e.fake != nil {
		p := &parked{at: start.Add(lat), key: fmt.Sprintf("%s#%d", id, attempt), release: make(chan struct{}), ctx: ctx}
		if hang {
			p.at = time.Unix(1<<40, 0)
		}
		e.park.add(p)
		select {
		case <-p.release:
			return e.clk.Now(), false
		case <-ctx.Done():
			e.park.remove(p)
			return e.clk.Now(), true
		}
	}
	if hang {
		<-ctx.Done()
		return e.clk.Now(), true
	}
	t := e.clk.NewTimer(time.Until(start.Add(lat)))
	defer t.Stop()
	select {
	case <-t.C():
		return e.clk.Now(), false
	case <-ctx.Done():
		return e.clk.Now(), true
	}
}

// parked is a virtual handler waiting for the driver, or for runcue to
// end its context (its timeout, a cancellation).
type parked struct {
	at      time.Time
	key     string
	release chan struct{}
	ctx     context.Context
}

// parking holds the parked handlers of a virtual run.
type parking struct {
	mu    sync.Mutex
	q     []*parked
	moved chan struct{} // a token when q changes
}

func (p *parking) add(x *parked) {
	p.mu.Lock()
	p.q = append(p.q, x)
	p.mu.Unlock()
	p.signal()
}

func (p *parking) remove(x *parked) {
	p.mu.Lock()
	if i := slices.Index(p.q, x); i >= 0 {
		p.q = slices.Delete(p.q, i, i+1)
	}
	p.mu.Unlock()
	p.signal()
}

func (p *parking) signal() {
	select {
	case p.moved <- struct{}{}:
	default:
	}
}

// first returns the parked handler to release first (earliest, then by
// key) and how many are parked. A handler whose context runcue has ended
// is on its way out, not parked: until it has read the clock (its call's
// end) and left, the driver must not move the clock. (Counted as parked,
// the clock once moved on before a timed-out handler, slow to be
// scheduled on a loaded machine, read it: its call ended 526 ms late.)
func (p *parking) first() (*parked, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var f *parked
	n := 0
	for _, x := range p.q {
		if x.ctx.Err() != nil {
			continue
		}
		n++
		if f == nil || x.at.Before(f.at) || (x.at.Equal(f.at) && x.key < f.key) {
			f = x
		}
	}
	return f, n
}

// take removes x from the queue, for release.
func (p *parking) take(x *parked) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.q, x); i >= 0 {
		p.q = slices.Delete(p.q, i, i+1)
	}
}

// record feeds the recorder every event of the database, from the first,
// through the durable subscription "runcue-sim" (catchUp waits on its
// head). closeAll stops it and closes the Cue; on an error the Cue is
// closed already.
func (e *engine) record(ctx context.Context) (closeAll func(), err error) {
	events, stopEvents, err := e.cue.Subscribe(ctx, runcue.SubscribeOptions{Name: "runcue-sim", After: 0, Buffer: 4096})
	if err != nil {
		e.cue.Close()
		return nil, err
	}
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for ev := range events {
			e.rec.event(ev)
		}
	}()
	return func() {
		stopEvents()
		e.cue.Close()
		<-collected
	}, nil
}

// submit submits a group at the clock's current time.
func (e *engine) submit(ctx context.Context, gr group) error {
	at := e.clk.Now()
	subs := gr.submissions()
	for i := range subs {
		subs[i].Cost = e.costs(subs[i])
	}
	_, err := e.cue.SubmitBatch(ctx, subs)
	if err != nil && !isCycle(err) && !isBackpressure(err) {
		return fmt.Errorf("submit group %s: %w", gr.pattern, err)
	}
	e.rec.submitted(gr, at, err)
	return nil
}

func isCycle(err error) bool        { return errors.Is(err, runcue.ErrCycle) }
func isBackpressure(err error) bool { return errors.Is(err, runcue.ErrBackpressure) }

// run runs the simulation to its end and returns its report.
func (e *engine) run(ctx context.Context) (*Report, error) {
	defer e.cleanup()
	e.wallStart = time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	closeAll, err := e.record(ctx)
	if err != nil {
		return nil, err
	}
	if err := e.cue.Start(ctx); err != nil {
		closeAll()
		return nil, err
	}
	if e.fake != nil {
		err = e.virtualLoop(ctx)
	} else {
		err = e.realLoop(ctx)
	}
	if err == nil {
		err = e.catchUp(ctx)
	}
	var rep *Report
	if err == nil {
		rep, err = e.report(ctx)
	}
	closeAll()
	return rep, err
}

// catchUp waits until the recorder has every event committed.
func (e *engine) catchUp(ctx context.Context) error {
	if _, err := e.cue.Settle(ctx); err != nil {
		return err
	}
	subs, err := e.cue.Subscriptions(ctx)
	if err != nil {
		return err
	}
	for _, s := range subs {
		if s.Name == "runcue-sim" {
			if !e.rec.waitSeq(ctx.Done(), s.Acked+s.Lag) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// virtualLoop drives the Cue on the fake clock. At each step it settles
// the Cue, waits until every running handler is parked, and then moves to
// the earliest of: the next parked handler's finish (released alone, ties
// by unit and attempt), the next submission, the Cue's next timer. Runs
// end one at a time and the clock moves only when the Cue is quiescent,
// so a seed gives one run.
func (e *engine) virtualLoop(ctx context.Context) error {
	subEnd := e.epoch.Add(e.cfg.Duration.D())
	hardEnd := subEnd.Add(e.cfg.Drain.D())
	for {
		running, err := e.cue.Settle(ctx)
		if err != nil {
			return err
		}
		first, n := e.park.first()
		if n < running {
			// A handler on its way to park, or one released on its way
			// out (Settle counts it until runcue has seen it return).
			select {
			case <-e.park.moved:
			case <-time.After(time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		now := e.clk.Now()
		arrival := e.epoch.Add(e.gen.peek())
		submitting := arrival.Before(subEnd)
		if !now.Before(subEnd) || !submitting {
			// Submission is over: done once every unit has ended.
			if err := e.catchUp(ctx); err != nil {
				return err
			}
			if e.rec.pending() == 0 {
				e.ended, e.endReason = now.Sub(e.epoch), "drained"
				return nil
			}
		}
		if !now.Before(hardEnd) {
			e.ended, e.endReason = now.Sub(e.epoch), "drain time out"
			return nil
		}
		next, ok := e.fake.NextDeadline()
		switch {
		case first != nil && !first.at.After(hardEnd) && (!submitting || !arrival.Before(first.at)) && (!ok || !next.Before(first.at)):
			e.park.take(first)
			if first.at.After(now) {
				e.fake.Set(first.at)
			}
			close(first.release)
		case submitting && (!ok || !next.Before(arrival)):
			if arrival.After(now) {
				e.fake.Set(arrival)
			}
			for e.epoch.Add(e.gen.peek()).Equal(arrival) {
				if err := e.submit(ctx, e.gen.pop()); err != nil {
					return err
				}
			}
		case ok && next.Before(hardEnd):
			e.fake.Set(next)
		default:
			e.fake.Set(hardEnd)
		}
	}
}

// realLoop submits the workload in real time until the duration is over,
// then waits for the work to end (or the drain time).
func (e *engine) realLoop(ctx context.Context) error {
	subEnd := e.epoch.Add(e.cfg.Duration.D())
	hardEnd := subEnd.Add(e.cfg.Drain.D())
	for {
		now := e.clk.Now()
		if !now.Before(hardEnd) {
			e.ended, e.endReason = now.Sub(e.epoch), "drain time out"
			return nil
		}
		if !now.Before(subEnd) && e.rec.pending() == 0 {
			e.ended, e.endReason = now.Sub(e.epoch), "drained"
			return nil
		}
		if now.Before(subEnd) {
			for e.gen.peek() <= now.Sub(e.epoch) {
				gr := e.gen.pop()
				if e.paused.Load() {
					continue
				}
				if err := e.submit(ctx, gr); err != nil {
					return err
				}
			}
		}
		wait := min(e.gen.peek()-now.Sub(e.epoch), subEnd.Sub(now), 100*time.Millisecond)
		t := time.NewTimer(max(0, wait))
		select {
		case <-t.C:
		case <-e.stop:
			t.Stop()
			e.ended, e.endReason = e.clk.Now().Sub(e.epoch), "stopped"
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
