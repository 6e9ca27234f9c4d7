package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/postgres"
)

// latency measures, in one process, the time from Submit to the handler's
// start: n units submitted one at a time, every 1/rate, each measured from
// Submit's call and from its return (the unit is stored then). limited
// gives the task the limited workload's service (a cap and a rate window
// that do not bind: each start is logged ahead of the handler).
func latency(ctx context.Context, out io.Writer, base string, n int, rate float64, limited bool) error {
	u, _, drop, err := withSchema(ctx, base)
	if err != nil {
		return err
	}
	defer drop()
	st, err := postgres.Open(ctx, u, postgres.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer c.Close()
	var services []string
	if limited {
		if err := c.Service("api", runcue.Service{MaxConcurrent: 1000, RateLimit: 1_000_000, RateWindow: time.Second}); err != nil {
			return err
		}
		services = []string{"api"}
	}
	sn := newStarts(n)
	if err := c.Task("noop", runcue.Task{Services: services, Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		sn.add(w.ID, time.Now())
		return nil, nil
	}}); err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	called, returned := make(map[string]time.Time, n), make(map[string]time.Time, n)
	if err := submitSteady(ctx, c, n, rate, func(id string, call, ret time.Time) { called[id], returned[id] = call, ret }); err != nil {
		return err
	}
	name := "no-op"
	if limited {
		name = "limited"
	}
	return sn.report(ctx, out, fmt.Sprintf("%s, %d units at %.0f/s", name, n, rate), called, returned)
}

// submitSteady submits n no-op units, l0 to l<n-1>, one every 1/rate, and
// gives each one's ID and the instants Submit was called and returned to
// each.
func submitSteady(ctx context.Context, c *runcue.Cue, n int, rate float64, each func(id string, called, returned time.Time)) error {
	every := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for i := range n {
		time.Sleep(time.Until(next))
		next = next.Add(every)
		id := fmt.Sprint("l", i)
		called := time.Now()
		if _, err := c.Submit(ctx, runcue.Submission{Task: "noop", ID: id}); err != nil {
			return err
		}
		each(id, called, time.Now())
	}
	return nil
}

// starts collects the instants the measured units' handlers started (IDs
// from submitSteady; others, and a unit's later runs, are not counted).
type starts struct {
	mu  sync.Mutex
	at  map[string]time.Time
	n   int
	all chan struct{} // closed when n have started
}

func newStarts(n int) *starts {
	return &starts{at: make(map[string]time.Time, n), n: n, all: make(chan struct{})}
}

func (s *starts) add(id string, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, seen := s.at[id]; seen || !strings.HasPrefix(id, "l") || len(s.at) == s.n {
		return
	}
	if s.at[id] = t; len(s.at) == s.n {
		close(s.all)
	}
}

// report waits until every unit has started and prints the percentiles
// from each unit's Submit call and return to its handler's start.
func (s *starts) report(ctx context.Context, out io.Writer, name string, called, returned map[string]time.Time) error {
	select {
	case <-s.all:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var fromCall, fromReturn []time.Duration
	for id, c := range called {
		at, ok := s.at[id]
		if !ok {
			return fmt.Errorf("peerbench: unit %s submitted, never started", id)
		}
		fromCall, fromReturn = append(fromCall, at.Sub(c)), append(fromReturn, at.Sub(returned[id]))
	}
	fmt.Fprintf(out, "latency, %s: Submit's call to the handler's start p50 %s p99 %s; Submit's return to the start p50 %s p99 %s\n",
		name, pct(fromCall, 50), pct(fromCall, 99), pct(fromReturn, 50), pct(fromReturn, 99))
	return nil
}

// pct is the p-th percentile of ds, rounded to a microsecond.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)].Round(time.Microsecond)
}
