// Command peerbench runs runcue on PostgreSQL and River (on pgx v5) against
// one server in one run, interleaved, on the same workload, and prints
// both rates, their ratio, and each side's CPU (this process's, and the
// server's when it runs on this host). It is a module of its own, so that
// the library's go.mod never requires River.
//
//	go -C peerbench run . -url "$RUNCUE_TEST_POSTGRES"
//
// The workload: n no-op units (jobs) inserted in batches, run by a number
// of handlers (workers) at once; the clock starts at the first insert and
// stops at the last handler's return. Each run uses a fresh schema. The
// second workload (-workload limited) gives runcue's units a service with
// a cap and a rate window that do not bind, so that a shortcut that helps
// only unlimited services shows.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/postgres"
)

// workload is what one run does.
type workload struct {
	n, batch, workers int
	limited           bool
	// fetchCooldown and fetchPoll are River's FetchCooldown and
	// FetchPollInterval: its defaults (100 ms, 1 s) cap a queue at
	// MaxWorkers jobs a cooldown (1,000 jobs/s with 100 workers), so a
	// throughput comparison lowers them, as a River user after throughput
	// would.
	fetchCooldown, fetchPoll time.Duration
}

// result is one run's measurement.
type result struct {
	elapsed   time.Duration
	n         int
	procCPU   time.Duration
	serverCPU time.Duration // -1 when the server's processes cannot be read
}

func (r result) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

// cpuPer1000 is CPU a thousand units, in seconds.
func cpuPer1000(d time.Duration, n int) float64 { return d.Seconds() * 1000 / float64(n) }

// withSchema creates a fresh schema and returns base's URL using it, and
// a function that drops it.
func withSchema(ctx context.Context, base string) (string, string, func(), error) {
	schema := fmt.Sprintf("peer_%d_%d", time.Now().UnixNano(), rand.IntN(1000))
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", "", nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", "", nil, err
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", "", nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	drop := func() {
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	}
	return u.String(), schema, drop, nil
}

// meter reads this process's CPU and the server's (every process named
// postgres on this host: its backends, the writer, the WAL writer, ...).
type meter struct{ proc, server time.Duration }

func readMeter() meter {
	m := meter{proc: processCPU(), server: -1}
	if s, ok := serverCPU(); ok {
		m.server = s
	}
	return m
}

// serverCPU sums the CPU of the processes named postgres (Linux /proc; a
// clock tick is 10 ms on Linux's usual USER_HZ). ok is false where there
// is no /proc.
func serverCPU() (time.Duration, bool) {
	dirs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil || len(dirs) == 0 {
		return 0, false
	}
	var ticks int64
	found := false
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < 0 || !strings.HasPrefix(s[open+1:closing], "postgres") {
			continue
		}
		fields := strings.Fields(s[closing+2:])
		if len(fields) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(fields[11], 10, 64)
		k, _ := strconv.ParseInt(fields[12], 10, 64)
		ticks += u + k
		found = true
	}
	return time.Duration(ticks) * 10 * time.Millisecond, found
}

func (a meter) since(b meter) (proc, server time.Duration) {
	proc = a.proc - b.proc
	server = -1
	if a.server >= 0 && b.server >= 0 {
		server = a.server - b.server
	}
	return proc, server
}

// runRuncue runs w on runcue: postgres.Open and runcue.New in this
// process, the units submitted with SubmitBatch.
func runRuncue(ctx context.Context, base string, w workload) (result, error) {
	u, _, drop, err := withSchema(ctx, base)
	if err != nil {
		return result{}, err
	}
	defer drop()
	st, err := postgres.Open(ctx, u, postgres.Options{})
	if err != nil {
		return result{}, err
	}
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{MaxConcurrent: w.workers, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	var services []string
	if w.limited {
		// A cap and a window that do not bind.
		if err := c.Service("api", runcue.Service{MaxConcurrent: 10 * w.workers, RateLimit: 1_000_000, RateWindow: time.Second}); err != nil {
			return result{}, err
		}
		services = []string{"api"}
	}
	var done atomic.Int64
	var last atomic.Int64
	finished := make(chan struct{})
	if err := c.Task("noop", runcue.Task{Services: services, Handler: func(context.Context, *runcue.Work) (any, error) {
		if done.Add(1) == int64(w.n) {
			last.Store(time.Now().UnixNano())
			close(finished)
		}
		return nil, nil
	}}); err != nil {
		return result{}, err
	}
	if err := c.Start(ctx); err != nil {
		return result{}, err
	}
	m0, start := readMeter(), time.Now()
	for i := 0; i < w.n; i += w.batch {
		subs := make([]runcue.Submission, min(w.batch, w.n-i))
		for j := range subs {
			subs[j] = runcue.Submission{Task: "noop"}
		}
		if _, err := c.SubmitBatch(ctx, subs); err != nil {
			return result{}, err
		}
	}
	select {
	case <-finished:
	case <-ctx.Done():
		return result{}, fmt.Errorf("runcue: %d of %d ran: %w", done.Load(), w.n, ctx.Err())
	}
	proc, server := readMeter().since(m0)
	return result{elapsed: time.Unix(0, last.Load()).Sub(start), n: w.n, procCPU: proc, serverCPU: server}, nil
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	n        int64
	done     atomic.Int64
	last     atomic.Int64
	finished chan struct{}
}

func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	if w.done.Add(1) == w.n {
		w.last.Store(time.Now().UnixNano())
		close(w.finished)
	}
	return nil
}

// runRiver runs w on River: its client in this process on pgx v5, its
// tables migrated into a fresh schema, the jobs inserted with
// InsertManyFast (River's bulk path, COPY).
func runRiver(ctx context.Context, base string, w workload) (result, error) {
	u, schema, drop, err := withSchema(ctx, base)
	if err != nil {
		return result{}, err
	}
	defer drop()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schema})
	if err != nil {
		return result{}, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return result{}, err
	}
	worker := &noopWorker{n: int64(w.n), finished: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	client, err := river.NewClient(driver, &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: w.workers}},
		Workers: workers, Schema: schema, Logger: slog.New(slog.DiscardHandler),
		FetchCooldown: w.fetchCooldown, FetchPollInterval: w.fetchPoll,
	})
	if err != nil {
		return result{}, err
	}
	if err := client.Start(ctx); err != nil {
		return result{}, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()
	m0, start := readMeter(), time.Now()
	for i := 0; i < w.n; i += w.batch {
		params := make([]river.InsertManyParams, min(w.batch, w.n-i))
		for j := range params {
			params[j] = river.InsertManyParams{Args: noopArgs{}}
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return result{}, err
		}
	}
	select {
	case <-worker.finished:
	case <-ctx.Done():
		return result{}, fmt.Errorf("river: %d of %d ran: %w", worker.done.Load(), w.n, ctx.Err())
	}
	proc, server := readMeter().since(m0)
	return result{elapsed: time.Unix(0, worker.last.Load()).Sub(start), n: w.n, procCPU: proc, serverCPU: server}, nil
}

var errNoURL = errors.New("peerbench: no database: pass -url or set RUNCUE_TEST_POSTGRES")
