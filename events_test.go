package runcue_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/sse"
)

// TestEventTypes provokes the event types that other tests do not, and
// checks their documented fields.
func TestEventTypes(t *testing.T) {
	e := newEnv(t, runcue.Config{QueueStatusInterval: 5 * time.Second})
	progressed := make(chan struct{})
	require.NoError(t, e.c.Task("report", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		require.NoError(t, w.Progress(map[string]int{"page": 3, "of": 12}))
		<-progressed
		return nil, nil
	}}))
	g := newGate()
	require.NoError(t, e.c.Task("wait", runcue.Task{Handler: g.handler}))
	rec := record(t, e.c)
	e.start()
	id := e.submit("report")
	ev := rec.waitFor(t, 1, ofType(runcue.EventWorkProgress, id))[0]
	assert.JSONEq(t, `{"page":3,"of":12}`, string(ev.Progress))
	assert.Equal(t, "report", ev.Task)
	assert.Equal(t, 1, ev.Attempt)
	assert.Zero(t, ev.Seq, "progress is not durable")
	close(progressed)
	e.wait(id)

	e.submit("wait")
	e.submit("wait", func(s *runcue.Submission) { s.RunAt = epoch.Add(time.Hour) })
	g.next(t)
	e.clk.Advance(5 * time.Second)
	qs := rec.waitFor(t, 1, ofType(runcue.EventQueueStatus, ""))[0]
	require.NotNil(t, qs.Queue)
	assert.Equal(t, runcue.QueueStatus{Waiting: 1, Running: 1}, *qs.Queue)
	assert.Zero(t, qs.Seq)
	close(g.release)

	// Every event has a type and a time; work events a unit and task.
	for _, ev := range rec.all() {
		assert.NotEmpty(t, ev.Type)
		assert.False(t, ev.Time.IsZero(), "%s has a time", ev.Type)
		if strings.HasPrefix(string(ev.Type), "work_") {
			assert.NotEmpty(t, ev.WorkID, ev.Type)
			assert.NotEmpty(t, ev.Task, ev.Type)
		}
	}
}

func TestProgressThrottling(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	done := make(chan struct{})
	reported := make(chan struct{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		for i := range 1000 {
			require.NoError(t, w.Progress(i))
		}
		close(reported)
		<-done
		return nil, nil
	}}))
	rec := record(t, e.c)
	e.start()
	id := e.submit("t")
	<-reported
	e.settle()
	e.clk.Advance(time.Second) // a second event is allowed now, with the latest value
	e.settle()
	// The final value arrives: in a second event, or already in the first if
	// the dispatcher emitted it after the handler's last report.
	rec.waitFor(t, 1, func(ev runcue.Event) bool {
		return ev.Type == runcue.EventWorkProgress && ev.WorkID == id && string(ev.Progress) == "999"
	})
	close(done)
	e.wait(id)
	e.clk.Advance(time.Second)
	e.settle()
	var evs []runcue.Event
	for _, ev := range rec.all() {
		if ev.Type == runcue.EventWorkProgress {
			evs = append(evs, ev)
		}
	}
	require.NotEmpty(t, evs)
	assert.LessOrEqual(t, len(evs), 2, "1,000 reports in one second: at most 2 events")
	assert.Equal(t, "999", string(evs[len(evs)-1].Progress), "the last carries the final value")
	if len(evs) == 2 {
		assert.GreaterOrEqual(t, evs[1].Time.Sub(evs[0].Time), time.Second, "a second apart")
	}
}

