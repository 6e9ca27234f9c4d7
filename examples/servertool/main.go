// Command servertool is the spec's server-management flow with harmless
// local commands standing in for ssh: scan each host's inventory, generate
// a configuration (an LLM call, here a function), validate it in the
// process pool, deploy it to each host, and verify the deployment.
//
//	go run ./examples/servertool
//
// Hosts are directories under a temporary work directory. Each host is a
// keyed service "ssh:<host>" with MaxConcurrent 1: one operation per host
// at a time, as on production servers. The whole flow is one graph of
// units submitted in one batch.
package main

import (
	"context"
	"encoding/json"

	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/proc"
)

var hosts = []string{"prod-1", "prod-2", "staging"}

// config is what generate_config produces for a host.
type config struct {
	Host     string `json:"host"`
	Workers  int    `json:"workers"`
	Upstream string `json:"upstream"`
}

func main() {
	registerPoolHandlers()
	proc.Main() // pool workers and command supervisors end here
	work := flag.String("dir", "", "work directory (default: a new temporary one)")
	flag.Parse()
	if *work == "" {
		dir, err := os.MkdirTemp("", "runcue-servertool")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		*work = dir
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *work, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// registerPoolHandlers registers the handlers pool workers serve. It runs in
// the orchestrator and in its workers (the same binary).
func registerPoolHandlers() {
	proc.Register("validate_config", func(ctx context.Context, w *runcue.Work) (any, error) {
		var hostsSeen []string
		for _, h := range hosts {
			b, err := os.ReadFile(filepath.Join(w.Target, "out", h+".json"))
			if err != nil {
				return nil, err
			}
			var c config
			if err := json.Unmarshal(b, &c); err != nil {
				return nil, runcue.Permanent(fmt.Errorf("%s: %w", h, err))
			}
			if c.Workers < 1 || c.Upstream == "" {
				return nil, runcue.Permanent(fmt.Errorf("%s: invalid configuration %+v", h, c))
			}
			hostsSeen = append(hostsSeen, h)
		}
		return map[string]any{"valid": hostsSeen, "validator_pid": os.Getpid()}, nil
	})
}

func run(ctx context.Context, work string, out *os.File) error {
	for _, h := range hosts {
		if err := os.MkdirAll(filepath.Join(work, "hosts", h, "etc"), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(work, "out"), 0o755); err != nil {
		return err
	}
	cue, err := runcue.Open(filepath.Join(work, "servertool.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer cue.Close()
	pool, err := proc.NewPool(cue, proc.PoolOptions{Size: 2})
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := register(cue, pool, work); err != nil {
		return err
	}
	events := cue.Events(ctx)
	if err := cue.Start(ctx); err != nil {
		return err
	}
	subs := plan(work)
	if _, err := cue.SubmitBatch(ctx, subs); err != nil {
		return err
	}
	start := time.Now()
	finished, failed := 0, 0
	for ev := range events {
		switch ev.Type {
		case runcue.EventWorkStarted:
			fmt.Fprintf(out, "%6s  start   %s\n", since(start), ev.WorkID)
		case runcue.EventWorkCompleted:
			finished++
			fmt.Fprintf(out, "%6s  done    %s\n", since(start), ev.WorkID)
		case runcue.EventWorkFailed:
			if !ev.WillRetry {
				finished++
				failed++
			}
			fmt.Fprintf(out, "%6s  FAILED  %s: %s\n", since(start), ev.WorkID, ev.Error)
		}
		if finished == len(subs) {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := cue.Stop(ctx); err != nil {
		return err
	}
	for _, h := range hosts {
		wi, err := cue.Get(ctx, "verify/"+h)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: %s\n", h, wi.State)
	}
	if failed > 0 {
		return fmt.Errorf("%d units failed", failed)
	}
	fmt.Fprintf(out, "deployed and verified on %d hosts in %s\n", len(hosts), since(start))
	return nil
}

func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }

func register(cue *runcue.Cue, pool *proc.Pool, work string) error {
	// One operation per host: a keyed service, "ssh:<host>".
	if err := cue.Service("ssh", runcue.Service{MaxConcurrent: 1}); err != nil {
		return err
	}
	if err := cue.Service("anthropic", runcue.Service{MaxConcurrent: 3, RateLimit: 30, RateWindow: time.Minute}); err != nil {
		return err
	}
	perHost := func(w *runcue.Work) []string { return []string{"ssh:" + w.Target} }
	shell := proc.CommandOptions{Grace: 2 * time.Second}
	tasks := map[string]runcue.Task{
		"scan_inventory": {ServiceKeys: perHost, Retry: runcue.RetryPolicy{MaxAttempts: 2},
			Handler: proc.Command(func(ctx context.Context, w *runcue.Work) (proc.Cmd, error) {
				return proc.Cmd{Args: []string{"uname", "-sr"}, Dir: filepath.Join(work, "hosts", w.Target)}, nil // ssh host uname -sr
			}, shell)},
		"generate_config": {Services: []string{"anthropic"}, Retry: runcue.RetryPolicy{MaxAttempts: 3},
			Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
				for i, h := range hosts {
					b, _ := json.MarshalIndent(config{Host: h, Workers: 2 + i, Upstream: "10.0.0." + fmt.Sprint(10+i)}, "", "  ")
					if err := os.WriteFile(filepath.Join(work, "out", h+".json"), b, 0o644); err != nil {
						return nil, err
					}
				}
				return map[string]int{"configs": len(hosts)}, nil
			}},
		"validate_config": {Services: []string{pool.Service()}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
			Handler: pool.Handler("validate_config")},
		"deploy_config": {ServiceKeys: perHost, Retry: runcue.RetryPolicy{MaxAttempts: 2},
			Handler: proc.Command(func(ctx context.Context, w *runcue.Work) (proc.Cmd, error) {
				return proc.Cmd{Args: []string{"cp", filepath.Join(work, "out", w.Target+".json"),
					filepath.Join(work, "hosts", w.Target, "etc", "app.json")}}, nil // scp + reload
			}, shell)},
		"verify_deployment": {ServiceKeys: perHost, Retry: runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: 100 * time.Millisecond},
			Handler: proc.Command(func(ctx context.Context, w *runcue.Work) (proc.Cmd, error) {
				return proc.Cmd{Args: []string{"cmp", filepath.Join(work, "out", w.Target+".json"),
					filepath.Join(work, "hosts", w.Target, "etc", "app.json")}}, nil
			}, proc.CommandOptions{PermanentExitCodes: []int{2}})},
	}
	for name, t := range tasks {
		if err := cue.Task(name, t); err != nil {
			return err
		}
	}
	return nil
}

// plan is the whole flow as one graph.
func plan(work string) []runcue.Submission {
	var subs, scans []runcue.Submission
	var scanIDs []string
	for _, h := range hosts {
		id := "scan/" + h
		scanIDs = append(scanIDs, id)
		scans = append(scans, runcue.Submission{Task: "scan_inventory", ID: id, Target: h})
	}
	subs = append(subs, scans...)
	subs = append(subs,
		runcue.Submission{Task: "generate_config", ID: "generate", Target: work, DependsOn: scanIDs},
		runcue.Submission{Task: "validate_config", ID: "validate", Target: work, DependsOn: []string{"generate"}})
	for _, h := range hosts {
		subs = append(subs,
			runcue.Submission{Task: "deploy_config", ID: "deploy/" + h, Target: h, DependsOn: []string{"validate"}},
			runcue.Submission{Task: "verify_deployment", ID: "verify/" + h, Target: h, DependsOn: []string{"deploy/" + h}})
	}
	return subs
}
