// Command runcue-sim stresses and validates runcue without real services.
//
// It runs a Cue against mock services whose latency, errors, timeouts,
// 429s and outages are drawn from a seed, submits a workload of dependency
// patterns, and checks runcue's promises from outside: every mock counts
// the calls it receives on a sliding window and a concurrency count of its
// own and reports each excess as a violation. It runs headless (a JSON
// and an HTML report, a non-zero exit when an invariant breaks) or live in
// a terminal (--tui). With --virtual the Cue runs on a virtual clock that
// moves only when the Cue is quiescent (runcue.Cue.Settle): an hour of
// traffic takes seconds, and one seed gives one run.
//
//	runcue-sim --scenario burst --virtual --duration 1h --seed 1 --report r.json --html r.html
//	runcue-sim --config my_test.yaml --tui
//	runcue-sim --scenario recovery
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
)

// Exit statuses.
const (
	exitPass      = 0
	exitViolation = 1 // an invariant broke
	exitUsage     = 2 // bad flags or configuration, or the run failed
)

func main() {
	if isChild() {
		os.Exit(childMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// flags are the command line.
type flags struct {
	scenario, config  string
	duration, drain   time.Duration
	seed              uint64
	seedSet           bool
	virtual, tui      bool
	report, html, db  string
	rate, load        float64
	mockLimits        []string
	kills             int
	list, printConfig bool
	quiet             bool
	snapshotDir       string
	frameRate         int
	setDuration       bool
	cpuProfile        string
}

func parseFlags(args []string, stderr io.Writer) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("runcue-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.scenario, "scenario", "", "built-in scenario: "+strings.Join(scenarioNames(), ", "))
	fs.StringVar(&f.config, "config", "", "YAML configuration file (the spec's format; see --print-config)")
	fs.DurationVar(&f.duration, "duration", 0, "how long work is submitted (simulated time with --virtual)")
	fs.DurationVar(&f.drain, "drain", 0, "how long the run may go on after --duration for the work to end (default: --duration)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of every random draw")
	fs.BoolVar(&f.virtual, "virtual", false, "run on a virtual clock: fast, and one seed gives one run")
	fs.BoolVar(&f.tui, "tui", false, "live terminal UI (real clock)")
	fs.StringVar(&f.report, "report", "", "write the JSON report to this file")
	fs.StringVar(&f.html, "html", "", "write the HTML report (self-contained, with charts) to this file")
	fs.StringVar(&f.db, "db", "", "database file (default: a temporary one, removed at the end)")
	fs.Float64Var(&f.rate, "rate", 0, "submission rate, units per second (overrides the workload's)")
	fs.Float64Var(&f.load, "load", 0, "submission rate as a fraction of capacity (overrides the workload's)")
	fs.Func("mock-limit", "server-side limit of a mock, `service=N` (repeatable): the mock counts calls beyond N per window as violations", func(s string) error {
		f.mockLimits = append(f.mockLimits, s)
		return nil
	})
	fs.IntVar(&f.kills, "kills", 0, "recovery: SIGKILLs of the child process")
	fs.BoolVar(&f.list, "list", false, "list the built-in scenarios and exit")
	fs.BoolVar(&f.printConfig, "print-config", false, "print the configuration (scenario and overrides) as YAML and exit")
	fs.BoolVar(&f.quiet, "quiet", false, "headless: print only the verdicts")
	fs.StringVar(&f.snapshotDir, "snapshot-dir", ".", "TUI: where S saves metrics snapshots")
	fs.IntVar(&f.frameRate, "fps", 10, "TUI: frames per second")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof reads it)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "seed":
			f.seedSet = true
		case "duration":
			f.setDuration = true
		}
	})
	return f, nil
}

// configFor builds the run's configuration from the flags.
func configFor(f *flags) (Config, error) {
	var (
		c   Config
		err error
	)
	switch {
	case f.scenario != "" && f.config != "":
		return c, errors.New("--scenario and --config: give one")
	case f.config != "":
		c, err = loadConfig(f.config)
	default:
		name := f.scenario
		if name == "" {
			name = "steady_load"
		}
		c, err = scenario(name)
	}
	if err != nil {
		return c, err
	}
	if f.setDuration {
		c.Duration = Duration(f.duration)
	}
	if f.drain > 0 {
		c.Drain = Duration(f.drain)
	}
	if f.seedSet || c.Seed == 0 {
		c.Seed = f.seed
	}
	if f.rate > 0 {
		c.Workload.Rate = f.rate
	}
	if f.load > 0 {
		c.Workload.Load, c.Workload.Rate = f.load, 0
	}
	if f.kills > 0 {
		c.Kills = f.kills
	}
	for _, ml := range f.mockLimits {
		name, n, ok := strings.Cut(ml, "=")
		s, known := c.Services[name]
		limit, err := strconv.Atoi(n)
		if !ok || !known || err != nil || limit <= 0 {
			return c, fmt.Errorf("--mock-limit %q: want service=N for a configured service", ml)
		}
		if s.RateWindow == 0 && s.Behavior.MockWindow == 0 {
			return c, fmt.Errorf("--mock-limit %s: the service has no rate window (set mock_window in a config file)", name)
		}
		s.Behavior.MockLimit = limit
		if s.Behavior.MockWindow == 0 {
			s.Behavior.MockWindow = s.RateWindow
		}
		c.Services[name] = s
	}
	return c, nil
}

