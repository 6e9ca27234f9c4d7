// Package benchkit measures runcue against a minimal hand-written SQLite
// queue. It backs cmd/runcue-bench and the package benchmarks.
//
// Absolute figures drift on shared machines; the ratio of runcue's
// throughput to the raw cycle's, measured interleaved in one run, does not.
package benchkit

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/sqlite"
)

// RawCycle runs n units through a minimal queue on raw SQLite: insert,
// claim, log, complete, 64 units per transaction, WAL, one connection, the
// given synchronous setting. It returns units per second.
func RawCycle(dir string, n int, sync sqlite.Synchronous) (float64, error) {
	path := filepath.Join(dir, fmt.Sprintf("raw-%d.db", time.Now().UnixNano()))
	defer removeDB(path)
	mode := "NORMAL"
	if sync == sqlite.Full {
		mode = "FULL"
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous("+mode+")&_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`CREATE TABLE jobs(id INTEGER PRIMARY KEY, kind TEXT NOT NULL, payload TEXT, state TEXT NOT NULL,
			leased_by TEXT, lease_expires INTEGER, result TEXT, created INTEGER NOT NULL, updated INTEGER NOT NULL);
		CREATE INDEX jobs_state ON jobs(state, id);
		CREATE TABLE job_log(id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, event TEXT NOT NULL, at INTEGER NOT NULL);`); err != nil {
		return 0, err
	}
	ins, err := db.Prepare(`INSERT INTO jobs(kind, payload, state, created, updated) VALUES('noop', '{}', 'queued', ?, ?)`)
	if err != nil {
		return 0, err
	}
	claim, err := db.Prepare(`UPDATE jobs SET state='running', leased_by='bench', lease_expires=?, updated=?
		WHERE id IN (SELECT id FROM jobs WHERE state='queued' ORDER BY id LIMIT 64) RETURNING id`)
	if err != nil {
		return 0, err
	}
	logEv, err := db.Prepare(`INSERT INTO job_log(job_id, event, at) VALUES(?, ?, ?)`)
	if err != nil {
		return 0, err
	}
	done, err := db.Prepare(`UPDATE jobs SET state='done', result='null', leased_by=NULL, updated=? WHERE id=?`)
	if err != nil {
		return 0, err
	}
	ctx := context.Background()
	start := time.Now()
	for left := n; left > 0; left -= 64 {
		batch := min(left, 64)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		txIns, txClaim, txLog, txDone := tx.Stmt(ins), tx.Stmt(claim), tx.Stmt(logEv), tx.Stmt(done)
		for range batch {
			now := time.Now().UnixNano()
			if _, err := txIns.Exec(now, now); err != nil {
				tx.Rollback()
				return 0, err
			}
		}
		now := time.Now().UnixNano()
		rows, err := txClaim.Query(now+int64(time.Minute), now)
		if err != nil {
			tx.Rollback()
			return 0, err
		}
		ids := make([]int64, 0, batch)
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				tx.Rollback()
				return 0, err
			}
			ids = append(ids, id)
		}
		rows.Close()
		for _, id := range ids {
			now := time.Now().UnixNano()
			if _, err := txLog.Exec(id, "completed", now); err != nil {
				tx.Rollback()
				return 0, err
			}
			if _, err := txDone.Exec(now, id); err != nil {
				tx.Rollback()
				return 0, err
			}
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

func removeDB(path string) {
	for _, suffix := range []string{"", "-wal", "-shm", ".lock"} {
		os.Remove(path + suffix)
	}
}

// Options describe a runcue throughput run.
type Options struct {
	Units int
	// Submitters > 0 submits one unit per call from that many goroutines;
	// otherwise units are submitted in batches of Batch (default 100).
	Submitters int
	Batch      int
	// MaxConcurrent is the Cue's handler cap. Default 100.
	MaxConcurrent int
	Sync          sqlite.Synchronous
	// Service puts one service (with the given limits) in every unit's path.
	Service *runcue.Service
	// StalledSubscriber subscribes to the events and never reads them.
	StalledSubscriber bool
}

// Result of a runcue throughput run.
type Result struct {
	UnitsPerSec float64
	// SubmitLatency holds one sample per Submit or SubmitBatch call.
	SubmitLatency []time.Duration
	Elapsed       time.Duration
}

// Throughput submits opts.Units no-op units to a fresh Cue on a file and runs
// them all to completion; the clock runs from the first submit to the last
// completion.
func Throughput(dir string, opts Options) (Result, error) {
	if opts.MaxConcurrent == 0 {
		opts.MaxConcurrent = 100
	}
	if opts.Batch == 0 {
		opts.Batch = 100
	}
	path := filepath.Join(dir, fmt.Sprintf("runcue-%d.db", time.Now().UnixNano()))
	defer removeDB(path)
	st, err := sqlite.Open(path, sqlite.Options{Synchronous: opts.Sync})
	if err != nil {
		return Result{}, err
	}
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{MaxConcurrent: opts.MaxConcurrent, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return Result{}, err
	}
	defer c.Close()
	task := runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}
	if opts.Service != nil {
		if err := c.Service("svc", *opts.Service); err != nil {
			return Result{}, err
		}
		task.Services = []string{"svc"}
	}
	if err := c.Task("noop", task); err != nil {
		return Result{}, err
	}
	ctx := context.Background()
	if opts.StalledSubscriber {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_ = c.Events(sctx) // never read
	}
	if err := c.Start(ctx); err != nil {
		return Result{}, err
	}
	var res Result
	var mu sync.Mutex
	record := func(d time.Duration) {
		mu.Lock()
		res.SubmitLatency = append(res.SubmitLatency, d)
		mu.Unlock()
	}
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Value
	if opts.Submitters > 0 {
		var next atomic.Int64
		for range opts.Submitters {
			wg.Go(func() {
				for next.Add(1) <= int64(opts.Units) {
					t := time.Now()
					if _, err := c.Submit(ctx, runcue.Submission{Task: "noop"}); err != nil {
						failed.Store(err)
						return
					}
					record(time.Since(t))
				}
			})
		}
	} else {
		wg.Go(func() {
			for left := opts.Units; left > 0; left -= opts.Batch {
				subs := make([]runcue.Submission, min(left, opts.Batch))
				for i := range subs {
					subs[i] = runcue.Submission{Task: "noop"}
				}
				t := time.Now()
				if _, err := c.SubmitBatch(ctx, subs); err != nil {
					failed.Store(err)
					return
				}
				record(time.Since(t))
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return Result{}, err
	}
	if err := c.Drain(ctx); err != nil {
		return Result{}, err
	}
	res.Elapsed = time.Since(start)
	res.UnitsPerSec = float64(opts.Units) / res.Elapsed.Seconds()
	if err := c.Stop(ctx); err != nil {
		return Result{}, err
	}
	return res, nil
}

// DispatchLatency measures, with MaxConcurrent 1 and a deep queue of no-op
// units, the time from a handler's return to the next handler's start:
// nothing needs a commit in between. It returns one sample per unit after
// the first.
func DispatchLatency(dir string, units int) ([]time.Duration, error) {
	path := filepath.Join(dir, fmt.Sprintf("latency-%d.db", time.Now().UnixNano()))
	defer removeDB(path)
	c, err := runcue.Open(path, runcue.Config{MaxConcurrent: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var mu sync.Mutex
	var lastEnd time.Time
	samples := make([]time.Duration, 0, units)
	err = c.Task("noop", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) {
		now := time.Now()
		mu.Lock()
		if !lastEnd.IsZero() {
			samples = append(samples, now.Sub(lastEnd))
		}
		lastEnd = time.Now() // the handler returns right after this
		mu.Unlock()
		return nil, nil
	}})
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	subs := make([]runcue.Submission, units)
	for i := range subs {
		subs[i] = runcue.Submission{Task: "noop"}
	}
	if _, err := c.SubmitBatch(ctx, subs); err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	if err := c.Drain(ctx); err != nil {
		return nil, err
	}
	if err := c.Stop(ctx); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return samples, nil
}

// Percentile returns the p-th percentile (0..100) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p / 100 * float64(len(s)-1))
	return s[i]
}

// Median returns the median of xs.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// RateResult is the outcome of a rate-limited run.
type RateResult struct {
	// Achieved is handler starts per second over the measured span.
	Achieved float64
	// MaxInWindow is the most handler starts (Work.Started) found in any
	// interval of the window's length: the instant the rate promise is about.
	MaxInWindow int
	Dispatches  int
}

// RateLimited runs a deep queue of no-op units through one service limited
// to limit starts per window, on the real clock, for span, and measures the
// rate from the handlers' own record of their start instants
// (Work.Started).
func RateLimited(dir string, limit int, window, span time.Duration) (RateResult, error) {
	path := filepath.Join(dir, fmt.Sprintf("rate-%d.db", time.Now().UnixNano()))
	defer removeDB(path)
	c, err := runcue.Open(path, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return RateResult{}, err
	}
	defer c.Close()
	if err := c.Service("api", runcue.Service{RateLimit: limit, RateWindow: window}); err != nil {
		return RateResult{}, err
	}
	var mu sync.Mutex
	var times []time.Time
	if err := c.Task("call", runcue.Task{Services: []string{"api"},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			mu.Lock()
			times = append(times, w.Started)
			mu.Unlock()
			return nil, nil
		}}); err != nil {
		return RateResult{}, err
	}
	ctx := context.Background()
	n := int(float64(limit)*(span.Seconds()/window.Seconds())*1.3) + limit
	for left := n; left > 0; left -= 1000 {
		subs := make([]runcue.Submission, min(left, 1000))
		for i := range subs {
			subs[i] = runcue.Submission{Task: "call"}
		}
		if _, err := c.SubmitBatch(ctx, subs); err != nil {
			return RateResult{}, err
		}
	}
	if err := c.Start(ctx); err != nil {
		return RateResult{}, err
	}
	time.Sleep(span + window)
	if err := c.StopAndCancel(ctx); err != nil {
		return RateResult{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	if len(times) == 0 {
		return RateResult{}, fmt.Errorf("no handler started")
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	var res RateResult
	// The measured span starts at the first start.
	end := times[0].Add(span)
	for _, t := range times {
		if t.Before(end) {
			res.Dispatches++
		}
	}
	res.Achieved = float64(res.Dispatches) / span.Seconds()
	for i, j := 0, 0; i < len(times); i++ {
		for times[i].Sub(times[j]) >= window {
			j++
		}
		res.MaxInWindow = max(res.MaxInWindow, i-j+1)
	}
	return res, nil
}

// SoakPoint is the memory of a Cue after it has processed Units units.
type SoakPoint struct {
	Units int
	// LiveHeap is the heap in use after a garbage collection, in bytes.
	LiveHeap uint64
	// RSS is the process's resident set, in bytes (0 where /proc is absent).
	RSS uint64
	// Elapsed is the time since the first submission.
	Elapsed time.Duration
}

// Soak runs no-op units through one Cue with the default configuration
// (30-minute timeouts, the real clock), submitting 10,000 at a time and
// draining, and measures the live heap once each checkpoint of processed
// units is passed. Memory that grows with history shows as growth between
// checkpoints.
func Soak(dir string, checkpoints []int) ([]SoakPoint, error) {
	path := filepath.Join(dir, fmt.Sprintf("runcue-soak-%d.db", time.Now().UnixNano()))
	defer removeDB(path)
	c, err := runcue.Open(path, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.Task("noop", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}); err != nil {
		return nil, err
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	const chunk = 10_000
	var out []SoakPoint
	start := time.Now()
	done := 0
	for _, cp := range checkpoints {
		for done < cp {
			n := min(chunk, cp-done)
			for left := n; left > 0; left -= 1000 {
				subs := make([]runcue.Submission, min(left, 1000))
				for i := range subs {
					subs[i] = runcue.Submission{Task: "noop"}
				}
				if _, err := c.SubmitBatch(ctx, subs); err != nil {
					return nil, err
				}
			}
			if err := c.Drain(ctx); err != nil {
				return nil, err
			}
			done += n
		}
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		out = append(out, SoakPoint{Units: done, LiveHeap: ms.HeapAlloc, RSS: rss(), Elapsed: time.Since(start)})
	}
	return out, c.Stop(ctx)
}

// rss returns the process's resident set size from /proc/self/status.
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
