package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
)

// The recovery scenario's child process: environment variables tell it
// what to run.
const (
	envChild  = "RUNCUE_SIM_CHILD"
	envConfig = "RUNCUE_SIM_CONFIG"
	envDB     = "RUNCUE_SIM_DB"
	envMocks  = "RUNCUE_SIM_MOCKS"
)

func isChild() bool { return os.Getenv(envChild) == "1" }

// callRequest is a child's handler calling the parent's mocks.
type callRequest struct {
	Task    string `json:"task"`
	Unit    string `json:"unit"`
	Attempt int    `json:"attempt"`
	Started int64  `json:"started"` // Work.Started, Unix ns
}

// callAnswer is the mocks' answer.
type callAnswer struct {
	Answer  string `json:"answer"`
	Service string `json:"service,omitempty"`
}

// childMain runs the Cue of the recovery scenario: it owns the database,
// calls the parent's mocks from its handlers, and exits 0 once Drain says
// all work is done. The parent kills it with SIGKILL at moments of its
// choosing.
func childMain() int {
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv(envConfig)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "runcue-sim child:", err)
		return exitUsage
	}
	if err := cfg.normalize(); err != nil {
		fmt.Fprintln(os.Stderr, "runcue-sim child:", err)
		return exitUsage
	}
	e := &engine{cfg: cfg, clk: clock.Real(), opt: options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}}
	c, err := runcue.Open(os.Getenv(envDB), e.cueConfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, "runcue-sim child:", err)
		return exitUsage
	}
	defer c.Close()
	client := &http.Client{}
	url := "http://" + os.Getenv(envMocks) + "/call"
	remote := func(task string) runcue.Handler {
		return func(ctx context.Context, w *runcue.Work) (any, error) {
			body, _ := json.Marshal(callRequest{Task: task, Unit: w.ID, Attempt: w.Attempt, Started: w.Started.UnixNano()})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
			if err != nil {
				return nil, err
			}
			resp, err := client.Do(req)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			var a callAnswer
			if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
				return nil, err
			}
			for v := range verdictNames {
				if verdictNames[v] == a.Answer {
					m := &mock{name: a.Service, cfg: cfg.Services[a.Service]}
					return nil, answerErr(verdict(v), m)
				}
			}
			return nil, context.Cause(ctx) // "cut": the call ended with our context
		}
	}
	if err := e.register(c, remote); err != nil {
		fmt.Fprintln(os.Stderr, "runcue-sim child:", err)
		return exitUsage
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "runcue-sim child:", err)
		return exitUsage
	}
	if err := c.Drain(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "runcue-sim child:", err)
		return exitUsage
	}
	return exitPass
}

// serveMocks answers the child's calls with the engine's mocks: arrivals
// are counted at the child's handler-start instant, in this process, which
// the kills do not touch.
func (e *engine) serveMocks(executions map[string]int, mu *sync.Mutex) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req callRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		executions[req.Unit]++
		mu.Unlock()
		_, bad, answer, _, _ := e.call(r.Context(), e.taskMocks(req.Task), req.Unit, req.Attempt, time.Unix(0, req.Started), nil)
		a := callAnswer{Answer: answer}
		if bad != nil {
			a.Service = bad.name
		}
		json.NewEncoder(w).Encode(a)
	})
}

// runRecovery runs the recovery scenario: the parent submits the
// workload to the database, serves the mocks, and runs the Cue in a child
// process that it SIGKILLs cfg.Kills times at random moments (restarting
// it each time) before letting the last one drain the queue. It then
// checks the database: no accepted unit lost, none with two completion
// records, and it counts the handler executions the kills repeated.
func runRecovery(ctx context.Context, cfg Config, db string, stderr io.Writer) (*Report, error) {
	if cfg.Kills == 0 {
		cfg.Kills = 6
	}
	tmp, err := os.MkdirTemp("", "runcue-sim-recovery-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if db == "" {
		db = filepath.Join(tmp, "recovery.db")
	}
	e, err := newEngine(cfg, options{DB: db})
	if err != nil {
		return nil, err
	}
	cfg = e.cfg // normalized
	e.wallStart = time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	closeAll, err := e.record(ctx)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	// The whole workload is submitted first: the child then has work for
	// every kill.
	for e.gen.peek() < cfg.Duration.D() {
		if err := e.submit(ctx, e.gen.pop()); err != nil {
			return nil, err
		}
	}
	executions := map[string]int{}
	var mu sync.Mutex
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: e.serveMocks(executions, &mu)}
	go srv.Serve(ln)
	defer srv.Close()

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cfgJSON, _ := json.Marshal(cfg)
	spawn := func() (*exec.Cmd, error) {
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), envChild+"=1", envConfig+"="+string(cfgJSON), envDB+"="+db, envMocks+"="+ln.Addr().String())
		cmd.Stdout, cmd.Stderr = stderr, stderr
		return cmd, cmd.Start()
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x4b1))
	rm := &RecoveryMetrics{}
	for rm.Kills < cfg.Kills {
		cmd, err := spawn()
		if err != nil {
			return nil, err
		}
		rm.Restarts++
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case <-time.After(time.Duration(300+rng.IntN(900)) * time.Millisecond):
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			rm.Kills++
		case err := <-exited:
			// It drained the queue before the kill: nothing left to kill.
			if err != nil {
				return nil, fmt.Errorf("child: %w", err)
			}
			return nil, fmt.Errorf("the child finished all work after %d kills of %d: submit more work (--duration) or kill sooner", rm.Kills, cfg.Kills)
		case <-ctx.Done():
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			return nil, ctx.Err()
		}
	}
	cmd, err := spawn()
	if err != nil {
		return nil, err
	}
	rm.Restarts++
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return nil, fmt.Errorf("last child: %w", err)
		}
		e.endReason = "drained"
	case <-time.After(cfg.Drain.D() + 2*time.Minute):
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
		e.endReason = "drain time out"
	}
	e.ended = time.Since(e.epoch)
	if err := e.catchUp(ctx); err != nil {
		return nil, err
	}
	rep, err := e.report(ctx)
	if err != nil {
		return nil, err
	}
	mu.Lock()
	for _, n := range executions {
		rm.Executions += n
		rm.Repeated += n - 1
	}
	mu.Unlock()
	rep.Recovery = rm
	rep.Invariants = append(rep.Invariants, Invariant{Name: "kills_performed", Pass: rm.Kills >= cfg.Kills,
		Detail: fmt.Sprintf("%d SIGKILLs of the child (%d asked), %d starts; %d handler executions, %d repeated by the kills", rm.Kills, cfg.Kills, rm.Restarts, rm.Executions, rm.Repeated)})
	rep.Pass = rep.Pass && rm.Kills >= cfg.Kills
	if rep.Units.Unfinished > 0 && !errors.Is(ctx.Err(), context.Canceled) {
		rep.Pass = false
	}
	return rep, nil
}
