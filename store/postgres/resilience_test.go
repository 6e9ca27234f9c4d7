//go:build unix

package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// proxiedURL is u (a URL of the shared test server) through p.
func proxiedURL(u string, p *proxy) string {
	i := strings.Index(u, "@") + 1
	j := i + strings.Index(u[i:], "/")
	return u[:i] + p.addr() + u[j:]
}

// upstreamOf is the host:port of URL u.
func upstreamOf(u string) string {
	i := strings.Index(u, "@") + 1
	return u[i : i+strings.Index(u[i:], "/")]
}

// TestCommitCutResolved: the connection is cut right after a COMMIT
// reached the server (the proxy forwards the COMMIT and closes both
// sides): the writer asks the server whether the transaction committed
// (txid_status) rather than trying it again, so nothing is applied twice:
// one work_queued event for the unit submitted, one queue_changed for the
// pause, and the submission is not reported a duplicate of itself.
func TestCommitCutResolved(t *testing.T) {
	ctx := testCtx(t)
	u := schemaURL(t)
	p := startProxy(t, upstreamOf(u))
	_, c := noopCue(t, proxiedURL(u, p), 2*time.Second, runcue.Config{})

	p.cutAfterMessage([]byte("commit"))
	sub, err := c.Submit(ctx, runcue.Submission{Task: "t", ID: "once"})
	require.NoError(t, err)
	assert.False(t, sub.Duplicate, "the submission is its own, not a duplicate of a first attempt that committed")
	require.Equal(t, 1, p.cutCount(), "the COMMIT's connection was cut")

	p.cutAfterMessage([]byte("commit"))
	require.NoError(t, c.PauseQueue(ctx))
	require.Equal(t, 2, p.cutCount())

	direct, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer direct.Close()
	evs, err := direct.EventsAfter(ctx, 0, 100)
	require.NoError(t, err)
	count := map[string]int{}
	for _, e := range evs {
		count[e.Type]++
	}
	assert.Equal(t, 1, count[store.TypeWorkQueued], "work_queued once: %v", count)
	assert.Equal(t, 1, count[store.TypeQueueChanged], "queue_changed once: %v", count)
}

