package engine

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue/store"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Telemetry: OpenTelemetry metrics and traces.
//
// Metrics (meter "github.com/runcue/runcue"); their attributes are the task
// type, the service (a keyed service's class, never its key) and the
// outcome, never unit IDs or parameters:
//
//	runcue.work.queued          gauge      units queued in the owner (waiting, blocked and ready; stored ones not yet loaded included)
//	runcue.work.unloaded        gauge      queued units of a deep queue the owner has not loaded yet (Config.LoadAhead)
//	runcue.work.completed       counter    {task}
//	runcue.work.skipped         counter    {task} units ended with Skip
//	runcue.work.failed          counter    {task, outcome: error, timeout, panic, cancelled, ...} failed runs, retried or not
//	runcue.work.queue_wait      histogram  seconds from eligible to started {task}
//	runcue.work.run_duration    histogram  seconds {task, outcome}
//	runcue.service.requests     counter    dispatches {service}
//	runcue.service.rate_limited counter    dispatches held back by a full rate window {service}
//	runcue.service.budget_used  gauge      requests of the current calendar period {service, period}; refreshed at most once a second
//	runcue.service.budget_spent gauge      services (or keyed instances) whose budget is spent {service, period}
//	runcue.service.budget_exhausted counter budgets spent, once per period {service, period}
//	runcue.subscription.gaps    counter    durable subscriptions resumed past deleted events {subscription}
//	runcue.service.limit_effective gauge   an adaptive limit in force {service, limit: concurrency, requests or a meter's amount}; a keyed class's lowest
//	runcue.circuit.open         gauge      open (or half-open) circuits {service}
//	runcue.callback.duration    histogram  seconds per priority or dependency callback call {outcome: priority, dependency}
//	runcue.callback.errors      counter    callback calls that failed {callback: priority, dependency, service_keys; reason: panic, nan, out_of_range, timeout, error}
//	runcue.store.transactions   counter    transactions the Cue's writer committed (each holds the ops waiting when it began)
//	runcue.store.write_time     counter    seconds the Cue's writer spent in store transactions: it runs one at a time, so the
//	                                       rate of this counter is the share of time it was busy; near 1, the store's write
//	                                       path (its round trips and statements) bounds the Cue's throughput
//	runcue.store.outages        counter    outages of the store: its writes began to fail with transient errors (retried)
//	runcue.store.unavailable    gauge      1 while the store's writes fail with transient errors, else 0
//	runcue.ownership.changes    counter    {change: taken, lost} this Cue took or lost ownership
//
// Traces (tracer "github.com/runcue/runcue"): one span per run,
// "runcue.run <task>", the child of the span that was current when the unit
// was submitted. The submitter's trace context is stored with the unit (W3C
// Trace Context), so a run after a restart, or in another process, still
// joins the submitter's trace. The handler's context carries the span.
// Spans are made when Config.TracerProvider is set or the application has
// set a global provider (otel.SetTracerProvider); otherwise none is made,
// and the handler's context carries the submitter's trace context alone.

const instrumentationName = "github.com/runcue/runcue"

type Telemetry struct {
	tracer trace.Tracer

	completed, skipped, failed, requests, rateLimited metric.Int64Counter
	queueWait, runDuration, callbackDur               metric.Float64Histogram
	callbackErrs, budgetExhausted, subscriptionGaps   metric.Int64Counter
	outages, ownership                                metric.Int64Counter
	// Unavailable reports whether the store is in an outage (set by the
	// Cue before the first collection).
	Unavailable func() bool

	// read by the gauges' callback
	queued      func() (queued, unloaded int64, ok bool)
	writes      func() (transactions int64, busy time.Duration)
	openCircuit atomic.Pointer[map[string]int64]
	budgets     atomic.Pointer[[]budgetUsage]
	adaptive    atomic.Pointer[map[[2]string]int64] // effective limits by class and limit
	reg         metric.Registration
	// explicitTP: Config.TracerProvider was set. Otherwise spans are made
	// only once the application has set a global provider (see tracing).
	explicitTP bool
}