// TestStalledSubscriber: a subscriber that reads nothing while 100,000 units
// complete, then reads, receives every durable event in order. Its sends
// block (a hook) until the work is done: the dispatcher never waited for it.
func TestStalledSubscriber(t *testing.T) {
	n := 100_000
	if testing.Short() || raceEnabled {
		n = 10_000
	}
	e := newEnv(t, runcue.Config{Logger: quietLogger})
	e.ctx = longContext(t)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	release := runcue.StallSubscribers(e.c)
	defer release()
	evs, cancel, err := e.c.Subscribe(e.ctx, runcue.SubscribeOptions{After: runcue.SeqNow, Buffer: 1})
	require.NoError(t, err)
	defer cancel()
	e.start()
	for left := n; left > 0; left -= 5000 {
		subs := batchOf("t", min(left, 5000))
		_, err := e.c.SubmitBatch(e.ctx, subs)
		require.NoError(t, err)
	}
	require.NoError(t, e.c.Drain(e.ctx), "all units finish while the subscriber is stalled")
	release()
	var last int64
	counts := map[runcue.EventType]int{}
	for counts[runcue.EventWorkCompleted] < n {
		ev := <-evs
		if ev.Seq == 0 {
			continue // not durable
		}
		require.Equal(t, last+1, ev.Seq, "in order, without gaps or duplicates")
		last = ev.Seq
		counts[ev.Type]++
	}
	assert.Equal(t, n, counts[runcue.EventWorkQueued])
	assert.Equal(t, n, counts[runcue.EventWorkStarted])
}

func TestEventRetentionGap(t *testing.T) {
	e := newEnv(t, runcue.Config{EventRetention: time.Hour})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	e.start()
	for range 3 {
		e.wait(e.submit("t"))
	}
	e.clk.Advance(2 * time.Hour) // the next retention pass removes them
	fresh := e.submit("t")
	e.wait(fresh)
	e.settle() // the pass the clock made due, committed
	evs, cancel, err := e.c.Subscribe(e.ctx, runcue.SubscribeOptions{After: 0})
	require.NoError(t, err)
	defer cancel()
	gap := <-evs
	assert.Equal(t, runcue.EventGap, gap.Type)
	assert.Equal(t, int64(1), gap.MissedFrom)
	assert.Equal(t, int64(9), gap.MissedTo, "3 units x 3 events")
	next := <-evs
	assert.Equal(t, int64(10), next.Seq, "then the events still retained")
	assert.Equal(t, fresh, next.WorkID)
	// A cursor within retention gets no gap.
	evs2, cancel2, err := e.c.Subscribe(e.ctx, runcue.SubscribeOptions{After: 10})
	require.NoError(t, err)
	defer cancel2()
	ev := <-evs2
	for ev.Seq == 0 { // a live-only event (queue_status) may come between
		ev = <-evs2
	}
	assert.Equal(t, int64(11), ev.Seq)
}

func TestSubscribeFilters(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("a", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Task("b", runcue.Task{Handler: noop}))
	e.start()
	ida := e.submit("a")
	idb := e.submit("b")
	e.wait(ida)
	e.wait(idb)
	evs, cancel, err := e.c.Subscribe(e.ctx, runcue.SubscribeOptions{After: 0, Types: []runcue.EventType{runcue.EventWorkCompleted}})
	require.NoError(t, err)
	defer cancel()
	// The two ran side by side: either may have completed first.
	assert.ElementsMatch(t, []string{ida, idb}, []string{(<-evs).WorkID, (<-evs).WorkID})
	evs2, cancel2, err := e.c.Subscribe(e.ctx, runcue.SubscribeOptions{After: 0, Tasks: []string{"b"}})
	require.NoError(t, err)
	defer cancel2()
	for _, want := range []runcue.EventType{runcue.EventWorkQueued, runcue.EventWorkStarted, runcue.EventWorkCompleted} {
		ev := <-evs2
		assert.Equal(t, want, ev.Type)
		assert.Equal(t, idb, ev.WorkID)
	}
}

