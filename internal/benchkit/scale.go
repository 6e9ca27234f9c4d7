package benchkit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/runcue/runcue"
)

// Scale measurements: a database filled with queued units before a Cue
// opens it, and what a fresh process does with it. Peak RSS is a property
// of a process, so the caller runs StartDeep in a process of its own (see
// cmd/runcue-bench -scale).

// Prefill writes n queued no-op units of task "noop" (each with params of
// paramBytes bytes) to a new database at path, submitted in batches of
// 1,000 by a Cue that never starts, and closes it.
func Prefill(path string, n, paramBytes int) error {
	removeDB(path) // a template left by an earlier run in the same -dir would be added to
	c, err := runcue.Open(path, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if err := c.Task("noop", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}); err != nil {
		c.Close()
		return err
	}
	params := []byte(`{"p":"` + strings.Repeat("x", max(0, paramBytes-8)) + `"}`)
	if err := submitNoops(context.Background(), c, n, params); err != nil {
		c.Close()
		return err
	}
	return c.Close()
}

// submitNoops submits n units of task "noop" with params, in batches of
// 1,000, each with its own target ("t-<i>").
func submitNoops(ctx context.Context, c *runcue.Cue, n int, params []byte) error {
	for left := n; left > 0; left -= 1000 {
		subs := make([]runcue.Submission, min(left, 1000))
		for i := range subs {
			subs[i] = runcue.Submission{Task: "noop", Params: params, Target: "t-" + strconv.Itoa(n-left+i)}
		}
		if _, err := c.SubmitBatch(ctx, subs); err != nil {
			return err
		}
	}
	return nil
}