// defaultTP is the global tracer provider before any is set: otel's
// delegate, which makes spans that go nowhere.
var defaultTP = otel.GetTracerProvider()

// tracing reports whether runs get spans: a provider was given, or the
// global one was set. Without either a span would cost allocations per
// run for nothing.
func (t *Telemetry) tracing() bool {
	return t.explicitTP || otel.GetTracerProvider() != defaultTP
}

var durationBuckets = metric.WithExplicitBucketBoundaries(
	0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

// NewTelemetry makes the metrics and the tracer; queued reports the
// owner's queue (ok false when this Cue does not own it), writes its
// writer's transactions and busy time.
func NewTelemetry(mp metric.MeterProvider, tp trace.TracerProvider, queued func() (queued, unloaded int64, ok bool),
	writes func() (transactions int64, busy time.Duration)) (*Telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	explicit := tp != nil
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(instrumentationName)
	t := &Telemetry{tracer: tp.Tracer(instrumentationName), queued: queued, writes: writes, explicitTP: explicit}
	empty := map[string]int64{}
	t.openCircuit.Store(&empty)
	var err error
	counter := func(name, desc string) metric.Int64Counter {
		var c metric.Int64Counter
		if err == nil {
			c, err = m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{unit}"))
		}
		return c
	}
	hist := func(name, desc string) metric.Float64Histogram {
		var h metric.Float64Histogram
		if err == nil {
			h, err = m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"), durationBuckets)
		}
		return h
	}
	t.completed = counter("runcue.work.completed", "Work units completed.")
	t.skipped = counter("runcue.work.skipped", "Work units ended as skipped.")
	t.failed = counter("runcue.work.failed", "Failed runs, retried or not.")
	t.requests = counter("runcue.service.requests", "Dispatches to a service.")
	t.outages = counter("runcue.store.outages", "Outages of the store: its writes began to fail with transient errors.")
	t.ownership = counter("runcue.ownership.changes", "This Cue took or lost ownership of the database.")
	t.rateLimited = counter("runcue.service.rate_limited", "Dispatches held back by a full rate window.")
	t.queueWait = hist("runcue.work.queue_wait", "Time from a unit becoming eligible to its start.")
	t.runDuration = hist("runcue.work.run_duration", "Duration of runs.")
	t.callbackDur = hist("runcue.callback.duration", "Duration of priority and dependency callback calls.")
	t.budgetExhausted = counter("runcue.service.budget_exhausted", "Calendar budgets spent, once per period.")
	t.subscriptionGaps = counter("runcue.subscription.gaps", "Durable subscriptions resumed after events retention deleted.")
	t.callbackErrs = counter("runcue.callback.errors", "Callback calls that panicked, timed out or returned an invalid value.")
	if err != nil {
		return nil, err
	}
	queuedGauge, err := m.Int64ObservableGauge("runcue.work.queued", metric.WithDescription("Work units queued in the owning Cue."),
		metric.WithUnit("{unit}"))
	if err != nil {
		return nil, err
	}
	unloadedGauge, err := m.Int64ObservableGauge("runcue.work.unloaded",
		metric.WithDescription("Queued work units the owning Cue has not loaded yet: a deep queue loads as dispatch makes room."),
		metric.WithUnit("{unit}"))
	if err != nil {
		return nil, err
	}
	openGauge, err := m.Int64ObservableGauge("runcue.circuit.open", metric.WithDescription("Open or half-open circuits."),
		metric.WithUnit("{circuit}"))
	if err != nil {
		return nil, err
	}
	usedGauge, err := m.Int64ObservableGauge("runcue.service.budget_used",
		metric.WithDescription("Requests counted in the current calendar period of a service's budget."), metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	spentGauge, err := m.Int64ObservableGauge("runcue.service.budget_spent",
		metric.WithDescription("Services (or keyed instances) whose calendar budget is spent."), metric.WithUnit("{service}"))
	if err != nil {
		return nil, err
	}
	effGauge, err := m.Int64ObservableGauge("runcue.service.limit_effective",
		metric.WithDescription("An adaptive limit in force, below or at its configured value."), metric.WithUnit("{limit}"))
	if err != nil {
		return nil, err
	}
	txCounter, err := m.Int64ObservableCounter("runcue.store.transactions",
		metric.WithDescription("Transactions the Cue's writer committed."), metric.WithUnit("{transaction}"))
	if err != nil {
		return nil, err
	}
	writeTime, err := m.Float64ObservableCounter("runcue.store.write_time",
		metric.WithDescription("Time the Cue's writer spent in store transactions, one at a time: its rate is the writer's busy share."),
		metric.WithUnit("s"))
	if err != nil {
		return nil, err
	}
	unavailable, err := m.Int64ObservableGauge("runcue.store.unavailable",
		metric.WithDescription("1 while the store's writes fail with transient errors (the Cue retries them), else 0."))
	if err != nil {
		return nil, err
	}
	t.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if t.Unavailable != nil {
			v := int64(0)
			if t.Unavailable() {
				v = 1
			}
			o.ObserveInt64(unavailable, v)
		}
		if t.writes != nil {
			n, busy := t.writes()
			o.ObserveInt64(txCounter, n)
			o.ObserveFloat64(writeTime, busy.Seconds())
		}
		if n, unloaded, ok := t.queued(); ok {
			o.ObserveInt64(queuedGauge, n)
			o.ObserveInt64(unloadedGauge, unloaded)
			for svc, n := range *t.openCircuit.Load() {
				o.ObserveInt64(openGauge, n, metric.WithAttributes(attribute.String("service", svc)))
			}
			if bs := t.budgets.Load(); bs != nil {
				for _, b := range *bs {
					attrs := metric.WithAttributes(attribute.String("service", b.class), attribute.String("period", b.period))
					o.ObserveInt64(usedGauge, b.used, attrs)
					o.ObserveInt64(spentGauge, b.spent, attrs)
				}
			}
			if g := t.adaptive.Load(); g != nil {
				for k, v := range *g {
					o.ObserveInt64(effGauge, v, metric.WithAttributes(attribute.String("service", k[0]), attribute.String("limit", k[1])))
				}
			}
		}
		return nil
	}, queuedGauge, unloadedGauge, openGauge, usedGauge, spentGauge, effGauge, txCounter, writeTime, unavailable)
	return t, err
}

