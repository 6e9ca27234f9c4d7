// Package hoststest is the multi-process test of executors (Task.Remote),
// shared by the backends that support them: a scheduler and a standby, three
// executors (one with its clock off by a skew), a rate-limited service with
// a token meter, a concurrency cap and a keyed service, units with
// dependencies submitted in a random order, and SIGKILLs of executors and of
// the scheduler; a mock service counts what arrives. Its child processes are
// the test binary itself: a test package's TestMain calls Child first.
package hoststest

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/store"
)

// The child's environment.
const (
	envChild = "RUNCUE_HOSTS_CHILD" // "scheduler" or "executor"
	envMock  = "RUNCUE_HOSTS_MOCK"  // the mock service's URL
	envID    = "RUNCUE_HOSTS_ID"    // an executor's ID
	envSkew  = "RUNCUE_HOSTS_SKEW"  // an executor's clock offset, in ns
	envHold  = "RUNCUE_HOSTS_HOLD"  // how long a first run waits at the service
	envCap   = "RUNCUE_HOSTS_CAP"   // a benchmark executor's capacity
	// envDefaults makes schedulers keep runcue's default Timeout and
	// LeaseBuffer.
	envDefaults = "RUNCUE_HOSTS_DEFAULTS"
)

// The limits every process registers.
const (
	// Limit requests and Tokens tokens per Window arrive at the service.
	Limit  = 20
	Tokens = 800
	Window = 500 * time.Millisecond
	// Pool is the cap of the service every unit holds; Keys the keyed
	// instances (host:0..Keys-1), each of concurrency one.
	Pool = 5
	Keys = 6
	// Capacity is each executor's.
	Capacity = 3
	// wire is the most a call spends on the way to the service.
	wire = 5 * time.Millisecond
)

// Opener opens the test's store from the environment (in the parent and
// in its children).
type Opener func(ctx context.Context) (store.Store, error)

// Child runs this process as a child of the test, if it is one (and then
// never returns): a scheduler ("scheduler"), an executor ("executor"), or
// a benchmark's executor of no-op "noop" and "capped" units ("bench").
func Child(open Opener) {
	mode := os.Getenv(envChild)
	if mode == "" {
		return
	}
	ctx := context.Background()
	// Opened as a supervisor would restart a program that could not: a
	// loaded server may not answer the first connection in time.
	st, err := open(ctx)
	for tries := 1; err != nil && tries < 10; tries++ {
		fmt.Fprintln(os.Stderr, "hosts child: open (trying again):", err)
		time.Sleep(time.Second)
		st, err = open(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hosts child: open:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch mode {
	case "scheduler":
		cfg := runcue.Config{Standby: true, PollInterval: 20 * time.Millisecond, DefaultTimeout: 3 * time.Second,
			LeaseBuffer: 500 * time.Millisecond, Logger: log}
		if os.Getenv(envDefaults) != "" {
			// The default Timeout and LeaseBuffer (30 min + 60 s): a run
			// an outage cuts is requeued by what the process saw, not by
			// its lease.
			cfg.DefaultTimeout, cfg.LeaseBuffer = 0, 0
		}
		c, err := runcue.New(st, cfg)
		if err == nil {
			err = Register(c)
		}
		if err == nil {
			err = c.Start(ctx)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "hosts scheduler:", err)
			os.Exit(2)
		}
		select {} // until killed
	case "executor":
		skew, _ := strconv.ParseInt(os.Getenv(envSkew), 10, 64)
		mock := os.Getenv(envMock)
		x, err := runcue.NewExecutor(st, runcue.ExecutorConfig{ID: os.Getenv(envID), Capacity: Capacity,
			PollInterval: 20 * time.Millisecond, Heartbeat: 100 * time.Millisecond, TTL: 600 * time.Millisecond,
			Clock: skewed{time.Duration(skew)}, Logger: log},
			map[string]runcue.Handler{"call": func(ctx context.Context, w *runcue.Work) (any, error) {
				return call(ctx, mock, time.Duration(skew), w)
			}})
		if err == nil {
			err = x.Run(ctx)
		}
		fmt.Fprintln(os.Stderr, "hosts executor:", err)
		os.Exit(2)
	case "bench":
		capacity, _ := strconv.Atoi(os.Getenv(envCap))
		noop := func(context.Context, *runcue.Work) (any, error) { return nil, nil }
		x, err := runcue.NewExecutor(st, runcue.ExecutorConfig{ID: os.Getenv(envID), Capacity: capacity, Logger: log},
			map[string]runcue.Handler{"noop": noop, "capped": noop})
		if err == nil {
			err = x.Run(ctx)
		}
		fmt.Fprintln(os.Stderr, "hosts executor:", err)
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "hosts child: unknown mode", mode)
	os.Exit(2)
}

// Register registers the test's services and its remote task.
func Register(c *runcue.Cue) error {
	if err := c.Service("api", runcue.Service{RateLimit: Limit, RateWindow: Window, Margin: wire,
		Meters: []runcue.Meter{{Name: "tokens", Limit: Tokens, Window: Window}}}); err != nil {
		return err
	}
	if err := c.Service("pool", runcue.Service{MaxConcurrent: Pool}); err != nil {
		return err
	}
	if err := c.Service("host", runcue.Service{MaxConcurrent: 1}); err != nil {
		return err
	}
	return c.Task("call", runcue.Task{Remote: true, Services: []string{"api", "pool"},
		ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} }})
}