// TestOwnerRidesThroughRestart: an owner in this process, its store
// through a proxy to a private server, runs 1,200 units of a rate-limited
// service while the server is restarted with pg_ctl restart -m immediate,
// stopped for 5 s, and blackholed for 3 s. The owner keeps (or takes back)
// ownership by itself, every unit completes once, the Cue reports the
// outage and its end, and a reader's subscription, through the same
// faults, delivers every completion once, in order.
func TestOwnerRidesThroughRestart(t *testing.T) {
	ctx := testCtx(t)
	cl := privateCluster(t)
	cl.createSchema("rq")
	p := startProxy(t, cl.addr())
	said := &countingHandler{counts: map[string]int{}}
	_, c := openCue(t, cl.url(p.addr(), "rq"), 2*time.Second, runcue.Config{Logger: slog.New(said)})
	evCtx, cancelEvents := context.WithCancel(ctx)
	defer cancelEvents()
	var mu sync.Mutex
	seen := map[runcue.EventType]bool{}
	go func() {
		for ev := range c.Events(evCtx) {
			mu.Lock()
			seen[ev.Type] = true
			mu.Unlock()
		}
	}()
	runs := map[string]int{}
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 20, RateLimit: 200, RateWindow: 500 * time.Millisecond}))
	require.NoError(t, c.Task("t", runcue.Task{Services: []string{"api"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		runs[w.ID]++
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		return nil, nil
	}}))
	const n = 1200
	var subs []runcue.Submission
	for i := range n {
		subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprintf("u%03d", i)})
	}
	_, err := c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	// A reader in "another process" (its own handle, through the proxy
	// too) follows the log from its start through every fault.
	_, reader := openCue(t, cl.url(p.addr(), "rq"), 2*time.Second, runcue.Config{})
	followed, stopFollowing, err := reader.Subscribe(evCtx, runcue.SubscribeOptions{After: 0, Types: []runcue.EventType{runcue.EventWorkCompleted}, Buffer: 16})
	require.NoError(t, err)
	defer stopFollowing()
	completedSeen := map[string]int{}
	var lastSeq int64
	var outOfOrder int
	followDone := make(chan struct{})
	go func() {
		defer close(followDone)
		for ev := range followed {
			mu.Lock()
			completedSeen[ev.WorkID]++
			if ev.Seq <= lastSeq {
				outOfOrder++
			}
			lastSeq = ev.Seq
			done := len(completedSeen) == n
			mu.Unlock()
			if done {
				return
			}
		}
	}()
	require.NoError(t, c.Start(ctx))
	ran := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(runs)
	}
	resumed := func(what string, back time.Time) {
		before := ran()
		waitFor(t, "dispatch to resume after "+what, func() bool { return ran() > before+10 })
		t.Logf("%s: dispatch resumed %v after the server answered again (%s)", what, time.Since(back).Round(time.Millisecond), c.Status().Role)
	}
	waitFor(t, "a sixth of the units to run", func() bool { return ran() >= n/6 })
	cl.restart()
	resumed("restart -m immediate", time.Now())
	waitFor(t, "a third of the units to run", func() bool { return ran() >= n/3 })
	cl.stop()
	time.Sleep(5 * time.Second) // past the 2 s lease
	cl.start()
	resumed("stopped 5 s", time.Now())
	waitFor(t, "half of the units to run", func() bool { return ran() >= n/2 })
	p.blackhole(true)
	time.Sleep(3 * time.Second)
	p.blackhole(false)
	resumed("blackholed 3 s", time.Now())
	drainCtx, stop := context.WithTimeout(ctx, 2*time.Minute)
	defer stop()
	require.NoError(t, c.Drain(drainCtx))
	stats, err := c.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, stats.States[runcue.StateCompleted], "every unit completed")
	mu.Lock()
	again := 0
	for _, k := range runs {
		again += k - 1
	}
	mu.Unlock()
	t.Logf("%d handler runs repeated (runs the restart cut)", again)
	select {
	case <-followDone:
	case <-time.After(2 * time.Minute):
		t.Fatal("the reader's subscription did not deliver every completion")
	}
	mu.Lock()
	for id, k := range completedSeen {
		assert.Equal(t, 1, k, "%s: its work_completed delivered once", id)
	}
	assert.Zero(t, outOfOrder, "delivered in order")
	mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	// Announced: logged (at once, on the writer's goroutine) and published.
	// The events are delivered live, and skipped for a subscriber too far
	// behind (Subscribe's contract: on a loaded machine this one can fall
	// 4,096 events behind); the log is not.
	assert.Positive(t, said.count("runcue: the store is unavailable: writes are retried until it answers"), "the outage was announced")
	assert.Positive(t, said.count("runcue: the store answers again"), "its end was announced")
	if !seen[runcue.EventStoreUnavailable] || !seen[runcue.EventStoreRecovered] {
		t.Logf("the outage's events were not delivered live to the subscriber (seen %v): it fell too far behind", seen)
	}
	assert.Equal(t, runcue.RoleOwner, c.Status().Role)
}

// testLogger logs at Info to the test's log with -v and
// RUNCUE_TEST_LOG set; otherwise nowhere.
func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("RUNCUE_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// TestRetakeRequeuesEndedRuns: an owner whose server stops for longer
// than its lease loses ownership and cancels its handlers; when the server
// is back it takes ownership again and requeues at once the runs it saw
// end, instead of holding them for their leases (the default Timeout's 30
// minutes plus LeaseBuffer): every unit completes within the test's
// deadline, each run cut once.
func TestRetakeRequeuesEndedRuns(t *testing.T) {
	ctx := testCtx(t)
	cl := privateCluster(t)
	cl.createSchema("rq")
	st, err := postgres.Open(ctx, cl.url(cl.addr(), "rq"), postgres.Options{LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: testLogger(t)})
	require.NoError(t, err)
	defer c.Close()
	var mu sync.Mutex
	runs := map[string]int{}
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		runs[w.ID]++
		first := runs[w.ID] == 1
		mu.Unlock()
		if first {
			<-ctx.Done() // cut by the loss of ownership
			return nil, ctx.Err()
		}
		return nil, nil
	}}))
	const n = 5
	for i := range n {
		_, err := c.Submit(ctx, runcue.Submission{Task: "t", ID: fmt.Sprint("u", i)})
		require.NoError(t, err)
	}
	require.NoError(t, c.Start(ctx))
	waitFor(t, "every unit running", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) == n
	})
	cl.stop()
	waitFor(t, "ownership lost", func() bool { return c.Status().Role == runcue.RoleWaiting })
	time.Sleep(time.Second)
	cl.start()
	drainCtx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	require.NoError(t, c.Drain(drainCtx), "the cut runs were requeued at once, not held for their leases")
	stats, err := c.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, stats.States[runcue.StateCompleted])
	mu.Lock()
	defer mu.Unlock()
	for id, k := range runs {
		assert.Equal(t, 2, k, "%s: cut once, run again once", id)
	}
}

