package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// TestMigrateFromSchema3 loads a database written by schema version 3
// (testdata/schema3.sql, dumped by testdata/mkschema3 with the runcue of
// that schema) and checks that the migration to schedules keeps the units
// as they were and starts with no schedule, and that a schedule's periods
// fire on it, one of them onto the unit that holds its idempotency key.
func TestMigrateFromSchema3(t *testing.T) {
	ctx := context.Background()
	u := loadFixture(t, "schema3.sql")
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	assert.GreaterOrEqual(t, postgres.SchemaVersion, 4)
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued}, states)
	done, err := st.GetUnit(ctx, "done-1")
	require.NoError(t, err)
	assert.JSONEq(t, `"ok"`, string(done.Result))
	recs, err := st.Schedules(ctx)
	require.NoError(t, err)
	assert.Empty(t, recs)

	own, err := st.Acquire(ctx, store.Holder{Owner: "new-owner"})
	require.NoError(t, err)
	defer own.Release()
	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	ops := []store.Op{&store.PutSchedule{Name: "hourly", Def: []byte(`{}`), At: at}}
	for i, key := range []string{"k-new", "k-queued"} {
		n := at.Add(time.Duration(i+1) * time.Hour)
		ops = append(ops, &store.Fire{Epoch: own.Epoch(), Schedule: "hourly", Key: n.Format(time.RFC3339), Nominal: n, At: n,
			Unit: &store.Unit{ID: "s-" + key, Task: "report", State: store.Queued, CreatedAt: n, IdempotencyKey: key}})
	}
	res, err := st.Apply(ctx, ops)
	require.NoError(t, err)
	for _, r := range res.Results {
		require.NoError(t, r.Err)
	}
	assert.Equal(t, "s-k-new", res.Results[1].Units[0].ID)
	assert.True(t, res.Results[2].Units[0].Duplicate)
	assert.Equal(t, "queued-1", res.Results[2].Units[0].ID)
	recs, err = st.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "queued-1", recs[0].LastUnit)
	assert.Equal(t, at.Add(2*time.Hour).UnixNano(), recs[0].LastAt.UnixNano())
}
