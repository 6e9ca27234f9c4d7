package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// roundTrips counts the round trips of a store's connections: a statement
// sent alone (recorded in alone), or a batch (whose statements it records).
type roundTrips struct {
	mu      sync.Mutex
	n       int
	alone   []string
	batches [][]string
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	r.alone = append(r.alone, strings.Join(strings.Fields(d.SQL), " "))
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	var sqls []string
	for _, q := range d.Batch.QueuedQueries {
		sqls = append(sqls, strings.Join(strings.Fields(q.SQL), " "))
	}
	r.batches = append(r.batches, sqls)
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// reset returns the counts so far and starts again.
func (r *roundTrips) reset() (int, [][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, b := r.n, r.batches
	r.n, r.batches, r.alone = 0, nil, nil
	return n, b
}

// sentAlone counts the statements sent alone so far that begin with prefix.
func (r *roundTrips) sentAlone(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, q := range r.alone {
		if strings.HasPrefix(q, prefix) {
			n++
		}
	}
	return n
}

// planRead is the start of a segment's read of which of its ops apply.
const planRead = "SELECT v.k FROM unnest("

// TestSegmentRoundTrips: the writer's transaction of a segment (runs
// finished and unassigned, runs claimed and assigned) sends its claims,
// assignments, finishes and the assignments' deletes in one round trip,
// without a read of which apply first (optimistic), and takes as many
// round trips for 64 units as for 4. A segment one op of which does not
// apply is written again, with that read: the ops' results are as if
// applied alone, and the next segment reads first too.
func TestSegmentRoundTrips(t *testing.T) {
	ctx := context.Background()
	rt := &roundTrips{}
	st, err := postgres.Open(ctx, schemaURL(t), postgres.WithTracer(postgres.Options{PollOnly: true}, rt))
	require.NoError(t, err)
	defer st.Close()
	at := time.Now()
	_, err = st.Apply(ctx, []store.Op{&store.RegisterExecutor{Executor: store.ExecutorRecord{ID: "x", Host: "h", PID: 1,
		Tasks: []string{"a"}, Capacity: 1000, Poll: time.Second, TTL: time.Minute}}})
	require.NoError(t, err)
	trips := map[int]int{}
	for _, k := range []int{4, 64} {
		units := make([]*store.Unit, 2*k)
		for i := range units {
			units[i] = &store.Unit{ID: fmt.Sprintf("u%d-%d", k, i), Task: "a", State: store.Queued, CreatedAt: at}
		}
		_, err := st.Apply(ctx, []store.Op{&store.Insert{At: at, Units: units}})
		require.NoError(t, err)
		start := func(u *store.Unit) []store.Op {
			return []store.Op{
				&store.Claim{ID: u.ID, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute),
					Events: []store.Event{{Type: "work_started", Task: "a", Attempt: 1}}},
				&store.Assign{ID: u.ID, Task: "a", Owner: "o", Run: 1, Executor: "x", StartBy: at.Add(time.Second), Timeout: time.Minute},
			}
		}
		end := func(u *store.Unit) []store.Op {
			return []store.Op{
				&store.Finish{ID: u.ID, Owner: "o", Run: 1, At: at, State: store.Completed, RunAt: at,
					Attempt: store.Attempt{Run: 1, Start: at, End: at, Outcome: "completed"},
					Events:  []store.Event{{Type: "work_completed", Task: "a", Attempt: 1}}},
				&store.Unassign{ID: u.ID, Run: 1},
			}
		}
		var ops []store.Op
		for _, u := range units[:k] {
			ops = append(ops, start(u)...)
		}
		res, err := st.Apply(ctx, ops)
		require.NoError(t, err)
		for i, r := range res.Results {
			require.True(t, r.Applied, "op %d", i)
		}
		// The measured transaction: the first k end, the next k start.
		ops = ops[:0]
		for i := range k {
			ops = append(ops, end(units[i])...)
			ops = append(ops, start(units[k+i])...)
		}
		rt.reset()
		res, err = st.Apply(ctx, ops)
		require.NoError(t, err)
		require.Zero(t, rt.sentAlone(planRead), "k=%d: an optimistic segment reads nothing first", k)
		n, batches := rt.reset()
		for i, r := range res.Results {
			require.NoError(t, r.Err, "op %d", i)
			require.True(t, r.Applied, "op %d", i)
		}
		trips[k] = n
		var together bool
		for _, b := range batches {
			has := func(prefix string) bool {
				for _, q := range b {
					if strings.HasPrefix(q, prefix) {
						return true
					}
				}
				return false
			}
			together = together || (has("UPDATE work_units w SET state='running'") && has("INSERT INTO assignments") &&
				has("UPDATE work_units w SET state=v.state") && has("DELETE FROM assignments"))
		}
		require.True(t, together, "k=%d: no round trip sent the claims, assignments, finishes and deletes together: %q", k, batches)
	}
	require.Equal(t, trips[4], trips[64], "round trips by segment size")
	t.Logf("a segment's transaction: %d round trips", trips[4])

	// A segment with a claim of a unit already claimed (u64-64, claimed
	// above, run 1 of owner o): that claim does not apply, the rest do.
	units := make([]*store.Unit, 3)
	for i := range units {
		units[i] = &store.Unit{ID: fmt.Sprintf("m%d", i), Task: "a", State: store.Queued, CreatedAt: at}
	}
	_, err = st.Apply(ctx, []store.Op{&store.Insert{At: at, Units: units}})
	require.NoError(t, err)
	claim := func(id string) []store.Op {
		return []store.Op{
			&store.Claim{ID: id, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute),
				Events: []store.Event{{Type: "work_started", Task: "a", Attempt: 1}}},
			&store.Assign{ID: id, Task: "a", Owner: "o", Run: 1, Executor: "x", StartBy: at.Add(time.Second), Timeout: time.Minute},
		}
	}
	rt.reset()
	res, err := st.Apply(ctx, slices.Concat(claim("m0"), claim("u64-64"), claim("m1")))
	require.NoError(t, err)
	applied := []bool{true, true, false, true, true, true} // its Assign names its current run: applied
	for i, r := range res.Results {
		require.NoError(t, r.Err, "op %d", i)
		require.Equal(t, applied[i], r.Applied, "op %d", i)
	}
	require.Len(t, res.Results[0].Events, 1)
	require.Len(t, res.Results[4].Events, 1)
	require.Equal(t, res.Results[0].Events[0].Seq+1, res.Results[4].Events[0].Seq, "numbered as if the refused claim were alone")
	require.Equal(t, 1, rt.sentAlone(planRead), "written again with the read")
	rt.reset()
	res, err = st.Apply(ctx, claim("m2"))
	require.NoError(t, err)
	require.True(t, res.Results[0].Applied)
	require.True(t, res.Results[1].Applied)
	require.Equal(t, 1, rt.sentAlone(planRead), "the next segment reads first, though all of it applies")
}