// TestFaults: a scheduler, a standby and two executors (and a third
// executor started under the first one's ID) in processes of their own,
// their connections through a proxy to a private server, run units of a
// service counted at arrival (a seeded 0-5 ms wire) under a rate window, a
// token meter and caps, with dependencies and the default Timeout, while
// the database fails: a blackhole shorter than LeaseTTL/4, pg_ctl restart
// -m immediate twice, the server stopped for 20 s, every connection
// dropped, and a blackhole longer than LeaseTTL. No process exits; see
// hoststest.RunFaults for what is checked.
func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the fault test runs for about a minute")
	}
	const ttl = 2 * time.Second
	cl := privateCluster(t)
	cl.createSchema("faults")
	p := startProxy(t, cl.addr())
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("RUNCUE_FAULTS_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set RUNCUE_FAULTS_SEED=%d to repeat)", seed, seed)
	direct := cl.url(cl.addr(), "faults")
	open := func(ctx context.Context) (store.Store, error) {
		return postgres.Open(ctx, direct, postgres.Options{LeaseTTL: ttl})
	}
	hoststest.RunFaults(t, open, hoststest.FaultOptions{
		Env:   []string{"RUNCUE_HOSTS_PG=" + cl.url(p.addr(), "faults"), "RUNCUE_HOSTS_TTL=" + ttl.String()},
		Units: 900, Seed: seed, LeaseTTL: ttl, DuplicateID: true,
		Faults: []hoststest.Fault{
			{Name: "a blackhole of 300 ms", After: 0.05, Short: true, Do: func(*testing.T) {
				p.blackhole(true)
				time.Sleep(300 * time.Millisecond)
				p.blackhole(false)
			}},
			{Name: "restart -m immediate", After: 0.15, Do: func(*testing.T) { cl.restart() }},
			{Name: "a second restart -m immediate", After: 0.25, Do: func(*testing.T) { cl.restart() }},
			{Name: "the server stopped for 20 s", After: 0.35, Do: func(*testing.T) {
				cl.stop()
				time.Sleep(20 * time.Second)
				cl.start()
			}},
			{Name: "every connection dropped", After: 0.5, Do: func(*testing.T) { p.drop() }},
			{Name: "a blackhole of 3 s", After: 0.65, Do: func(*testing.T) {
				p.blackhole(true)
				time.Sleep(3 * time.Second)
				p.blackhole(false)
			}},
		}})
}

