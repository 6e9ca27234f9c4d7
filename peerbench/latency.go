package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
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
	var mu sync.Mutex
	started := make(map[string]time.Time, n)
	all := make(chan struct{})
	if err := c.Task("noop", runcue.Task{Services: services, Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		now := time.Now()
		mu.Lock()
		started[w.ID] = now
		if len(started) == n {
			close(all)
		}
		mu.Unlock()
		return nil, nil
	}}); err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	called, returned := make(map[string]time.Time, n), make(map[string]time.Time, n)
	every := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for i := range n {
		time.Sleep(time.Until(next))
		next = next.Add(every)
		id := fmt.Sprint("l", i)
		called[id] = time.Now()
		if _, err := c.Submit(ctx, runcue.Submission{Task: "noop", ID: id}); err != nil {
			return err
		}
		returned[id] = time.Now()
	}
	select {
	case <-all:
	case <-ctx.Done():
		return ctx.Err()
	}
	name := "no-op"
	if limited {
		name = "limited"
	}
	mu.Lock()
	defer mu.Unlock()
	return printLatency(out, fmt.Sprintf("%s, %d units at %.0f/s", name, n, rate), started, called, returned)
}

// pct is the p-th percentile of ds, rounded to a microsecond.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)].Round(time.Microsecond)
}
