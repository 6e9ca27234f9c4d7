package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"time"
)

func main() {
	if ok, err := maybeChild(); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run parses args and runs the interleaved comparison, printing to out.
func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("peerbench", flag.ContinueOnError)
	dbURL := fs.String("url", os.Getenv("RUNCUE_TEST_POSTGRES"), "a PostgreSQL URL (a schema is made for each run)")
	n := fs.Int("n", 20_000, "units (jobs) a run")
	batch := fs.Int("batch", 1_000, "units a batch insert")
	workers := fs.Int("workers", 100, "handlers (workers) at once")
	reps := fs.Int("reps", 5, "interleaved runs of each")
	which := fs.String("workload", "noop", "noop, limited (runcue's units through a service whose cap and window do not bind), or both")
	timeout := fs.Duration("timeout", 10*time.Minute, "for the whole comparison")
	cooldown := fs.Duration("river-fetch-cooldown", time.Millisecond, "River's FetchCooldown (its default, 100ms, caps a queue at MaxWorkers jobs a cooldown)")
	poll := fs.Duration("river-fetch-poll", 50*time.Millisecond, "River's FetchPollInterval (default 1s)")
	sides := fs.String("sides", "both", "runcue, river or both: which to run (one side alone, to profile it)")
	lat := fs.Bool("latency", false, "measure runcue's latency instead (units at a steady rate, in one process for each workload, then the no-op workload from a submitter in another process and through 3 executors of 33 handlers) and print its percentiles")
	latN := fs.Int("latency-n", 500, "with -latency: units each measure")
	latRate := fs.Int("latency-rate", 20, "with -latency: units a second")
	cpuProfile := fs.String("cpuprofile", "", "write this process's CPU profile of the whole comparison to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errNoURL
	}
	if *sides != "both" && *sides != "runcue" && *sides != "river" {
		return fmt.Errorf("peerbench: -sides %q: want runcue, river or both", *sides)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if *lat {
		for _, limited := range []bool{false, true} {
			if err := latency(ctx, out, *dbURL, *latN, float64(*latRate), limited); err != nil {
				return err
			}
		}
		if err := latencyFromProcess(ctx, out, *dbURL, *latN, float64(*latRate)); err != nil {
			return err
		}
		return latencyExecutors(ctx, out, *dbURL, *latN, float64(*latRate), 3, 33)
	}
	var loads []bool
	switch *which {
	case "noop":
		loads = []bool{false}
	case "limited":
		loads = []bool{true}
	case "both":
		loads = []bool{false, true}
	default:
		return fmt.Errorf("peerbench: -workload %q: want noop, limited or both", *which)
	}
	for _, limited := range loads {
		w := workload{n: *n, batch: *batch, workers: *workers, limited: limited, fetchCooldown: *cooldown, fetchPoll: *poll}
		name := "no-op"
		if limited {
			name = "limited (runcue through a cap and a window that do not bind)"
		}
		fmt.Fprintf(out, "workload %s: %d units, batches of %d, %d at once, %d interleaved runs; River's FetchCooldown %v, FetchPollInterval %v\n",
			name, w.n, w.batch, w.workers, *reps, w.fetchCooldown, w.fetchPoll)
		var rc, rv []result
		for i := range *reps {
			// Alternate which goes first, so neither always runs on a
			// warmer server.
			order := []string{"runcue", "river"}
			if i%2 == 1 {
				order = []string{"river", "runcue"}
			}
			for _, side := range order {
				if *sides != "both" && side != *sides {
					continue
				}
				var r result
				var err error
				if side == "runcue" {
					r, err = runRuncue(ctx, *dbURL, w)
					rc = append(rc, r)
				} else {
					r, err = runRiver(ctx, *dbURL, w)
					rv = append(rv, r)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "  run %d %-6s %8.0f units/s  CPU a 1,000: process %.3f s, server %s\n", i+1, side, r.rate(),
					cpuPer1000(r.procCPU, r.n), serverText(r))
			}
		}
		if len(rc) == 0 || len(rv) == 0 {
			for _, rs := range [][]result{rc, rv} {
				if len(rs) > 0 {
					fmt.Fprintf(out, "median: %s %.0f a second, CPU a 1,000 units: process %.3f s + server %s\n", *sides, medianRate(rs),
						medianCPU(rs, false), medianServer(rs))
				}
			}
			continue
		}
		mc, mv := medianRate(rc), medianRate(rv)
		fmt.Fprintf(out, "median: runcue %.0f units/s, River %.0f jobs/s, ratio %.2f\n", mc, mv, mc/mv)
		fmt.Fprintf(out, "median CPU a 1,000 units: runcue process %.3f s + server %s; River process %.3f s + server %s\n",
			medianCPU(rc, false), medianServer(rc), medianCPU(rv, false), medianServer(rv))
	}
	return nil
}

func serverText(r result) string {
	if r.serverCPU < 0 {
		return "n/a (not on this host)"
	}
	return fmt.Sprintf("%.3f s", cpuPer1000(r.serverCPU, r.n))
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianRate(rs []result) float64 {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, r.rate())
	}
	return median(xs)
}

func medianCPU(rs []result, server bool) float64 {
	var xs []float64
	for _, r := range rs {
		d := r.procCPU
		if server {
			d = r.serverCPU
		}
		xs = append(xs, cpuPer1000(d, r.n))
	}
	return median(xs)
}

func medianServer(rs []result) string {
	for _, r := range rs {
		if r.serverCPU < 0 {
			return "n/a"
		}
	}
	return fmt.Sprintf("%.3f s", medianCPU(rs, true))
}