// TestPostgresErrorsClassified: PostgreSQL's errors are classified as the
// documented table says (docs/resilience.md).
func TestPostgresErrorsClassified(t *testing.T) {
	st, err := postgres.Open(context.Background(), schemaURL(t), postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	for code, want := range map[string]store.Fault{
		"08006": store.Transient, // connection failure
		"08001": store.Transient, // cannot establish
		"57P01": store.Transient, // admin_shutdown
		"57P02": store.Transient, // crash_shutdown
		"57P03": store.Transient, // cannot_connect_now
		"25006": store.Transient, // read_only_sql_transaction: a replica
		"40001": store.Transient, // serialization_failure
		"40P01": store.Transient, // deadlock_detected
		"53300": store.Transient, // too_many_connections
		"55P03": store.Transient, // lock_not_available
		"53100": store.Fatal,     // disk_full
		"XX001": store.Fatal,     // data_corrupted
		"42501": store.Fatal,     // insufficient_privilege
		"42P01": store.Fatal,     // undefined_table
		"28P01": store.Fatal,     // invalid_password
	} {
		err := fmt.Errorf("runcue: postgres: %w", &pgconn.PgError{Code: code, Message: "injected"})
		assert.Equal(t, want, store.FaultOf(st, err), code)
	}
	assert.Equal(t, store.Transient, store.FaultOf(st, io.ErrUnexpectedEOF))
	assert.Equal(t, store.Transient, store.FaultOf(st, syscall.ECONNREFUSED))
	assert.Equal(t, store.Transient, store.FaultOf(st, context.DeadlineExceeded))
	assert.Equal(t, store.Fatal, store.FaultOf(st, store.ErrSchemaTooNew))
	assert.Equal(t, store.Fatal, store.FaultOf(st, store.ErrRewound))

	// A server that refuses connections, for real.
	_, err = postgres.Open(context.Background(), "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=2", postgres.Options{})
	require.Error(t, err)
	assert.Equal(t, store.Transient, store.FaultOf(st, err), "%v", err)
}

// TestFailedOwnerGivesUp: an owner whose store fails for good (a fatal
// error) stops renewing its lease: it never holds ownership it cannot use.
// The standby takes over within LeaseTTL + 5 s.
func TestFailedOwnerGivesUp(t *testing.T) {
	ctx := testCtx(t)
	const ttl = 2 * time.Second
	u := schemaURL(t)
	stA, err := postgres.Open(ctx, u, postgres.Options{LeaseTTL: ttl})
	require.NoError(t, err)
	defer stA.Close()
	fs := &testutil.FaultStore{Store: stA}
	a := noopCueOn(t, fs, runcue.Config{})
	_, b := noopCue(t, u, ttl, runcue.Config{Standby: true})
	require.NoError(t, a.Start(ctx))
	require.NoError(t, b.Start(ctx))
	fs.Down(&pgconn.PgError{Code: "53100", Message: "could not extend file: No space left on device (injected)"})
	failed := time.Now()
	_, err = a.Submit(ctx, runcue.Submission{Task: "t"})
	require.ErrorIs(t, err, runcue.ErrStoreFailed)
	waitFor(t, "the standby to take over", func() bool { return b.Status().Role == runcue.RoleOwner })
	took := time.Since(failed)
	t.Logf("the standby took over %v after the owner's store failed", took.Round(time.Millisecond))
	assert.Less(t, took, ttl+5*time.Second)
	assert.Equal(t, runcue.RoleFailed, a.Status().Role)
	assert.Contains(t, a.Status().LastError, "No space left")
}

// TestBlackholeCancelsAtHalfLease: an owner cut off without a word stops
// trusting its lease, and cancels its handlers, at most LeaseTTL/2 after
// the last renewal it sent, whatever its connections do: before any
// standby may take over (the lease's TTL, by the database's clock).
func TestBlackholeCancelsAtHalfLease(t *testing.T) {
	ctx := testCtx(t)
	const ttl = 2 * time.Second
	u := schemaURL(t)
	p := startProxy(t, upstreamOf(u))
	st, err := postgres.Open(ctx, proxiedURL(u, p), postgres.Options{LeaseTTL: ttl})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: testLogger(t)})
	require.NoError(t, err)
	defer c.Close()
	var mu sync.Mutex
	var cancelled []time.Time
	running := 0
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		running++
		mu.Unlock()
		<-ctx.Done()
		mu.Lock()
		cancelled = append(cancelled, time.Now())
		mu.Unlock()
		return nil, ctx.Err()
	}}))
	_, err = c.SubmitBatch(ctx, []runcue.Submission{{Task: "t"}, {Task: "t"}, {Task: "t"}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	waitFor(t, "the handlers to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return running == 3
	})
	time.Sleep(ttl / 2) // a few renewals
	began := time.Now()
	p.blackhole(true)
	defer p.blackhole(false)
	waitFor(t, "the handlers to be cancelled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(cancelled) == 3
	})
	mu.Lock()
	last := slices.MaxFunc(cancelled, time.Time.Compare)
	mu.Unlock()
	t.Logf("handlers cancelled %v after the blackhole began (lease %v)", last.Sub(began).Round(time.Millisecond), ttl)
	// The owner stops trusting its lease LeaseTTL/2 after the last renewal
	// it sent, which is at most LeaseTTL/4 before the blackhole began: at
	// most LeaseTTL/2 after it, and never as late as LeaseTTL*3/4, the
	// earliest a standby could take over (the lease runs LeaseTTL from a
	// renewal at most LeaseTTL/4 old). The rest is a loaded machine's
	// scheduling.
	assert.Less(t, last.Sub(began), ttl*3/4, "handlers cancelled before a standby may take over")
}

