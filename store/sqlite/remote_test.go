package sqlite_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// TestMigrateFromSchema12 opens a database written by schema version 12
// (testdata/schema12.db, written by testdata/mkschema12 with the runcue of
// that schema) and checks that the migration to executors keeps every
// unit as it was, starts with no executor and no assignment, and that the
// unit its dead owner left running is recovered as before (no executor
// holds it).
func TestMigrateFromSchema12(t *testing.T) {
	st := openFixture(t, "schema12.db")
	ctx := t.Context()
	assertMigrated(t, st, 13)
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1", "running-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued, "running-1": store.Running}, states)
	u, err := st.GetUnit(ctx, "done-1")
	require.NoError(t, err)
	assert.JSONEq(t, `"ok"`, string(u.Result))
	execs, _, err := st.Executors(ctx)
	require.NoError(t, err)
	assert.Empty(t, execs)
	rep, err := st.Reported(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, rep)
	own, err := st.Acquire(ctx, store.Holder{Owner: "new-owner"})
	require.NoError(t, err)
	defer own.Release()
	b, err := st.Apply(ctx, []store.Op{&store.Recover{Epoch: own.Epoch(), At: time.Date(2026, 11, 27, 12, 0, 30, 0, time.UTC)}})
	require.NoError(t, err)
	assert.Equal(t, []string{"running-1"}, b.Results[0].Held, "its lease (to 12:01) holds at 12:00:30")
	b, err = st.Apply(ctx, []store.Op{&store.Recover{Epoch: own.Epoch(), At: time.Date(2026, 11, 27, 12, 2, 0, 0, time.UTC)}})
	require.NoError(t, err)
	assert.Equal(t, []string{"running-1"}, b.Results[0].IDs)
}
