package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/benchkit"
)

// The -scale measurements. Each run opens a copy of a pre-filled database
// in a child process (this program, with -scale-child), so that its time to
// the first handler call and its peak RSS are a fresh process's.

// scaleConfig is one kind of run.
type scaleConfig struct {
	name     string
	queued   int
	priority string // "" (none), "wait" (PriorityByWaitTime) or "hash" (scatters: a hash of the target)
	hold     bool   // hold the handlers until the load stops (the whole queue or Config.LoadAhead in memory): the peak RSS run
	whole    bool   // measure until every queued unit has run (the load included)
	// loadAhead is the Cue's Config.LoadAhead: the -scale-load-ahead
	// flag's, but -1 (every unit held and scored) for the priority runs.
	loadAhead int
}

func runScale(dir string, reps int, sizes []int, dispatches, paramBytes, loadAhead int) {
	fmt.Printf("runcue-bench -scale: queued %v, first %d dispatches measured, params %d B, LoadAhead %d, %d interleaved repetitions, GOMAXPROCS=%d, %s\n",
		sizes, dispatches, paramBytes, loadAhead, reps, runtime.GOMAXPROCS(0), runtime.Version())
	const prioQueued = 100_000
	var configs []scaleConfig
	fill := map[int]bool{prioQueued: true}
	for _, n := range sizes {
		configs = append(configs, scaleConfig{name: fmt.Sprintf("%d queued", n), queued: n})
		fill[n] = true
	}
	for _, n := range sizes {
		configs = append(configs, scaleConfig{name: fmt.Sprintf("%d queued, held until the load stops", n), queued: n, hold: true})
	}
	if len(sizes) > 1 && sizes[len(sizes)-1] > dispatches {
		n := sizes[len(sizes)-1]
		configs = append(configs, scaleConfig{name: fmt.Sprintf("%d queued, until all ran", n), queued: n, whole: true})
	}
	for i := range configs {
		configs[i].loadAhead = loadAhead
	}
	// The priority runs hold every unit (LoadAhead -1), so that the
	// function orders all 100,000, as the reference without one does.
	plain := fmt.Sprintf("%d runnable, no priority function", prioQueued)
	configs = append(configs,
		scaleConfig{name: plain, queued: prioQueued, loadAhead: -1},
		scaleConfig{name: fmt.Sprintf("%d runnable, PriorityByWaitTime(time.Hour)", prioQueued), queued: prioQueued, priority: "wait", loadAhead: -1},
		scaleConfig{name: fmt.Sprintf("%d runnable, a hash of the target", prioQueued), queued: prioQueued, priority: "hash", loadAhead: -1})
	templates := map[int]string{}
	for _, n := range slices.Sorted(func(yield func(int) bool) {
		for n := range fill {
			if !yield(n) {
				return
			}
		}
	}) {
		p := filepath.Join(dir, fmt.Sprintf("template-%d.db", n))
		t := time.Now()
		if err := benchkit.Prefill(p, n, paramBytes); err != nil {
			log.Fatalf("prefill %d: %v", n, err)
		}
		fmt.Printf("  prefilled %d queued units in %v\n", n, time.Since(t).Round(time.Millisecond))
		templates[n] = p
	}
	results := make(map[string][]benchkit.DeepResult)
	for rep := range reps {
		for _, c := range configs {
			run := filepath.Join(dir, "run.db")
			if err := benchkit.CopyDB(templates[c.queued], run); err != nil {
				log.Fatal(err)
			}
			d := min(dispatches, c.queued)
			if c.whole {
				d = c.queued
			}
			r := scaleChild(run, d, c.priority, c.hold, c.queued, c.loadAhead)
			for _, s := range []string{"", "-wal", "-shm", ".lock"} {
				os.Remove(run + s)
			}
			results[c.name] = append(results[c.name], r)
			fmt.Printf("  rep %d, %s: %v\n", rep+1, c.name, r)
		}
	}
	fmt.Println("medians:")
	med := func(name string, f func(benchkit.DeepResult) float64) float64 {
		var xs []float64
		for _, r := range results[name] {
			xs = append(xs, f(r))
		}
		return benchkit.Median(xs)
	}
	for _, c := range configs {
		n := c.name
		if c.hold {
			fmt.Printf("  %s: load stopped %v after Open holding %.0f queued, peak RSS (VmHWM) %.1f MiB\n", n,
				time.Duration(med(n, func(r benchkit.DeepResult) float64 { return float64(r.Loaded) })).Round(time.Millisecond),
				med(n, func(r benchkit.DeepResult) float64 { return float64(r.Held) }),
				med(n, func(r benchkit.DeepResult) float64 { return float64(r.PeakRSS) })/(1<<20))
			continue
		}
		fmt.Printf("  %s: first handler call %v after Open, %.0f dispatches/s, peak RSS by then %.1f MiB, %.0f B and %.1f allocs per unit\n", n,
			time.Duration(med(n, func(r benchkit.DeepResult) float64 { return float64(r.FirstCall) })).Round(time.Millisecond),
			med(n, func(r benchkit.DeepResult) float64 { return r.Rate }),
			med(n, func(r benchkit.DeepResult) float64 { return float64(r.PeakRSS) })/(1<<20),
			med(n, func(r benchkit.DeepResult) float64 { return r.AllocBytes }),
			med(n, func(r benchkit.DeepResult) float64 { return r.Allocs }))
	}
	ratio := func(a, b string) float64 {
		var xs []float64
		for i := range results[a] {
			xs = append(xs, results[a][i].Rate/results[b][i].Rate)
		}
		return benchkit.Median(xs)
	}
	if len(sizes) > 1 {
		small, big := configs[0].name, configs[len(sizes)-1].name
		fmt.Printf("deep queue: rate with %s / rate with %s: median ratio %.2f\n", big, small, ratio(big, small))
		whole := fmt.Sprintf("%d queued, until all ran", sizes[len(sizes)-1])
		if _, ok := results[whole]; ok && small == fmt.Sprintf("%d queued", dispatches) {
			var xs []float64
			for i := range results[whole] {
				xs = append(xs, results[whole][i].Allocs/results[small][i].Allocs)
			}
			fmt.Printf("deep queue: allocations per unit, %s (the load included) / %s: median ratio %.2f\n", whole, small, benchkit.Median(xs))
		}
	}
	if _, ok := results[plain]; ok {
		for _, prio := range []string{fmt.Sprintf("%d runnable, PriorityByWaitTime(time.Hour)", prioQueued), fmt.Sprintf("%d runnable, a hash of the target", prioQueued)} {
			fmt.Printf("priority: rate with %s / without: median ratio %.2f\n", prio, ratio(prio, plain))
		}
	}
}

