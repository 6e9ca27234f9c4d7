package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// rawRemoteCycle runs n no-op units through a minimal hand-written form of
// the executors' protocol, and returns units per second: the floor of what
// any scheduler that decides every start and hands it to executors through
// PostgreSQL costs on this machine. One scheduler connection claims units
// for the room its executors have (FOR UPDATE SKIP LOCKED, logging their
// start, as the raw cycle does), writes an assignment row per unit and
// notifies the executors, in one transaction; each executor (a goroutine
// with connections of its own, capacity at once) reads its assignments at
// its notification and reports their ends in one statement that notifies
// the scheduler; the scheduler reads the reports and completes their units
// (logging it) and deletes their assignments in one transaction. Nothing
// else: no events, leases, heartbeats, start reports or clocks.
func rawRemoteCycle(b *testing.B, n, executors, capacity int) runStats {
	ctx := context.Background()
	u := schemaURL(b)
	pool, err := pgxpool.New(ctx, u)
	require.NoError(b, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, args BYTEA, state TEXT NOT NULL,
			attempt INT NOT NULL DEFAULT 0, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ);
		CREATE INDEX jobs_queued ON jobs (id) WHERE state = 'queued';
		CREATE TABLE job_log (n BIGSERIAL PRIMARY KEY, job BIGINT NOT NULL, what TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now());
		CREATE TABLE assignments (job BIGINT PRIMARY KEY, executor INT NOT NULL, state INT NOT NULL DEFAULT 0);
		CREATE INDEX assignments_executor ON assignments (executor)`)
	require.NoError(b, err)
	r := make([]byte, 6)
	_, _ = rand.Read(r)
	ch := "raw_" + hex.EncodeToString(r) // NOTIFY's channels are the database's
	listen, err := pgx.Connect(ctx, u)
	require.NoError(b, err)
	defer listen.Close(ctx)
	_, err = listen.Exec(ctx, `LISTEN `+ch+`_r`)
	require.NoError(b, err)
	ectx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	ready := make(chan error, executors)
	for e := range executors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rawExecutor(ectx, u, ch, e, ready)
		}()
	}
	defer func() { stop(); wg.Wait() }()
	for range executors {
		require.NoError(b, <-ready)
	}

	span := startSpan()
	kinds := make([]string, 1000)
	for i := range kinds {
		kinds[i] = "noop"
	}
	for done := 0; done < n; done += len(kinds) {
		_, err := pool.Exec(ctx, `INSERT INTO jobs(kind, state) SELECT unnest($1::text[]), 'queued'`, kinds[:min(len(kinds), n-done)])
		require.NoError(b, err)
	}
	inflight := make([]int, executors)
	claimed, completed := 0, 0
	for completed < n {
		var ids []int64
		var execs []int32
		rows, err := pool.Query(ctx, `SELECT job, executor FROM assignments WHERE state = 2`)
		require.NoError(b, err)
		for rows.Next() {
			var id int64
			var e int32
			require.NoError(b, rows.Scan(&id, &e))
			ids, execs = append(ids, id), append(execs, e)
		}
		require.NoError(b, rows.Err())
		if len(ids) > 0 {
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = ANY($1)`, ids); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO job_log(job, what) SELECT unnest($1::bigint[]), 'completed'`, ids); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `DELETE FROM assignments WHERE job = ANY($1)`, ids)
				return err
			})
			require.NoError(b, err)
			for _, e := range execs {
				inflight[e]--
			}
			completed += len(ids)
		}
		room := 0
		for _, k := range inflight {
			room += capacity - k
		}
		got := 0
		if room > 0 && claimed < n {
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, `UPDATE jobs SET state = 'running', attempt = attempt + 1, started_at = now()
					WHERE id IN (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id`, room)
				if err != nil {
					return err
				}
				ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				if err != nil {
					return err
				}
				got = len(ids)
				if _, err := tx.Exec(ctx, `INSERT INTO job_log(job, what) SELECT unnest($1::bigint[]), 'started'`, ids); err != nil {
					return err
				}
				// Each unit to the executor with the most room.
				to := make([]int32, len(ids))
				assigned := make([]bool, executors)
				for i := range ids {
					best := 0
					for e := range inflight {
						if inflight[e] < inflight[best] {
							best = e
						}
					}
					inflight[best]++
					to[i], assigned[best] = int32(best), true
				}
				var names []string
				for e, ok := range assigned {
					if ok {
						names = append(names, ch+"_"+strconv.Itoa(e))
					}
				}
				if _, err := tx.Exec(ctx, `INSERT INTO assignments(job, executor) SELECT unnest($1::bigint[]), unnest($2::int[])`, ids, to); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `SELECT pg_notify(c, '') FROM unnest($1::text[]) AS c`, names)
				return err
			})
			require.NoError(b, err)
			claimed += got
		}
		if len(ids) == 0 && got == 0 {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := listen.WaitForNotification(wctx)
			cancel()
			require.True(b, err == nil || wctx.Err() != nil, "wait: %v", err)
		}
	}
	return span.end(n)
}

// rawExecutor is rawRemoteCycle's executor e: it reads its assignments at
// each notification and reports their ends at once.
func rawExecutor(ctx context.Context, u, ch string, e int, ready chan<- error) {
	listen, err := pgx.Connect(ctx, u)
	if err != nil {
		ready <- err
		return
	}
	defer listen.Close(context.Background())
	work, err := pgx.Connect(ctx, u)
	if err != nil {
		ready <- err
		return
	}
	defer work.Close(context.Background())
	_, err = listen.Exec(ctx, `LISTEN `+ch+`_`+strconv.Itoa(e))
	ready <- err
	if err != nil {
		return
	}
	for ctx.Err() == nil {
		rows, err := work.Query(ctx, `SELECT job FROM assignments WHERE executor = $1 AND state = 0`, e)
		if err != nil {
			return
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return
		}
		if len(ids) > 0 {
			if _, err := work.Exec(ctx, `WITH d AS (UPDATE assignments SET state = 2 WHERE job = ANY($1) RETURNING 1)
				SELECT pg_notify($2, '') FROM (SELECT 1 FROM d LIMIT 1) x`, ids, ch+"_r"); err != nil {
				return
			}
			continue
		}
		if _, err := listen.WaitForNotification(ctx); err != nil {
			return
		}
	}
}