// TestCommitLostInCrash: a transaction whose COMMIT was sent as the
// server crashed (pg_ctl stop -m immediate) may leave nothing in the WAL,
// not even its transaction ID. After the restart the server's answer about
// that ID is "in the future": the transaction did not commit (it is not a
// rewind: a rewind is of commits this process saw answered, found by the
// event log's numbers, TestRewindDetected). Then the server hands the ID
// to another transaction, which commits: a lost transaction that appended
// events is still judged not committed, by its last event's block.
func TestCommitLostInCrash(t *testing.T) {
	ctx := testCtx(t)
	cl := privateCluster(t)
	cl.createSchema("lost")
	url := cl.url(cl.addr(), "lost")
	st, err := postgres.Open(ctx, url, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	var xid int64
	var server time.Time
	require.NoError(t, tx.QueryRow(ctx, `SELECT txid_current(), pg_postmaster_start_time()`).Scan(&xid, &server))
	cl.stop()
	_ = conn.Close(ctx)
	cl.start()

	var committed bool
	waitFor(t, "the server to answer about the lost transaction", func() bool {
		committed, err = postgres.XactCommitted(ctx, st, xid, server, 0)
		return err == nil || store.FaultOf(st, err) == store.Fatal
	})
	require.NoError(t, err, "a transaction lost in a crash before its COMMIT was answered did not commit")
	assert.False(t, committed)

	// Other transactions take IDs until one is handed the lost one's.
	conn, err = pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for {
		var id int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT txid_current()`).Scan(&id))
		if id >= xid {
			require.Equal(t, xid, id, "the restarted server hands the lost ID out again")
			break
		}
	}
	status, err := postgres.XactCommitted(ctx, st, xid, server, 0)
	require.NoError(t, err)
	assert.True(t, status, "the server tells of the transaction that now holds the ID")
	committed, err = postgres.XactCommitted(ctx, st, xid, server, 1)
	require.NoError(t, err)
	assert.False(t, committed, "the lost transaction appended event 1: its block is not there")
}

// TestRewindDetected: the database is restored, under a running owner, to
// a backup taken earlier (as a lagging asynchronous replica promoted
// would be): the owner's next commit finds the log behind what it saw and
// stops loudly (ErrRewound), giving ownership up; a standby that takes
// over gets an epoch the rewound owner never held, so the two never pass
// the fence together.
func TestRewindDetected(t *testing.T) {
	ctx := testCtx(t)
	// The owner rides through a server stopped for a backup and started
	// again: its lease must outlast that (ci-fresh: with 2 s, on a loaded
	// machine, the owner stepped down first and Drain failed).
	const ttl = 6 * time.Second
	cl := privateCluster(t)
	cl.createSchema("rw")
	url := cl.url(cl.addr(), "rw")
	_, a := noopCue(t, url, ttl, runcue.Config{})
	require.NoError(t, a.Start(ctx))
	run := func(n int) {
		_, err := a.SubmitBatch(ctx, anonymous(n))
		require.NoError(t, err)
		require.NoError(t, a.Drain(ctx))
	}
	run(20)
	cl.stop()
	cl.backup("earlier")
	cl.start()
	run(40) // rides through the restart; the log moves past the backup
	seen, err := a.LastSeq(ctx)
	require.NoError(t, err)
	cl.stop()
	cl.restore("earlier")
	cl.start()
	_, err = a.SubmitBatch(ctx, anonymous(5))
	// The submission commits into the rewound database (nothing else can
	// tell the owner yet); that commit shows the rewind, and the Cue stops.
	if err != nil {
		t.Logf("the submission after the restore: %v", err)
	}
	waitFor(t, "the owner to stop on the rewind", func() bool { return a.Status().Role == runcue.RoleFailed })
	assert.Contains(t, a.Status().LastError, "back in time")
	_, err = a.Submit(ctx, runcue.Submission{Task: "t"})
	require.ErrorIs(t, err, store.ErrRewound, "a rewound Cue writes nothing more")

	st2, b := noopCue(t, url, ttl, runcue.Config{Standby: true})
	last, err := st2.LastSeq(ctx)
	require.NoError(t, err)
	t.Logf("the owner had seen event %d; the restored log ends at %d", seen, last)
	require.NoError(t, b.Start(ctx))
	waitFor(t, "the standby to take over", func() bool { return b.Status().Role == runcue.RoleOwner })
	epochs := epochsOf(t, url)
	assert.Len(t, epochs, 1, "one epoch is stored")
}

// epochsOf returns the owner epochs stored in the lease row.
func epochsOf(t *testing.T, url string) []int64 {
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var e int64
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT epoch FROM owner_lease WHERE id = 1`).Scan(&e))
	return []int64{e}
}

