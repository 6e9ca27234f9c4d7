package runcue_test

import (
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/benchkit"
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

func BenchmarkRawCycle(b *testing.B) {
	n := max(b.N, 1000)
	b.ResetTimer()
	r, err := benchkit.RawCycle(b.TempDir(), n, runcue.SyncNormal)
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
// and reports the achieved rate and the most dispatches in any 1s window,
// read from service_log.
func BenchmarkRateLimit1000(b *testing.B) {
	for range b.N {
		r, err := benchkit.RateLimited(b.TempDir(), 1000, time.Second, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.Achieved, "dispatches/s")
		b.ReportMetric(100*r.Achieved/1000, "%-of-limit")
		b.ReportMetric(float64(r.MaxInWindow), "max-per-1s-window")
	}
}
