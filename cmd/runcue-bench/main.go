// Command runcue-bench measures runcue's throughput and latency against a
// minimal hand-written SQLite queue cycle on the same machine, interleaving
// the two so that the ratio of their medians is meaningful on a busy host.
//
//	go -C cmd run ./runcue-bench            # defaults: 20,000 units, 5 repetitions
//	go -C cmd run ./runcue-bench -sync full
//	go -C cmd run ./runcue-bench -scale     # deep queues, restart, priority at scale
//	go -C cmd run ./runcue-bench -lean      # the hot-path ratio, then -scale: the Lean issue's figures in one run
//
// Never run it with -race: the race detector slows runcue and the raw cycle
// unevenly.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/benchkit"
	"github.com/runcue/runcue/store/sqlite"
)

func main() {
	units := flag.Int("n", 20000, "units per run")
	reps := flag.Int("reps", 5, "repetitions (at least 5 for the headline ratio)")
	syncMode := flag.String("sync", "normal", "SQLite synchronous setting: normal or full")
	submitters := flag.Int("submitters", 0, "submit one unit per call from this many goroutines (0: batches of 100)")
	latencyUnits := flag.Int("latency-units", 5000, "units for the completion-to-dispatch measurement")
	dir := flag.String("dir", "", "directory for the database files (default: a temporary directory)")
	rate := flag.Int("rate", 1000, "per-second limit for the rate-limited run (0 skips it)")
	serviceReps := flag.Int("service-reps", 5, "repetitions of the no-service vs one-unlimited-service comparison (0 skips it)")
	stalledReps := flag.Int("stalled-reps", 5, "repetitions of the no-subscriber vs stalled-subscriber comparison (0 skips it)")
	rateSpan := flag.Duration("rate-span", 10*time.Second, "how long the rate-limited run is measured")
	soak := flag.Int("soak", 0, "instead of the other measurements: process this many units through one Cue and report its live heap at 10,000 units and at each tenfold (memory must not grow with history)")
	lean := flag.Bool("lean", false, "instead of the other measurements: the hot-path ratio (-reps repetitions), then the -scale measurements (deep queues with allocations per unit at each depth, priority with a scattering function and PriorityByWaitTime)")
	scale := flag.Bool("scale", false, "instead of the other measurements: restart and dispatch with deep queues (see -scale-sizes), and priority selection with 100,000 runnable units")
	scaleSizes := flag.String("scale-sizes", "20000,1000,100000,1000000", "queued units before Start for -scale (the first is the deep-queue ratio's reference, the last its deep queue)")
	scaleDispatches := flag.Int("scale-dispatches", 20000, "dispatches measured per -scale run")
	scaleParams := flag.Int("scale-params", 64, "bytes of params per unit for -scale")
	lag := flag.Int("lag", 0, "instead of the other measurements: run this many queued no-op units and report the most handler starts ahead of the completions committed (runs a crash would make run again; at most MaxConcurrent + MaxUncommitted - 1)")
	history := flag.Int("history", 0, "instead of the other measurements: time to the first handler call on a database whose history holds this many completed units, with 1,000 queued")
	scaleChildPath := flag.String("scale-child", "", "internal: measure one -scale run on this database and print it as JSON")
	scalePriority := flag.String("scale-priority", "", "internal: with -scale-child, the priority function: wait (PriorityByWaitTime(time.Hour)) or hash (a hash of the target)")
	scaleHold := flag.Int("scale-hold", 0, "internal: with -scale-child, hold the handlers until the load of this many queued units stops (all in memory, or Config.LoadAhead), and report the peak RSS then")
	scaleLoadAhead := flag.Int("scale-load-ahead", 0, "Config.LoadAhead for -scale runs (0: the default; -1: load the whole queue at once)")
	flag.Parse()
	if *scaleChildPath != "" {
		childMain(*scaleChildPath, *scaleDispatches, *scalePriority, *scaleHold, *scaleLoadAhead)
		return
	}

	sync := sqlite.Normal
	switch *syncMode {
	case "normal":
	case "full":
		sync = sqlite.Full
	default:
		log.Fatalf("unknown -sync %q", *syncMode)
	}
	if *dir == "" {
		d, err := os.MkdirTemp("", "runcue-bench")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	if *history > 0 {
		runHistory(*dir, *reps, *history)
		return
	}
	if *lag > 0 {
		runLag(*dir, *reps, *lag)
		return
	}
	if *scale {
		runScale(*dir, *reps, parseSizes(*scaleSizes), *scaleDispatches, *scaleParams, *scaleLoadAhead)
		return
	}
	if *soak > 0 {
		runSoak(*dir, *soak)
		return
	}
	if *lean {
		runHotPath(*dir, *units, *reps, *submitters, *syncMode, sync)
		runScale(*dir, *reps, parseSizes(*scaleSizes), *scaleDispatches, *scaleParams, *scaleLoadAhead)
		return
	}
	runHotPath(*dir, *units, *reps, *submitters, *syncMode, sync)

	if *serviceReps > 0 {
		var plain, svc []float64
		for range *serviceReps {
			a, err := benchkit.Throughput(*dir, benchkit.Options{Units: *units, Sync: sync})
			if err != nil {
				log.Fatal(err)
			}
			b, err := benchkit.Throughput(*dir, benchkit.Options{Units: *units, Sync: sync, Service: &runcue.Service{}})
			if err != nil {
				log.Fatal(err)
			}
			plain, svc = append(plain, a.UnitsPerSec), append(svc, b.UnitsPerSec)
		}
		mp, ms := benchkit.Median(plain), benchkit.Median(svc)
		fmt.Printf("one unlimited service in the path (%d interleaved reps): %.0f units/s vs %.0f without, ratio %.2f\n",
			*serviceReps, ms, mp, ms/mp)
	}

	if *stalledReps > 0 {
		var plain, stalled []float64
		for range *stalledReps {
			a, err := benchkit.Throughput(*dir, benchkit.Options{Units: *units, Sync: sync})
			if err != nil {
				log.Fatal(err)
			}
			b, err := benchkit.Throughput(*dir, benchkit.Options{Units: *units, Sync: sync, StalledSubscriber: true})
			if err != nil {
				log.Fatal(err)
			}
			plain, stalled = append(plain, a.UnitsPerSec), append(stalled, b.UnitsPerSec)
		}
		mp, ms := benchkit.Median(plain), benchkit.Median(stalled)
		fmt.Printf("a subscriber that never reads (%d interleaved reps): %.0f units/s vs %.0f without, ratio %.2f\n",
			*stalledReps, ms, mp, ms/mp)
	}

	if *rate > 0 {
		r, err := benchkit.RateLimited(*dir, *rate, time.Second, *rateSpan)
		if err != nil {
			log.Fatal("rate: ", err)
		}
		fmt.Printf("rate limit %d/s, deep queue, %v: %.1f starts/s achieved (%.2f%% of the limit), at most %d in any 1s window (handler start instants, Work.Started)\n",
			*rate, *rateSpan, r.Achieved, 100*r.Achieved/float64(*rate), r.MaxInWindow)
	}

	lat, err := benchkit.DispatchLatency(*dir, *latencyUnits)
	if err != nil {
		log.Fatal("latency: ", err)
	}
	fmt.Printf("completion-to-dispatch (MaxConcurrent 1, %d units): p50 %v, p99 %v, max %v\n", len(lat)+1,
		benchkit.Percentile(lat, 50).Round(time.Microsecond), benchkit.Percentile(lat, 99).Round(time.Microsecond),
		benchkit.Percentile(lat, 100).Round(time.Microsecond))
}

func runLag(dir string, reps, n int) {
	fmt.Printf("runcue-bench -lag: %d queued no-op units, MaxConcurrent 100, default MaxUncommitted, %d repetitions, GOMAXPROCS=%d, %s\n",
		n, reps, runtime.GOMAXPROCS(0), runtime.Version())
	for i := range reps {
		res, err := benchkit.Lag(filepath.Join(dir, fmt.Sprintf("lag-%d.db", i)), n, runcue.Config{})
		if err != nil {
			log.Fatal("lag: ", err)
		}
		fmt.Printf("  rep %d: at most %d handler starts ahead of the completions committed; all done in %v\n", i+1, res.MaxAhead, res.Elapsed.Round(time.Millisecond))
	}
}

func runSoak(dir string, n int) {
	var cps []int
	for cp := 10_000; cp < n; cp *= 10 {
		cps = append(cps, cp)
	}
	cps = append(cps, n)
	fmt.Printf("runcue-bench -soak: %d no-op units through one Cue (default configuration: 30-minute timeouts), GOMAXPROCS=%d, %s\n",
		n, runtime.GOMAXPROCS(0), runtime.Version())
	pts, err := benchkit.Soak(dir, cps)
	if err != nil {
		log.Fatal("soak: ", err)
	}
	for _, p := range pts {
		fmt.Printf("  after %9d units: live heap %7.1f MiB, RSS %7.1f MiB (%v)\n", p.Units,
			float64(p.LiveHeap)/(1<<20), float64(p.RSS)/(1<<20), p.Elapsed.Round(time.Second))
	}
	if len(pts) > 1 {
		a, b := pts[0], pts[len(pts)-1]
		fmt.Printf("live heap per processed unit between %d and %d units: %+.1f bytes\n", a.Units, b.Units,
			(float64(b.LiveHeap)-float64(a.LiveHeap))/float64(b.Units-a.Units))
	}
}

// runHotPath measures the headline: runcue against the raw SQLite queue
// cycle, interleaved, reps times, and the submit latency.
func runHotPath(dir string, units, reps, submitters int, syncMode string, sync sqlite.Synchronous) {
	fmt.Printf("runcue-bench: %d units, %d repetitions, synchronous=%s, GOMAXPROCS=%d, %s\n",
		units, reps, syncMode, runtime.GOMAXPROCS(0), runtime.Version())
	var raw, rc []float64
	var submitLat []time.Duration
	for i := range reps {
		r, err := benchkit.RawCycle(dir, units, sync)
		if err != nil {
			log.Fatal("raw cycle: ", err)
		}
		res, err := benchkit.Throughput(dir, benchkit.Options{Units: units, Submitters: submitters, Sync: sync})
		if err != nil {
			log.Fatal("runcue: ", err)
		}
		raw, rc = append(raw, r), append(rc, res.UnitsPerSec)
		submitLat = append(submitLat, res.SubmitLatency...)
		fmt.Printf("  rep %d: raw cycle %8.0f units/s   runcue %8.0f units/s   ratio %.2f\n", i+1, r, res.UnitsPerSec, res.UnitsPerSec/r)
	}
	mr, mc := benchkit.Median(raw), benchkit.Median(rc)
	fmt.Printf("median: raw cycle %.0f units/s, runcue %.0f units/s, ratio %.2f\n", mr, mc, mc/mr)
	what := "SubmitBatch of 100"
	if submitters > 0 {
		what = fmt.Sprintf("Submit, %d concurrent submitters", submitters)
	}
	fmt.Printf("submit latency (%s): p50 %v, p99 %v\n", what,
		benchkit.Percentile(submitLat, 50).Round(time.Microsecond), benchkit.Percentile(submitLat, 99).Round(time.Microsecond))
}
