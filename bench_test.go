package runcue_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/benchkit"
	"github.com/runcue/runcue/store/sqlite"
)

// Benchmarks report units/s; cmd/runcue-bench prints the interleaved ratio
// to the raw SQLite cycle. Run without -race.

func BenchmarkThroughputBatch(b *testing.B) {
	benchThroughput(b, benchkit.Options{})
}

func BenchmarkThroughputSubmitters(b *testing.B) {
	benchThroughput(b, benchkit.Options{Submitters: 64})
}

func BenchmarkThroughputUnlimitedService(b *testing.B) {
	benchThroughput(b, benchkit.Options{Service: &runcue.Service{}})
}

func benchThroughput(b *testing.B, o benchkit.Options) {
	o.Units = max(b.N, 1000)
	b.ResetTimer()
	res, err := benchkit.Throughput(b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(res.UnitsPerSec, "units/s")
	b.ReportMetric(float64(benchkit.Percentile(res.SubmitLatency, 99))/float64(time.Microsecond), "submit-p99-µs")
}

// BenchmarkSoak reports the live heap after 10,000 units and after
// max(b.N, 100,000) units through one Cue, and the growth per unit between
// them: memory must not grow with history. `go -C cmd run ./runcue-bench -soak
// 1000000` runs the million-unit version.
func BenchmarkSoak(b *testing.B) {
	n := max(b.N, 100_000)
	b.ResetTimer()
	pts, err := benchkit.Soak(b.TempDir(), []int{10_000, n})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(pts[0].LiveHeap)/(1<<20), "MiB-live@10k")
	b.ReportMetric(float64(pts[1].LiveHeap)/(1<<20), "MiB-live@end")
	b.ReportMetric((float64(pts[1].LiveHeap)-float64(pts[0].LiveHeap))/float64(n-10_000), "B-growth/unit")
}

func BenchmarkRawCycle(b *testing.B) {
	n := max(b.N, 1000)
	b.ResetTimer()
	r, err := benchkit.RawCycle(b.TempDir(), n, sqlite.Normal)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r, "units/s")
}

func BenchmarkCompletionToDispatch(b *testing.B) {
	n := max(b.N, 1000)
	b.ResetTimer()
	lat, err := benchkit.DispatchLatency(b.TempDir(), n)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(benchkit.Percentile(lat, 50))/float64(time.Microsecond), "p50-µs")
	b.ReportMetric(float64(benchkit.Percentile(lat, 99))/float64(time.Microsecond), "p99-µs")
}

// BenchmarkRateLimit1000 runs a deep queue through a 1,000/s limit for 10s
// and reports the achieved rate and the most handler starts (Work.Started)
// in any 1s window.
func BenchmarkRateLimit1000(b *testing.B) {
	for range b.N {
		r, err := benchkit.RateLimited(b.TempDir(), 1000, time.Second, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.Achieved, "starts/s")
		b.ReportMetric(100*r.Achieved/1000, "%-of-limit")
		b.ReportMetric(float64(r.MaxInWindow), "max-per-1s-window")
	}
}

// BenchmarkPriorityScaling queues 100,000 units of which 100 can run (the
// rest wait on a paused service) and reports how many times the priority
// function ran per dispatch: it scores only units that could run.
func BenchmarkPriorityScaling(b *testing.B) {
	for range b.N {
		calls, dispatches, err := priorityScaling(b.TempDir(), 99_900, 100)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(calls)/float64(dispatches), "calls/dispatch")
		b.ReportMetric(float64(dispatches), "dispatches")
	}
}

func priorityScaling(dir string, blocked, free int) (calls, dispatches int64, err error) {
	c, err := runcue.Open(filepath.Join(dir, "prio.db"), runcue.Config{Logger: quietLogger,
		Priority: runcue.PriorityByWaitTime(time.Hour), MaxConcurrent: 10})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	ctx := context.Background()
	if err := c.Service("slow", runcue.Service{}); err != nil {
		return 0, 0, err
	}
	if err := c.Task("wait", runcue.Task{Services: []string{"slow"}, Handler: noop}); err != nil {
		return 0, 0, err
	}
	if err := c.Task("go", runcue.Task{Handler: noop}); err != nil {
		return 0, 0, err
	}
	if err := c.PauseService(ctx, "slow"); err != nil {
		return 0, 0, err
	}
	for left := blocked; left > 0; left -= 1000 {
		subs := batchOf("wait", min(left, 1000))
		if _, err := c.SubmitBatch(ctx, subs); err != nil {
			return 0, 0, err
		}
	}
	var ids []string
	subs := batchOf("go", free)
	out, err := c.SubmitBatch(ctx, subs)
	if err != nil {
		return 0, 0, err
	}
	for _, s := range out {
		ids = append(ids, s.ID)
	}
	if err := c.Start(ctx); err != nil {
		return 0, 0, err
	}
	for _, id := range ids {
		if _, err := c.Wait(ctx, id); err != nil {
			return 0, 0, err
		}
	}
	calls, dispatches, _ = runcue.Counters(c)
	return calls, dispatches, c.StopAndCancel(ctx)
}