// TestWindowedClaimRoundTrips: an owner's transaction reads the stored
// epoch with the log's lock, and a segment's claims send their service log
// entries with the transaction's next statements, not alone; a batch of
// starts logged ahead (store.LogStart) is one statement, in one round trip.
func TestWindowedClaimRoundTrips(t *testing.T) {
	ctx := context.Background()
	rt := &roundTrips{}
	st, err := postgres.Open(ctx, schemaURL(t), postgres.WithTracer(postgres.Options{PollOnly: true}, rt))
	require.NoError(t, err)
	defer st.Close()
	own, err := st.Acquire(ctx, store.Holder{Owner: "o"})
	require.NoError(t, err)
	defer own.Release()
	epoch := own.Epoch()
	at := time.Now()
	units := make([]*store.Unit, 8)
	for i := range units {
		units[i] = &store.Unit{ID: fmt.Sprintf("w%d", i), Task: "a", State: store.Queued, CreatedAt: at}
	}
	_, err = st.Apply(ctx, []store.Op{&store.Insert{At: at, Units: units}})
	require.NoError(t, err)
	log := []store.LogEntry{{Service: "svc", Meter: store.MeterRequests, Amount: 1}}
	var ops []store.Op
	for _, u := range units[:4] {
		ops = append(ops, &store.Claim{Epoch: epoch, ID: u.ID, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute), Log: log,
			Events: []store.Event{{Type: "work_started", Task: "a", Attempt: 1}}})
	}
	rt.reset()
	res, err := st.Apply(ctx, ops)
	require.NoError(t, err)
	for i, r := range res.Results {
		require.True(t, r.Applied, "op %d", i)
	}
	require.Zero(t, rt.sentAlone("SELECT epoch FROM owner_lease"), "the epoch is read with the log's lock")
	require.Zero(t, rt.sentAlone("INSERT INTO service_log"), "the service log's rows are sent with other statements")

	ops = ops[:0]
	for _, u := range units[4:] {
		ops = append(ops, &store.LogStart{Epoch: epoch, WorkID: u.ID, Run: 1, At: at, Log: log})
	}
	rt.reset()
	res, err = st.Apply(ctx, ops)
	require.NoError(t, err)
	for i, r := range res.Results {
		require.True(t, r.Applied, "op %d", i)
	}
	n, _ := rt.reset()
	require.Equal(t, 1, n, "a batch of starts logged ahead: one round trip")
	logged, err := st.ServiceLog(ctx, "svc", time.Time{})
	require.NoError(t, err)
	require.Len(t, logged, 8)
}

// TestStartsBesideWriter: a batch of starts logged ahead does not wait for
// the log's lock (another writer's transaction holds it, as the Cue's
// writer does mid-transaction), and a deposed owner's is refused while
// that transaction is open.
func TestStartsBesideWriter(t *testing.T) {
	ctx := context.Background()
	u := schemaURL(t)
	st, err := postgres.Open(ctx, u, postgres.Options{PollOnly: true})
	require.NoError(t, err)
	defer st.Close()
	own, err := st.Acquire(ctx, store.Holder{Owner: "o"})
	require.NoError(t, err)
	defer own.Release()
	at := time.Now()
	_, err = st.Apply(ctx, []store.Op{&store.Insert{At: at, Units: []*store.Unit{{ID: "s0", Task: "a", State: store.Queued, CreatedAt: at}}}})
	require.NoError(t, err)

	writer, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer writer.Close(ctx)
	tx, err := writer.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var last int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT value FROM meta WHERE key = 'events_last' FOR UPDATE`).Scan(&last))

	log := []store.LogEntry{{Service: "svc", Meter: store.MeterRequests, Amount: 1}}
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := st.Apply(wait, []store.Op{
		&store.LogStart{Epoch: own.Epoch(), WorkID: "s0", Run: 1, At: at, Log: log},
		&store.LogStart{Epoch: own.Epoch() + 1, WorkID: "s0", Run: 2, At: at.Add(time.Second), Log: log},
	})
	require.NoError(t, err, "the starts waited for the log's lock")
	require.True(t, b.Results[0].Applied)
	require.ErrorIs(t, b.Results[1].Err, store.ErrNotOwner)
	logged, err := st.ServiceLog(ctx, "svc", time.Time{})
	require.NoError(t, err)
	require.Len(t, logged, 1)
}