// Outage counts an outage of the store (runcue.store.outages).
func (t *Telemetry) Outage() { t.outages.Add(context.Background(), 1) }

// OwnershipChanged counts a change of ownership, "taken" or "lost"
// (runcue.ownership.changes).
func (t *Telemetry) OwnershipChanged(change string) {
	t.ownership.Add(context.Background(), 1, metric.WithAttributes(attribute.String("change", change)))
}

func (t *Telemetry) Close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// metricOpts is one set of metric attributes as the option lists the
// instruments take, built once: passing a single option to a variadic
// Record or Add would allocate its list at every call.
type metricOpts struct {
	rec []metric.RecordOption
	add []metric.AddOption
}

func optsOf(o metric.MeasurementOption) metricOpts {
	return metricOpts{rec: []metric.RecordOption{o}, add: []metric.AddOption{o}}
}

func taskAttr(task string) metricOpts {
	return optsOf(metric.WithAttributes(attribute.String("task", task)))
}

func taskOutcome(task, outcome string) metricOpts {
	return optsOf(metric.WithAttributes(attribute.String("task", task), attribute.String("outcome", outcome)))
}

var bg = context.Background()

func seconds(d time.Duration) float64 { return d.Seconds() }

// traceCarrier returns ctx's trace context, encoded for storing with a unit,
// or nil if ctx carries no span.
func TraceCarrier(ctx context.Context) []byte {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	b, _ := json.Marshal(carrier)
	return b
}

