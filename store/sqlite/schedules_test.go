package sqlite_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// TestMigrateFromSchema13 opens a database written by schema version 13
// (testdata/schema13.db, written by testdata/mkschema13 with the runcue of
// that schema) and checks that the migration to schedules keeps every
// unit as it was, starts with no schedule, and that a schedule fires on
// it: its first period submits a unit, and a period whose idempotency key
// an existing unit holds takes that unit instead of a second one.
func TestMigrateFromSchema13(t *testing.T) {
	st := openFixture(t, "schema13.db")
	ctx := t.Context()
	assertMigrated(t, st, 14)
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued}, states)
	recs, err := st.Schedules(ctx)
	require.NoError(t, err)
	assert.Empty(t, recs)

	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	own, err := st.Acquire(ctx, store.Holder{Owner: "new-owner"})
	require.NoError(t, err)
	defer own.Release()
	b, err := st.Apply(ctx, []store.Op{
		&store.PutSchedule{Name: "hourly", Def: []byte(`{}`), At: at},
		&store.Fire{Epoch: own.Epoch(), Schedule: "hourly", Key: "k1", Nominal: at.Add(time.Hour), At: at.Add(time.Hour),
			Unit: &store.Unit{ID: "s-1", Task: "report", State: store.Queued, CreatedAt: at, IdempotencyKey: "k-new"}},
		&store.Fire{Epoch: own.Epoch(), Schedule: "hourly", Key: "k2", Nominal: at.Add(2 * time.Hour), At: at.Add(2 * time.Hour),
			Unit: &store.Unit{ID: "s-2", Task: "report", State: store.Queued, CreatedAt: at, IdempotencyKey: "k-queued"}},
	})
	require.NoError(t, err)
	for _, r := range b.Results {
		require.NoError(t, r.Err)
	}
	assert.Equal(t, "s-1", b.Results[1].Units[0].ID)
	assert.Equal(t, store.InsertedUnit{ID: "queued-1", Seq: 2, State: store.Queued, Duplicate: true}, b.Results[2].Units[0])
	recs, err = st.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "k2", recs[0].LastKey)
	assert.Equal(t, "queued-1", recs[0].LastUnit)
}