// CopyDB copies the database at src (and its WAL, if any) to dst.
func CopyDB(src, dst string) error {
	for _, suffix := range []string{"", "-wal"} {
		in, err := os.Open(src + suffix)
		if os.IsNotExist(err) && suffix != "" {
			continue
		}
		if err != nil {
			return err
		}
		out, err := os.OpenFile(dst+suffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			in.Close()
			return err
		}
		_, err = io.Copy(out, in)
		in.Close()
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// DeepOptions describe a StartDeep run.
type DeepOptions struct {
	// Dispatches is how many handler starts are measured.
	Dispatches int
	// Priority, if set, is the Cue's priority function.
	Priority runcue.PriorityFunc
	// MaxConcurrent is the Cue's handler cap. Default 100.
	MaxConcurrent int
	// HoldUntilLoaded, instead of measuring the rate, holds the first
	// handlers until the Cue's load of the Queued units stops: every unit
	// is in memory, or the Cue holds LoadAhead queued units and waits for
	// dispatch to make room (read from its runcue.work.queued and
	// runcue.work.unloaded gauges). PeakRSS is then that of the queue as
	// the Cue holds it, and Loaded the time the load took.
	HoldUntilLoaded bool
	Queued          int
	// LoadAhead is the Cue's Config.LoadAhead.
	LoadAhead int
}

// DeepResult is what StartDeep measured.
type DeepResult struct {
	// FirstCall is the time from Open to the first handler call.
	FirstCall time.Duration
	// Rate is handler starts per second from the first call to the
	// Dispatches-th.
	Rate float64
	// AllocBytes and Allocs are the heap allocations per dispatched unit
	// over the measured dispatches.
	AllocBytes, Allocs float64
	// PeakRSS is the process's peak resident set (VmHWM) when the run
	// ends.
	PeakRSS uint64
	// Loaded is the time from Open until the load stopped (HoldUntilLoaded);
	// Held is how many queued units were in memory then.
	Loaded time.Duration
	Held   int64
}

// StartDeep opens the pre-filled database at path with a no-op handler for
// task "noop", starts it, and measures the time to the first handler call
// and the rate of the first opts.Dispatches calls. Run it in a fresh
// process: PeakRSS is the process's.
func StartDeep(path string, opts DeepOptions) (DeepResult, error) {
	if opts.MaxConcurrent == 0 {
		opts.MaxConcurrent = 100
	}
	var res DeepResult
	var started atomic.Int64
	first := make(chan time.Time, 1)
	last := make(chan time.Time, 1)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	hold := make(chan struct{})
	if !opts.HoldUntilLoaded {
		close(hold)
	}
	t0 := time.Now()
	c, err := runcue.Open(path, runcue.Config{Logger: slog.New(slog.DiscardHandler), MaxConcurrent: opts.MaxConcurrent,
		Priority: opts.Priority, MeterProvider: mp, LoadAhead: opts.LoadAhead})
	if err != nil {
		return res, err
	}
	defer c.Close()
	handler := func(context.Context, *runcue.Work) (any, error) {
		<-hold
		switch n := started.Add(1); {
		case n == 1:
			first <- time.Now()
		case n == int64(opts.Dispatches):
			last <- time.Now()
		}
		return nil, nil
	}
	if err := c.Task("noop", runcue.Task{Handler: handler}); err != nil {
		return res, err
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		return res, err
	}
	if opts.HoldUntilLoaded {
		ahead := int64(opts.LoadAhead)
		switch {
		case ahead == 0:
			ahead = runcue.DefaultLoadAhead
		case ahead < 0:
			ahead = math.MaxInt64
		}
		want := min(int64(opts.Queued-opts.MaxConcurrent), ahead)
		for {
			queued, unloaded := queueGauges(ctx, reader)
			if res.Held = queued - unloaded; res.Held >= want {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		res.Loaded = time.Since(t0)
		res.PeakRSS = peakRSS()
		close(hold)
		return res, c.Stop(ctx)
	}
	t1 := <-first
	res.FirstCall = t1.Sub(t0)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	n0 := started.Load()
	t2 := t1
	if opts.Dispatches > 1 {
		t2 = <-last
	}
	runtime.ReadMemStats(&m1)
	if d := t2.Sub(t1); d > 0 {
		res.Rate = float64(opts.Dispatches-1) / d.Seconds()
	}
	if n := float64(int64(opts.Dispatches) - n0); n > 0 {
		res.AllocBytes = float64(m1.TotalAlloc-m0.TotalAlloc) / n
		res.Allocs = float64(m1.Mallocs-m0.Mallocs) / n
	}
	if err := c.Stop(ctx); err != nil {
		return res, err
	}
	res.PeakRSS = peakRSS()
	return res, nil
}

// queueGauges reads runcue.work.queued and runcue.work.unloaded.
func queueGauges(ctx context.Context, r *sdkmetric.ManualReader) (queued, unloaded int64) {
	var rm metricdata.ResourceMetrics
	if err := r.Collect(ctx, &rm); err != nil {
		return 0, 0
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			g, ok := m.Data.(metricdata.Gauge[int64])
			if !ok || len(g.DataPoints) == 0 {
				continue
			}
			switch m.Name {
			case "runcue.work.queued":
				queued = g.DataPoints[0].Value
			case "runcue.work.unloaded":
				unloaded = g.DataPoints[0].Value
			}
		}
	}
	return queued, unloaded
}

// peakRSS returns the process's peak resident set size (VmHWM).
func peakRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// String formats r on one line.
func (r DeepResult) String() string {
	if r.Loaded > 0 {
		return fmt.Sprintf("load stopped %v after Open holding %d queued, peak RSS %.1f MiB", r.Loaded.Round(time.Millisecond), r.Held, float64(r.PeakRSS)/(1<<20))
	}
	return fmt.Sprintf("first call %v, %.0f dispatches/s, %.0f B and %.1f allocs per unit, peak RSS %.1f MiB",
		r.FirstCall.Round(time.Millisecond), r.Rate, r.AllocBytes, r.Allocs, float64(r.PeakRSS)/(1<<20))
}

// PrefillHistory writes a database at path that holds finished completed
// no-op units (run to completion by a Cue that keeps finished units) and
// then queued queued ones, and closes it.
func PrefillHistory(path string, finished, queued int) error {
	removeDB(path) // a template left by an earlier run in the same -dir would be added to
	c, err := runcue.Open(path, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Task("noop", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}); err != nil {
		return err
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		return err
	}
	if err := submitNoops(ctx, c, finished, nil); err != nil {
		return err
	}
	if err := c.Drain(ctx); err != nil {
		return err
	}
	if err := c.Stop(ctx); err != nil {
		return err
	}
	if err := submitNoops(ctx, c, queued, nil); err != nil {
		return err
	}
	return c.Close()
}