// startSpan starts the span of a run, as a child of the submitter's span
// when the unit carries one.
func (t *Telemetry) startSpan(ctx context.Context, stored []byte, task, id string, attempt int) (context.Context, trace.Span) {
	if len(stored) > 0 {
		var carrier propagation.MapCarrier
		if json.Unmarshal(stored, &carrier) == nil {
			ctx = propagation.TraceContext{}.Extract(ctx, carrier)
		}
	}
	if !t.tracing() {
		return ctx, nil // the submitter's trace context still reaches the handler
	}
	return t.tracer.Start(ctx, "runcue.run "+task, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("runcue.task", task), attribute.String("runcue.work_id", id),
			attribute.Int("runcue.attempt", attempt)))
}

// endSpan ends a run's span with its outcome.
func endSpan(span trace.Span, outcome string, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("runcue.outcome", outcome))
	if err != nil && outcome != "completed" && outcome != "skipped" {
		span.RecordError(err)
		span.SetStatus(codes.Error, outcome)
	}
	span.End()
}

// CountGap counts a durable subscription that resumed past deleted events.
func (t *Telemetry) CountGap(subscription string) {
	t.subscriptionGaps.Add(bg, 1, metric.WithAttributes(attribute.String("subscription", subscription)))
}

// record reports a run's outcome to metrics, its span and the log.
func (d *Engine) record(r *run, fin *store.Finish, err error, end time.Time) {
	outcome := fin.Attempt.Outcome
	if outcome == "" {
		outcome = "abandoned" // the claim was refused: nothing ran for the record
	}
	tel, log := d.tel, d.log
	rt := r.lane.task
	id, task := r.u.id, r.u.task
	tel.runDuration.Record(bg, seconds(end.Sub(r.start)), rt.outcomeAttrs(outcome).rec...)
	switch outcome {
	case "completed":
		tel.completed.Add(bg, 1, rt.attrs.add...)
		if log.Enabled(bg, slog.LevelDebug) {
			log.Debug("work_completed", "work_unit_id", id, "task_type", task, "attempt", r.no, "duration", end.Sub(r.start))
		}
	case "skipped":
		tel.skipped.Add(bg, 1, rt.attrs.add...)
		if log.Enabled(bg, slog.LevelDebug) {
			log.Debug("work_skipped", "work_unit_id", id, "task_type", task, "attempt", r.no, "reason", fin.Error)
		}
	case "failed", "timeout", "panic":
		// A failure that will be retried is routine (Debug); a unit that
		// fails for good is worth an operator's look (Warn).
		tel.failed.Add(bg, 1, rt.outcomeAttrs(outcome).add...)
		willRetry := fin.State == store.Queued
		level := slog.LevelWarn
		if willRetry {
			level = slog.LevelDebug
		}
		if !log.Enabled(bg, level) {
			break
		}
		errText := fin.Error
		if outcome == "panic" {
			errText = firstLine(errText) // the stack is in the unit's history
		}
		log.Log(bg, level, "work_failed", "work_unit_id", id, "task_type", task, "attempt", r.no,
			"error", errText, "error_kind", fin.ErrorKind, "will_retry", willRetry)
	case "deferred":
		// A 429 or 503 with a Retry-After: the service asked, runcue waits.
		if log.Enabled(bg, slog.LevelDebug) {
			log.Debug("work_deferred", "work_unit_id", id, "task_type", task, "attempt", r.no, "error", fin.Error)
		}
	case "cancelled", "interrupted":
		log.Info("work_"+outcome, "work_unit_id", id, "task_type", task, "attempt", r.no)
	}
	endSpan(r.span, outcome, err)
}

func firstLine(s string) string {
	for i := range len(s) {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}