// anonymous is n submissions of task "t", without IDs.
func anonymous(n int) []runcue.Submission {
	subs := make([]runcue.Submission, n)
	for i := range subs {
		subs[i] = runcue.Submission{Task: "t"}
	}
	return subs
}

// TestErrorsInjected: each classified PostgreSQL error, injected into a
// Cue's writes by a fault-injecting store in front of a real one: a
// transient one is retried (the write commits once, on the next try), a
// fatal one is not, and the Cue stops naming it.
func TestErrorsInjected(t *testing.T) {
	ctx := testCtx(t)
	u := schemaURL(t)
	for _, tc := range []struct {
		code  string
		fatal bool
	}{
		{"08006", false}, {"57P01", false}, {"57P03", false}, {"25006", false}, {"40001", false}, {"40P01", false},
		{"53300", false}, {"53100", true}, {"XX001", true}, {"42501", true},
	} {
		t.Run(tc.code, func(t *testing.T) {
			st, err := postgres.Open(ctx, u, postgres.Options{LeaseTTL: 2 * time.Second})
			require.NoError(t, err)
			defer st.Close()
			fs := &testutil.FaultStore{Store: st}
			c := noopCueOn(t, fs, runcue.Config{})
			fs.Inject(testutil.Fault{Err: fmt.Errorf("injected: %w", &pgconn.PgError{Severity: "ERROR", Code: tc.code, Message: "injected " + tc.code})})
			applies := fs.Applies()
			_, err = c.Submit(ctx, runcue.Submission{Task: "t", ID: "u-" + tc.code})
			if tc.fatal {
				require.ErrorIs(t, err, runcue.ErrStoreFailed)
				assert.ErrorContains(t, err, tc.code, "the error is named")
				assert.Equal(t, applies+1, fs.Applies(), "not retried")
				assert.Equal(t, runcue.RoleFailed, c.Status().Role)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, applies+2, fs.Applies(), "retried once")
			assert.NotEqual(t, runcue.RoleFailed, c.Status().Role)
		})
	}
}

// TestDuplicateExecutorID: a second executor process started under the ID
// of a live one (two hosts deployed with one --id) waits: no run arrives
// twice at the service under one run number, and no limit is exceeded.
func TestDuplicateExecutorID(t *testing.T) {
	url := schemaURL(t)
	open := func(ctx context.Context) (store.Store, error) {
		return postgres.Open(ctx, url, postgres.Options{LeaseTTL: time.Second})
	}
	hoststest.RunFaults(t, open, hoststest.FaultOptions{Env: []string{"RUNCUE_HOSTS_PG=" + url}, Units: 150,
		Seed: uint64(time.Now().UnixNano()), LeaseTTL: time.Second, DuplicateID: true})
}