// call is the handler: the wire's seeded delay, the arrival at the mock,
// the service's work, the end told to the mock; it uses part of its
// tokens. The mock counts the arrival at the start plus the seeded delay,
// on the system's clock (this executor's runs skew behind): the wire the
// service's Margin declares, without the local HTTP call's own latency,
// which on a loaded machine can exceed it.
func call(ctx context.Context, mock string, skew time.Duration, w *runcue.Work) (any, error) {
	h := hashOf(fmt.Sprintf("%s/%d", w.ID, w.Attempt))
	delay := time.Duration(h % uint64(wire))
	time.Sleep(delay)
	q := fmt.Sprintf("?id=%s&attempt=%d&pid=%d&key=%s&tokens=%d&arrive=%d", w.ID, w.Attempt, os.Getpid(), w.Target, TokenUse(w.ID),
		w.Started.Add(-skew+delay).UnixNano())
	if err := post(ctx, mock+"/start"+q); err != nil {
		return nil, err
	}
	time.Sleep(5*time.Millisecond + time.Duration(h>>16%uint64(15*time.Millisecond)))
	if hold, _ := time.ParseDuration(os.Getenv(envHold)); hold > 0 && w.Attempt == 1 {
		time.Sleep(hold) // the service takes its time; the executor may be frozen meanwhile
	}
	// The service hears of the end also of a call cancelled meanwhile (its
	// connection closes): the cap it counts is of calls in progress.
	if err := post(context.WithoutCancel(ctx), mock+"/end"+q); err != nil {
		return nil, err
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	w.Used(runcue.Costs{"tokens": TokenUse(w.ID)})
	return nil, nil
}

func post(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// TokenCost is a unit's stated cost in tokens (20 to 100, fixed by its
// ID); TokenUse what its call uses (half to all of it).
func TokenCost(id string) int64 { return 20 + int64(hashOf("cost/"+id)%81) }
func TokenUse(id string) int64 {
	c := TokenCost(id)
	return c/2 + int64(hashOf("use/"+id)%uint64(c/2+1))
}

func hashOf(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// skewed is the system's clock off by d.
type skewed struct{ d time.Duration }

func (s skewed) Now() time.Time                       { return time.Now().Add(s.d) }
func (s skewed) Monotonic() time.Duration             { return clock.Real().Monotonic() }
func (s skewed) NewTimer(d time.Duration) clock.Timer { return clock.Real().NewTimer(d) }
