package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// TestAssignmentsVacuumed: the store that deletes assignments vacuums their
// table itself once a thousand are deleted (autovacuum visits it at most
// once a minute, and each run leaves it dead row versions).
func TestAssignmentsVacuumed(t *testing.T) {
	ctx := context.Background()
	u := schemaURL(t)
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	schema := parsed.Query().Get("search_path")
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer conn.Close(ctx)
	vacuums := func() int64 {
		var n int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'assignments'`,
			schema).Scan(&n))
		return n
	}
	own, err := st.Acquire(ctx, store.Holder{Owner: "sched"})
	require.NoError(t, err)
	defer own.Release()
	at := time.Now()
	apply := func(ops []store.Op) {
		b, err := st.Apply(ctx, ops)
		require.NoError(t, err)
		for i, r := range b.Results {
			require.NoError(t, r.Err)
			require.True(t, r.Applied, "op %d: %T", i, ops[i])
		}
	}
	apply([]store.Op{&store.RegisterExecutor{Executor: store.ExecutorRecord{ID: "ex", Tasks: []string{"a"}, Capacity: 2000, TTL: time.Hour}}})
	const n = 1000
	var units []*store.Unit
	var claims, assigns, unassigns []store.Op
	for i := range n {
		id := fmt.Sprintf("u%04d", i)
		units = append(units, &store.Unit{ID: id, Task: "a", State: store.Queued, CreatedAt: at})
		claims = append(claims, &store.Claim{Epoch: own.Epoch(), ID: id, Task: "a", Owner: "sched", Run: 1, At: at, LeaseExpires: at.Add(time.Hour)})
		assigns = append(assigns, &store.Assign{Epoch: own.Epoch(), ID: id, Owner: "sched", Run: 1, Executor: "ex"})
		unassigns = append(unassigns, &store.Unassign{Epoch: own.Epoch(), ID: id, Run: 1})
	}
	apply([]store.Op{&store.Insert{Units: units, At: at}})
	apply(claims)
	apply(assigns)
	apply(unassigns[:n-1])
	assert.Zero(t, vacuums(), "not yet: %d deleted", n-1)
	apply(unassigns[n-1:])
	assert.EqualValues(t, 1, vacuums(), "vacuumed at the thousandth")
}