// TestReadOnlyServerDiscardsConnections: a server that turns read-only
// under a running Cue (a primary demoted to a standby, as a failover
// does: 25006 read_only_sql_transaction) makes the Cue retry, and discard
// the pool's connections, so that once a writable server answers (here
// the same one, made writable again; with a multi-host URL and
// target_session_attrs=read-write, the new primary) no write goes to a
// connection made to the old one.
func TestReadOnlyServerDiscardsConnections(t *testing.T) {
	ctx := testCtx(t)
	cl := privateCluster(t)
	cl.createSchema("ro")
	url := cl.url(cl.addr(), "ro") + "&application_name=runcue_ro_test"
	_, c := noopCue(t, url, 2*time.Second, runcue.Config{})
	require.NoError(t, c.Start(ctx))
	_, err := c.SubmitBatch(ctx, anonymous(20))
	require.NoError(t, err)
	require.NoError(t, c.Drain(ctx))

	admin, err := pgx.Connect(ctx, cl.url(cl.addr(), "public"))
	require.NoError(t, err)
	defer admin.Close(ctx)
	backends := func() map[int32]bool {
		// The pool's connections: not the LISTEN connection, which
		// writes nothing and is not the pool's.
		rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'runcue_ro_test' AND query NOT ILIKE 'listen%'`)
		require.NoError(t, err)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		out := map[int32]bool{}
		for _, p := range pids {
			out[p] = true
		}
		return out
	}
	before := backends()
	require.NotEmpty(t, before)
	_, err = admin.Exec(ctx, `ALTER SYSTEM SET default_transaction_read_only = on`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // the sessions take the reload
	done := make(chan error, 1)
	go func() {
		_, err := c.SubmitBatch(ctx, anonymous(5)) // refused (25006), retried
		done <- err
	}()
	waitFor(t, "the outage seen", func() bool { return !c.Status().StoreUnavailableSince.IsZero() })
	assert.Contains(t, c.Status().LastError, "25006")
	_, err = admin.Exec(ctx, `ALTER SYSTEM RESET default_transaction_read_only`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.NoError(t, c.Drain(ctx))
	stats, err := c.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 25, stats.States[runcue.StateCompleted])
	after := backends()
	kept := 0
	for p := range after {
		if before[p] {
			kept++
		}
	}
	t.Logf("%d pool connections before, %d after, %d kept", len(before), len(after), kept)
	assert.Zero(t, kept, "the connections to the read-only server were discarded")
	assert.Equal(t, runcue.RoleOwner, c.Status().Role)
}

// openCue opens a store at url (lease ttl) and a Cue on it (PollInterval
// 20 ms unless cfg says); both close at the test's end.
func openCue(t *testing.T, url string, ttl time.Duration, cfg runcue.Config) (*postgres.Store, *runcue.Cue) {
	t.Helper()
	st, err := postgres.Open(context.Background(), url, postgres.Options{LeaseTTL: ttl})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st, cueOn(t, st, cfg)
}

// cueOn is openCue on an open store.
func cueOn(t *testing.T, st store.Store, cfg runcue.Config) *runcue.Cue {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	c, err := runcue.New(st, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// noopCue is openCue with task "t", whose handler does nothing.
func noopCue(t *testing.T, url string, ttl time.Duration, cfg runcue.Config) (*postgres.Store, *runcue.Cue) {
	t.Helper()
	st, c := openCue(t, url, ttl, cfg)
	noopTask(t, c)
	return st, c
}

// noopCueOn is noopCue on an open store.
func noopCueOn(t *testing.T, st store.Store, cfg runcue.Config) *runcue.Cue {
	t.Helper()
	c := cueOn(t, st, cfg)
	noopTask(t, c)
	return c
}

func noopTask(t *testing.T, c *runcue.Cue) {
	t.Helper()
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}))
}

// testCtx is a context for a fault test's calls that ends well before the
// package's timeout: a call that would wait for ever fails the test that
// made it, naming it, instead of hanging the package.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// countingHandler counts the messages logged, by message, and writes
// none.
type countingHandler struct {
	mu     sync.Mutex
	counts map[string]int
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.counts[r.Message]++
	h.mu.Unlock()
	return nil
}

func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[msg]
}