// TestSSE streams over a real HTTP connection, disconnects mid-stream and
// reconnects with Last-Event-ID: nothing is lost or repeated.
func TestSSE(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	srv := httptest.NewServer(sse.Handler(e.c, sse.Options{KeepAlive: 20 * time.Millisecond}))
	defer srv.Close()
	e.start()
	const n = 40
	for range n {
		e.submit("t")
	}
	require.NoError(t, e.c.Drain(e.ctx))

	type sseEvent struct {
		id    int64
		typ   string
		event runcue.Event
	}
	read := func(lastID string, query string, stopAfter int) ([]sseEvent, bool) {
		ctx, cancel := context.WithCancel(e.ctx)
		defer cancel() // disconnect
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/?"+query, nil)
		require.NoError(t, err)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		sc := bufio.NewScanner(resp.Body)
		var out []sseEvent
		var cur sseEvent
		sawKeepAlive := false
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				cur.id, _ = strconv.ParseInt(line[4:], 10, 64)
			case strings.HasPrefix(line, "event: "):
				cur.typ = line[7:]
			case strings.HasPrefix(line, "data: "):
				require.NoError(t, json.Unmarshal([]byte(line[6:]), &cur.event))
			case strings.HasPrefix(line, ": keep-alive"):
				sawKeepAlive = true
				if stopAfter < 0 {
					return out, true // idle: a keep-alive came instead of an event
				}
			case line == "" && cur.typ != "":
				out = append(out, cur)
				cur = sseEvent{}
				if len(out) == stopAfter {
					return out, sawKeepAlive
				}
			}
		}
		return out, sawKeepAlive
	}
	first, _ := read("", "after=0", 50)
	require.Len(t, first, 50)
	last := first[len(first)-1].id
	rest, _ := read(strconv.FormatInt(last, 10), "", 3*n-50)
	all := append(first, rest...)
	require.Len(t, all, 3*n)
	for i, ev := range all {
		assert.Equal(t, int64(i+1), ev.id, "no gap, no duplicate across the reconnection")
		assert.Equal(t, string(ev.event.Type), ev.typ)
		assert.Equal(t, ev.id, ev.event.Seq)
	}
	// Filters from the query string, and keep-alives while idle.
	completed, keepAlive := read("", "after=0&type=work_completed&task=t", n)
	require.Len(t, completed, n)
	for _, ev := range completed {
		assert.Equal(t, "work_completed", ev.typ)
	}
	_ = keepAlive
	idle, sawKeepAlive := read(strconv.FormatInt(int64(3*n), 10), "", -1)
	_ = idle
	assert.True(t, sawKeepAlive || len(idle) == 0)
	// A bad Last-Event-ID is refused.
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Last-Event-ID", "x")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

// TestSSEKeepAliveAndClose: an idle stream gets keep-alive comments and
// ends when the client goes away.
func TestSSEKeepAliveAndClose(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	srv := httptest.NewServer(sse.Handler(e.c, sse.Options{KeepAlive: 10 * time.Millisecond}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(e.ctx)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == ": keep-alive" {
			break
		}
	}
	cancel()
	resp.Body.Close()
	srv.Close() // waits for the handler to return: the subscription ended
}

func TestMetricsAndSpans(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer mp.Shutdown(context.Background())
	defer tp.Shutdown(context.Background())
	cfg := runcue.Config{MeterProvider: mp, TracerProvider: tp}
	e := newEnv(t, cfg)
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Service("host", runcue.Service{MaxConcurrent: 2, CircuitThreshold: 1, CircuitTimeout: time.Hour}))
		require.NoError(t, c.Task("fetch", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
			ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} },
			Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
				if w.Target == "down.example" {
					return nil, errors.New("connection refused")
				}
				return "ok", nil
			}}))
	}
	register(e.c)

	// Submitted inside a span, before any owner runs; run after a restart.
	tracer := tp.Tracer("test")
	ctx, parent := tracer.Start(e.ctx, "upload request")
	okID, err := e.c.Submit(ctx, runcue.Submission{Task: "fetch", Target: "up.example"})
	require.NoError(t, err)
	badID, err := e.c.Submit(ctx, runcue.Submission{Task: "fetch", Target: "down.example"})
	require.NoError(t, err)
	parent.End()
	require.NoError(t, e.c.Close())
	c := e.open(cfg)
	register(c)
	require.NoError(t, c.Start(e.ctx))
	for _, id := range []string{okID.ID, badID.ID} {
		_, err := c.Wait(e.ctx, id)
		require.NoError(t, err)
	}
	require.NoError(t, runcue.Settle(e.ctx, c))

	var runs []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "runcue.run fetch" {
			runs = append(runs, s)
		}
	}
	require.Len(t, runs, 2)
	for _, s := range runs {
		assert.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID(), "the run joins the submitter's trace, after a restart")
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
	}

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(e.ctx, &rm))
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	sum := func(name string, want map[string]string) int64 {
		m, ok := got[name]
		require.True(t, ok, "metric %s", name)
		var total int64
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range data.DataPoints {
				if matches(dp.Attributes, want) {
					total += dp.Value
				}
			}
		case metricdata.Gauge[int64]:
			for _, dp := range data.DataPoints {
				if matches(dp.Attributes, want) {
					total += dp.Value
				}
			}
		case metricdata.Histogram[float64]:
			for _, dp := range data.DataPoints {
				if matches(dp.Attributes, want) {
					total += int64(dp.Count)
				}
			}
		}
		return total
	}
	assert.Equal(t, int64(1), sum("runcue.work.completed", map[string]string{"task": "fetch"}))
	assert.Equal(t, int64(1), sum("runcue.work.failed", map[string]string{"task": "fetch", "outcome": "failed"}))
	assert.Equal(t, int64(2), sum("runcue.service.requests", map[string]string{"service": "host"}), "by class, never by key")
	assert.Equal(t, int64(1), sum("runcue.circuit.open", map[string]string{"service": "host"}), "down.example's circuit")
	assert.Equal(t, int64(2), sum("runcue.work.run_duration", map[string]string{"task": "fetch"}))
	assert.Equal(t, int64(2), sum("runcue.work.queue_wait", map[string]string{"task": "fetch"}))
	assert.Zero(t, sum("runcue.work.queued", nil))
	for name, m := range got {
		forEachAttrs(m, func(set attribute.Set) {
			for _, kv := range set.ToSlice() {
				assert.Contains(t, []string{"task", "service", "outcome", "change"}, string(kv.Key), "%s has only low-cardinality attributes", name)
			}
		})
	}
}

