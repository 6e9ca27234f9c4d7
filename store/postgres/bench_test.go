package postgres_test

import (
	"context"
	"log/slog"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/store/postgres"
)

// BenchmarkRatio is runcue-bench's workload on PostgreSQL beside a raw
// PostgreSQL queue cycle, interleaved in one process, each run on a fresh
// schema: 20,000 no-op units, submitted in batches of 1,000, run by 100
// handlers; the raw cycle inserts 64 units a transaction, claims 64 with
// FOR UPDATE SKIP LOCKED and logs their start, and completes them and logs
// that, a transaction each (synchronous_commit at the server's setting, as
// runcue leaves it). It reports both rates and the ratio of their medians
// over b.N repetitions:
//
//	scripts/with-postgres bash -c 'cd store/postgres && go test -run ^$ -bench Ratio -benchtime 5x'
func BenchmarkRatio(b *testing.B) {
	const units = 20_000
	var raw, rc []float64
	for b.Loop() {
		raw = append(raw, rawCycle(b, units).rate)
		rc = append(rc, runcueRun(b, units).rate)
	}
	mr, mc := median(raw), median(rc)
	b.ReportMetric(mr, "raw-units/s")
	b.ReportMetric(mc, "runcue-units/s")
	b.ReportMetric(mc/mr, "ratio")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// runcueRun submits n no-op units in batches of 1,000 to a Cue with 100
// handlers and returns its stats from the first submission to the last
// completion.
func runcueRun(b *testing.B, n int) runStats { return runcueRunWith(b, n, postgres.Options{}) }

// runcueRunWith is runcueRun on a store opened with opts.
func runcueRunWith(b *testing.B, n int, opts postgres.Options) runStats {
	ctx := context.Background()
	st, err := postgres.Open(ctx, schemaURL(b), opts)
	require.NoError(b, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{MaxConcurrent: 100, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	defer c.Close()
	done := make(chan struct{})
	var completed int
	require.NoError(b, c.Task("noop", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}))
	evs := c.Events(ctx)
	go func() {
		for ev := range evs {
			if ev.Type == runcue.EventWorkCompleted {
				if completed++; completed == n {
					close(done)
				}
			}
		}
	}()
	require.NoError(b, c.Start(ctx))
	span := startSpan()
	batch := make([]runcue.Submission, 1000)
	for i := range batch {
		batch[i] = runcue.Submission{Task: "noop"}
	}
	for range n / len(batch) {
		_, err := c.SubmitBatch(ctx, batch)
		require.NoError(b, err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatal("runcue did not complete the units")
	}
	stats := span.end(n)
	require.NoError(b, c.Stop(ctx))
	return stats
}

// rawCycle runs n units through a minimal hand-written PostgreSQL queue
// and returns its stats.
func rawCycle(b *testing.B, n int) runStats {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, schemaURL(b))
	require.NoError(b, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, args BYTEA, state TEXT NOT NULL,
			attempt INT NOT NULL DEFAULT 0, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ);
		CREATE INDEX jobs_queued ON jobs (id) WHERE state = 'queued';
		CREATE TABLE job_log (n BIGSERIAL PRIMARY KEY, job BIGINT NOT NULL, what TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	require.NoError(b, err)
	const per = 64
	span := startSpan()
	for done := 0; done < n; done += per {
		k := min(per, n-done)
		kinds := make([]string, k)
		for i := range kinds {
			kinds[i] = "noop"
		}
		_, err := pool.Exec(ctx, `INSERT INTO jobs(kind, state) SELECT unnest($1::text[]), 'queued'`, kinds)
		require.NoError(b, err)
		var ids []int64
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `UPDATE jobs SET state = 'running', attempt = attempt + 1, started_at = now()
				WHERE id IN (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id`, per)
			if err != nil {
				return err
			}
			if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO job_log(job, what) SELECT unnest($1::bigint[]), 'started'`, ids)
			return err
		})
		require.NoError(b, err)
		require.Len(b, ids, k)
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = ANY($1)`, ids); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO job_log(job, what) SELECT unnest($1::bigint[]), 'completed'`, ids)
			return err
		})
		require.NoError(b, err)
	}
	return span.end(n)
}

// BenchmarkExecutors is the same workload run by executors in processes of
// their own (hoststest's "bench" children, no-op handlers, 64 runs each at
// once), beside the raw cycle and the raw executors' cycle (rawRemoteCycle:
// the protocol's floor, 3 executors of 64), interleaved, each run on a
// fresh schema: with 1 executor, with 3, with 3 running units of a service
// capped at half their capacity (96 of 192), and with 3 of 256 each
// ("wide": batches four times as large). It reports the medians, the
// ratios to the raw cycle, runcue's 3 executors' ratio to the raw
// executors' cycle, the capped run's share of the uncapped one, the share
// of the 3 executors' runs their scheduler's writer was busy (the
// runcue.store.write_time metric: near 1, its one transaction at a time
// bounds the rate), and (on Linux) the machine's CPU a unit in the raw
// cycle and with 3 executors, the share of the machine busy with 3, and
// the CPU a unit may take for 3 executors to reach half the raw cycle's
// rate on this machine's cores all busy:
//
//	scripts/with-postgres bash -c 'cd store/postgres && go test -run ^$ -bench Executors -benchtime 5x'
func BenchmarkExecutors(b *testing.B) {
	const units, capacity, wideCapacity = 20_000, 64, 256
	var raw, rawRemote, one, three, capped, wide []runStats
	for b.Loop() {
		raw = append(raw, rawCycle(b, units))
		rawRemote = append(rawRemote, rawRemoteCycle(b, units, 3, capacity))
		one = append(one, executorsRun(b, units, 1, capacity, false))
		three = append(three, executorsRun(b, units, 3, capacity, false))
		capped = append(capped, executorsRun(b, units, 3, capacity, true))
		wide = append(wide, executorsRun(b, units, 3, wideCapacity, false))
	}
	rate := func(s []runStats) float64 { return medianOf(s, func(r runStats) float64 { return r.rate }) }
	mr := rate(raw)
	b.ReportMetric(mr, "raw-units/s")
	b.ReportMetric(rate(rawRemote), "raw-executors-units/s")
	b.ReportMetric(rate(one), "1-executor-units/s")
	b.ReportMetric(rate(three), "3-executors-units/s")
	b.ReportMetric(rate(capped), "capped-units/s")
	b.ReportMetric(rate(wide), "3-wide-units/s")
	b.ReportMetric(rate(one)/mr, "1-executor-ratio")
	b.ReportMetric(rate(three)/mr, "3-executors-ratio")
	b.ReportMetric(rate(wide)/mr, "3-wide-ratio")
	b.ReportMetric(rate(three)/rate(rawRemote), "3-executors-of-raw-executors")
	b.ReportMetric(rate(capped)/rate(three), "capped-share")
	b.ReportMetric(medianOf(three, func(r runStats) float64 { return r.writer }), "3-executors-writer-busy")
	b.ReportMetric(medianOf(wide, func(r runStats) float64 { return r.writer }), "3-wide-writer-busy")
	if cpu := medianOf(three, func(r runStats) float64 { return r.cpu }); cpu > 0 {
		b.ReportMetric(medianOf(raw, func(r runStats) float64 { return r.cpu }), "raw-cpu-us/unit")
		b.ReportMetric(cpu, "3-executors-cpu-us/unit")
		b.ReportMetric(medianOf(three, func(r runStats) float64 { return r.busy }), "3-executors-busy")
		b.ReportMetric(float64(runtime.NumCPU())*1e6/(mr/2), "half-raw-budget-cpu-us/unit")
	}
}

// writeTime is the Cue's runcue.store.write_time so far, in seconds.
func writeTime(b *testing.B, r *sdkmetric.ManualReader) float64 {
	var rm metricdata.ResourceMetrics
	require.NoError(b, r.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "runcue.store.write_time" {
				var s float64
				for _, dp := range m.Data.(metricdata.Sum[float64]).DataPoints {
					s += dp.Value
				}
				return s
			}
		}
	}
	b.Fatal("no runcue.store.write_time metric")
	return 0
}

func medianOf(s []runStats, f func(runStats) float64) float64 {
	xs := make([]float64, len(s))
	for i, r := range s {
		xs[i] = f(r)
	}
	return median(xs)
}

// executorsRun runs n no-op units of a remote task through n executors of
// capacity each, and returns its rate from the first submission to the
// last completion, and the machine's CPU it took; with capped,
// the units use a service whose MaxConcurrent is half the executors'
// total capacity.
func executorsRun(b *testing.B, n, executors, capacity int, capped bool) runStats {
	ctx := context.Background()
	u := schemaURL(b)
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(b, err)
	defer st.Close()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	c, err := runcue.New(st, runcue.Config{MaxConcurrent: 1000, Logger: slog.New(slog.DiscardHandler), MeterProvider: mp})
	require.NoError(b, err)
	defer c.Close()
	task := "noop"
	require.NoError(b, c.Task("noop", runcue.Task{Remote: true}))
	require.NoError(b, c.Service("half", runcue.Service{MaxConcurrent: executors * capacity / 2}))
	require.NoError(b, c.Task("capped", runcue.Task{Remote: true, Services: []string{"half"}}))
	if capped {
		task = "capped"
	}
	stop := hoststest.StartBench(b, []string{"RUNCUE_HOSTS_PG=" + u}, executors, capacity)
	defer stop()
	done := make(chan struct{})
	var completed int
	evs := c.Events(ctx)
	go func() {
		for ev := range evs {
			if ev.Type == runcue.EventWorkCompleted {
				if completed++; completed == n {
					close(done)
				}
			}
		}
	}()
	require.NoError(b, c.Start(ctx))
	batch := make([]runcue.Submission, 1000)
	for i := range batch {
		batch[i] = runcue.Submission{Task: task}
	}
	span, written := startSpan(), writeTime(b, reader)
	for range n / len(batch) {
		_, err := c.SubmitBatch(ctx, batch)
		require.NoError(b, err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatal("the executors did not complete the units")
	}
	stats := span.end(n)
	stats.writer = (writeTime(b, reader) - written) / stats.wall.Seconds()
	require.NoError(b, c.Stop(ctx))
	return stats
}

// BenchmarkExecutorsShare is the Throughput issue's measure of executors:
// the same 20,000 no-op units run by one process of 100 handlers
// (runcueRun), by 3 executors of 33 handlers each (in processes of their
// own), and by the raw executors' cycle of 3 executors of 33
// (rawRemoteCycle: the protocol's floor at that concurrency), interleaved,
// each run on a fresh schema. It reports the medians and their shares of
// the one process's rate; a unit's time through the executors' loop
// (claim, assignment, the executor's read and report, the scheduler's read
// and finish) at 99 runs in flight is 99 over their rate. On Linux it
// also reports the machine's CPU a unit (every process: PostgreSQL's, the
// scheduler's, the executors') of each, the share of the machine busy with
// the executors, and the CPU a unit may take for the machine's cores, all
// busy, to run 0.8 of the one process's rate:
//
//	RUNCUE_PG_FSYNC=on scripts/with-postgres bash -c 'cd store/postgres && go test -run ^$ -bench ExecutorsShare -benchtime 5x'
func BenchmarkExecutorsShare(b *testing.B) {
	const units, executors, capacity = 20_000, 3, 33
	var one, three, raw []runStats
	for b.Loop() {
		one = append(one, runcueRun(b, units))
		three = append(three, executorsRun(b, units, executors, capacity, false))
		raw = append(raw, rawRemoteCycle(b, units, executors, capacity))
	}
	rate := func(s []runStats) float64 { return medianOf(s, func(r runStats) float64 { return r.rate }) }
	m := rate(one)
	b.ReportMetric(m, "one-process-units/s")
	b.ReportMetric(rate(three), "3x33-executors-units/s")
	b.ReportMetric(rate(raw), "raw-3x33-executors-units/s")
	b.ReportMetric(rate(three)/m, "3x33-share")
	b.ReportMetric(rate(raw)/m, "raw-3x33-share")
	b.ReportMetric(executors*capacity*1e3/rate(three), "3x33-loop-ms")
	b.ReportMetric(executors*capacity*1e3/rate(raw), "raw-3x33-loop-ms")
	b.ReportMetric(medianOf(three, func(r runStats) float64 { return r.writer }), "3x33-writer-busy")
	if cpu := medianOf(three, func(r runStats) float64 { return r.cpu }); cpu > 0 {
		b.ReportMetric(medianOf(one, func(r runStats) float64 { return r.cpu }), "one-process-cpu-us/unit")
		b.ReportMetric(cpu, "3x33-cpu-us/unit")
		b.ReportMetric(medianOf(raw, func(r runStats) float64 { return r.cpu }), "raw-3x33-cpu-us/unit")
		b.ReportMetric(medianOf(three, func(r runStats) float64 { return r.busy }), "3x33-busy")
		b.ReportMetric(float64(runtime.NumCPU())*1e6/(0.8*m), "0.8-share-budget-cpu-us/unit")
	}
}

// BenchmarkInsertCopy compares the units' rows written by COPY (an insert
// of 16 units or more: SubmitBatch's 1,000 here) with the INSERT that
// wrote them before, on BenchmarkRatio's one-process no-op workload
// (runcueRun), interleaved, each run on a fresh schema, the first of each
// pair alternating; it reports the medians, their ratio, and on Linux
// the machine's CPU a unit of each:
//
//	RUNCUE_PG_FSYNC=on scripts/with-postgres bash -c 'cd store/postgres && go test -run ^$ -bench InsertCopy -benchtime 11x'
func BenchmarkInsertCopy(b *testing.B) {
	const units = 20_000
	var copied, inserted []runStats
	first := true
	for b.Loop() {
		c := func() { copied = append(copied, runcueRun(b, units)) }
		i := func() { inserted = append(inserted, runcueRunWith(b, units, postgres.WithoutCopy(postgres.Options{}))) }
		if first {
			c()
			i()
		} else {
			i()
			c()
		}
		first = !first
	}
	rate := func(s []runStats) float64 { return medianOf(s, func(r runStats) float64 { return r.rate }) }
	b.ReportMetric(rate(copied), "copy-units/s")
	b.ReportMetric(rate(inserted), "insert-units/s")
	b.ReportMetric(rate(copied)/rate(inserted), "copy/insert")
	if cpu := medianOf(copied, func(r runStats) float64 { return r.cpu }); cpu > 0 {
		b.ReportMetric(cpu, "copy-cpu-us/unit")
		b.ReportMetric(medianOf(inserted, func(r runStats) float64 { return r.cpu }), "insert-cpu-us/unit")
	}
}
