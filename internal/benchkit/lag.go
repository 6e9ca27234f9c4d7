package benchkit

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/sqlite"
)

// LagResult is what Lag measured.
type LagResult struct {
	// MaxAhead is the most handler starts seen ahead of the completions
	// committed to the database: runs a crash would make run again.
	MaxAhead int64
	Elapsed  time.Duration
}

// Lag fills a database at path with n queued no-op units, runs them with
// the given Config (Logger and a default MaxConcurrent of 100 filled in)
// and, every 10ms, compares the handler starts so far with the units a
// second connection sees completed.
func Lag(path string, n int, cfg runcue.Config) (LagResult, error) {
	var res LagResult
	if err := Prefill(path, n, 0); err != nil {
		return res, err
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = 100
	}
	c, err := runcue.Open(path, cfg)
	if err != nil {
		return res, err
	}
	defer c.Close()
	var started atomic.Int64
	if err := c.Task("noop", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) {
		started.Add(1)
		return nil, nil
	}}); err != nil {
		return res, err
	}
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		return res, err
	}
	defer st.Close()
	ctx := context.Background()
	t0 := time.Now()
	if err := c.Start(ctx); err != nil {
		return res, err
	}
	for {
		time.Sleep(10 * time.Millisecond)
		s := started.Load() // before the count: never more than the truth
		counts, err := st.CountActive(ctx)
		if err != nil {
			return res, err
		}
		done := int64(n - counts["noop"])
		res.MaxAhead = max(res.MaxAhead, s-done)
		if done == int64(n) {
			break
		}
	}
	res.Elapsed = time.Since(t0)
	return res, c.Stop(ctx)
}