func matches(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		if got, ok := set.Value(attribute.Key(k)); !ok || got.AsString() != v {
			return false
		}
	}
	return true
}

func forEachAttrs(m metricdata.Metrics, f func(attribute.Set)) {
	switch data := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range data.DataPoints {
			f(dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range data.DataPoints {
			f(dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range data.DataPoints {
			f(dp.Attributes)
		}
	}
}

func TestLogging(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			if w.Target == "bad" {
				return nil, errors.New("upstream said no")
			}
			return "SECRET-RESULT", nil
		}}))
	e.start()
	e.wait(e.submit("t", func(s *runcue.Submission) { s.Params = map[string]string{"token": "SECRET-PARAM"} }))
	e.wait(e.submit("t", func(s *runcue.Submission) { s.Target = "bad" }))
	logs := e.logs.String()
	assert.Contains(t, logs, "msg=work_started")
	assert.Contains(t, logs, "task_type=t")
	assert.Contains(t, logs, "work_unit_id=")
	assert.Contains(t, logs, `msg=work_failed`)
	assert.Contains(t, logs, `error="upstream said no"`)
	assert.Contains(t, logs, "will_retry=false")
	assert.NotContains(t, logs, "SECRET", "params and results are never logged")
}

var _ = atomic.Int32{}

// TestTraceContextWithoutProvider: with no TracerProvider in the Config and
// no global provider set, runcue makes no spans of its own, and the
// handler's context still carries the submitter's trace.
func TestTraceContextWithoutProvider(t *testing.T) {
	tp := sdktrace.NewTracerProvider() // the submitter's, not runcue's
	defer tp.Shutdown(context.Background())
	e := newEnv(t, runcue.Config{})
	got := make(chan trace.SpanContext, 1)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		got <- trace.SpanContextFromContext(ctx)
		return nil, nil
	}}))
	e.start()
	ctx, span := tp.Tracer("app").Start(e.ctx, "submit")
	_, err := e.c.Submit(ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	span.End()
	sc := <-got
	assert.Equal(t, span.SpanContext().TraceID(), sc.TraceID(), "the handler is in the submitter's trace")
	assert.Equal(t, span.SpanContext().SpanID(), sc.SpanID(), "no span of runcue's between them")
}