// runHistory measures a start on a database whose history holds finished
// completed units and which has 1,000 queued ones.
func runHistory(dir string, reps, finished int) {
	const queued = 1000
	fmt.Printf("runcue-bench -history: %d completed units in the history, %d queued, %d repetitions, GOMAXPROCS=%d, %s\n",
		finished, queued, reps, runtime.GOMAXPROCS(0), runtime.Version())
	tmpl := filepath.Join(dir, fmt.Sprintf("history-%d.db", finished))
	t := time.Now()
	if err := benchkit.PrefillHistory(tmpl, finished, queued); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("  prefilled in %v\n", time.Since(t).Round(time.Millisecond))
	var first []float64
	for rep := range reps {
		run := filepath.Join(dir, "run.db")
		if err := benchkit.CopyDB(tmpl, run); err != nil {
			log.Fatal(err)
		}
		r := scaleChild(run, queued, "", false, queued, 0)
		for _, s := range []string{"", "-wal", "-shm", ".lock"} {
			os.Remove(run + s)
		}
		fmt.Printf("  rep %d: %v\n", rep+1, r)
		first = append(first, float64(r.FirstCall))
	}
	fmt.Printf("median: first handler call %v after Open\n", time.Duration(benchkit.Median(first)).Round(time.Millisecond))
}

// scaleChild runs one measurement in a child process.
func scaleChild(path string, dispatches int, priority string, hold bool, queued, loadAhead int) benchkit.DeepResult {
	exe, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	args := []string{"-scale-child", path, "-scale-dispatches", strconv.Itoa(dispatches)}
	if priority != "" {
		args = append(args, "-scale-priority", priority)
	}
	if hold {
		args = append(args, "-scale-hold", strconv.Itoa(queued))
	}
	if loadAhead != 0 {
		args = append(args, "-scale-load-ahead", strconv.Itoa(loadAhead))
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		log.Fatalf("child %v: %v", args, err)
	}
	var r benchkit.DeepResult
	if err := json.Unmarshal(out, &r); err != nil {
		log.Fatalf("child %v: %v: %q", args, err, out)
	}
	return r
}

// childMain is the child's side: measure, print the result as JSON.
func childMain(path string, dispatches int, priority string, hold, loadAhead int) {
	opts := benchkit.DeepOptions{Dispatches: dispatches, HoldUntilLoaded: hold > 0, Queued: hold, LoadAhead: loadAhead}
	switch priority {
	case "":
	case "wait":
		opts.Priority = runcue.PriorityByWaitTime(time.Hour)
	case "hash":
		// Scatters the dispatch order over the queue: each unit's score is
		// a hash of its target (FNV-1a), as a score from a model or a
		// customer tier would.
		opts.Priority = func(pc runcue.PriorityContext) float64 {
			h := fnv.New64a()
			h.Write([]byte(pc.Work.Target))
			return float64(h.Sum64()>>11) / (1 << 53)
		}
	default:
		log.Fatalf("-scale-priority: %q: want wait or hash", priority)
	}
	r, err := benchkit.StartDeep(path, opts)
	if err != nil {
		log.Fatal(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		log.Fatal(err)
	}
}

func parseSizes(s string) []int {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(f, "_", "")))
		if err != nil || n <= 0 {
			log.Fatalf("-scale-sizes: bad size %q", f)
		}
		out = append(out, n)
	}
	return out
}