// run is the command: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitPass
		}
		fmt.Fprintln(stderr, "runcue-sim:", err)
		return exitUsage
	}
	if f.list {
		for _, n := range scenarioNames() {
			c, _ := scenario(n)
			fmt.Fprintf(stdout, "%-16s %s\n", n, c.Description)
		}
		return exitPass
	}
	cfg, err := configFor(f)
	if err != nil {
		fmt.Fprintln(stderr, "runcue-sim:", err)
		return exitUsage
	}
	if f.printConfig {
		b, _ := yaml.Marshal(cfg)
		stdout.Write(b)
		return exitPass
	}
	if f.cpuProfile != "" {
		out, err := os.Create(f.cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "runcue-sim:", err)
			return exitUsage
		}
		defer out.Close()
		if err := pprof.StartCPUProfile(out); err != nil {
			fmt.Fprintln(stderr, "runcue-sim:", err)
			return exitUsage
		}
		defer pprof.StopCPUProfile()
		stopped := make(chan struct{})
		defer close(stopped)
		go func() { // an interrupted run leaves its profile too
			select {
			case <-ctx.Done():
				pprof.StopCPUProfile()
			case <-stopped:
			}
		}()
	}
	var rep *Report
	switch {
	case cfg.Name == "recovery" || cfg.Kills > 0:
		if f.virtual || f.tui {
			fmt.Fprintln(stderr, "runcue-sim: the recovery scenario runs on the real clock, headless")
			return exitUsage
		}
		rep, err = runRecovery(ctx, cfg, f.db, stderr)
	case f.tui:
		if f.virtual {
			fmt.Fprintln(stderr, "runcue-sim: --tui runs on the real clock; drop --virtual")
			return exitUsage
		}
		rep, err = runTUI(ctx, cfg, f)
	default:
		var e *engine
		e, err = newEngine(cfg, options{Virtual: f.virtual, DB: f.db})
		if err == nil {
			rep, err = e.run(ctx)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "runcue-sim:", err)
		return exitUsage
	}
	if f.report != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(f.report, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(stderr, "runcue-sim:", err)
			return exitUsage
		}
	}
	if f.html != "" {
		if err := writeHTML(f.html, rep); err != nil {
			fmt.Fprintln(stderr, "runcue-sim:", err)
			return exitUsage
		}
	}
	printSummary(stdout, rep, f.quiet)
	if !rep.Pass {
		return exitViolation
	}
	return exitPass
}

// printSummary writes the report's headline figures and verdicts.
func printSummary(w io.Writer, r *Report, quiet bool) {
	mode := "real clock"
	if r.Virtual {
		mode = "virtual clock"
	}
	if !quiet {
		fmt.Fprintf(w, "scenario %s (%s, seed %d): %v simulated in %v, %s\n", r.Scenario, mode, r.Config.Seed, r.Ended.D(), r.Wall.D(), r.EndReason)
		s, u := r.Submission, r.Units
		fmt.Fprintf(w, "  submitted %d units in %d groups; refused: %d cycles, %d backpressure, %d other\n", s.Units, s.Groups, s.RefusedCycles, s.RefusedBackpressure, s.RefusedOther)
		fmt.Fprintf(w, "  completed %d, failed %d, skipped %d, cancelled %d, unfinished %d\n", u.Completed, u.Failed, u.Skipped, u.Cancelled, u.Unfinished)
		fmt.Fprintf(w, "  throughput %.1f/min (peak %d); queue wait p50 %.0f p95 %.0f p99 %.0f ms; run p50 %.0f p99 %.0f ms\n",
			r.Throughput.Mean, r.Throughput.Peak, r.Latency.QueueWait.P50, r.Latency.QueueWait.P95, r.Latency.QueueWait.P99, r.Latency.Run.P50, r.Latency.Run.P99)
		fmt.Fprintf(w, "  retries: rate %.3f, %d units retried, %.1f%% of them succeeded; %d deferred (429); priority inversions %d\n",
			r.Retries.Rate, r.Retries.Retried, 100*r.Retries.SuccessAfterRetry, r.Retries.Deferred, r.Priority.Inversions)
		for _, name := range r.Config.serviceNames() {
			sm := r.Services[name]
			fmt.Fprintf(w, "  %-12s calls %d, max %d in a window (mock limit %d), max %d at once, rate-limited %v, circuit opened %d\n",
				name, sm.Checks.Calls, sm.Checks.MaxInWindow, r.Config.Services[name].Behavior.MockLimit, sm.Checks.MaxConcurrent, sm.RateLimited.D().Round(time.Second), sm.Opened)
			if t := r.Config.Services[name].Tokens; t != nil {
				fmt.Fprintf(w, "  %-12s tokens: max %d in a window (mock limit %d per %v), %.1f%% of the limit used while work was submitted\n",
					"", sm.Checks.MaxTokensInWindow, t.MockLimit, t.Window.D(), 100*sm.Checks.TokenUtilisation)
			}
			if sh := sm.Checks.Shared; sh != nil {
				fmt.Fprintf(w, "  %-12s shared key: %.2f%% of runcue's %d calls answered 429; runcue used %.1f%% of what the other client left; %.2f%% of its %d requests refused (%.2f%% with runcue absent)\n",
					"", sh.RefusedPct, sh.Calls, 100*sh.OfLeft, sh.ForeignRefused, sh.Foreign, sh.ForeignAlone)
			}
		}
		if rc := r.Recovery; rc != nil {
			fmt.Fprintf(w, "  recovery: %d kills, %d restarts, %d executions, %d repeated by the kills\n", rc.Kills, rc.Restarts, rc.Executions, rc.Repeated)
		}
	}
	for _, iv := range r.Invariants {
		mark := "PASS"
		if !iv.Pass {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-28s %s\n", mark, iv.Name, iv.Detail)
	}
	if r.Pass {
		fmt.Fprintln(w, "PASS")
	} else {
		fmt.Fprintln(w, "FAIL")
	}
}
