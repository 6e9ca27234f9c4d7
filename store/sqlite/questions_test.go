package sqlite_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// TestMigrateFromSchema14 opens a database written by schema version 14
// (testdata/schema14.db, written by testdata/mkschema14 with the runcue of
// that schema) and checks that the migration to the questions table keeps
// the units, the schedule and the old owner_asked and owner_answered
// events as they were, and that a question then travels through the new
// table without an event.
func TestMigrateFromSchema14(t *testing.T) {
	st := openFixture(t, "schema14.db")
	ctx := t.Context()
	assertMigrated(t, st, 15)
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued}, states)
	recs, err := st.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "hourly", recs[0].Name)
	evs, err := st.EventsAfter(ctx, 0, 100)
	require.NoError(t, err)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	assert.Contains(t, types, store.TypeOwnerAsked)
	assert.Contains(t, types, store.TypeOwnerAnswered)

	own, err := st.Acquire(ctx, store.Holder{Owner: "new-owner"})
	require.NoError(t, err)
	defer own.Release()
	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	b, err := st.Apply(ctx, []store.Op{
		&store.Ask{Question: store.OwnerQuestion{Nonce: "n2", Kind: "services"}, At: at},
		&store.AnswerQuestion{Epoch: own.Epoch(), ID: "n2", Answer: []byte(`[]`)},
	})
	require.NoError(t, err)
	for _, r := range b.Results {
		require.NoError(t, r.Err)
		assert.True(t, r.Applied)
	}
	answer, answered, err := st.Answered(ctx, "n2")
	require.NoError(t, err)
	assert.True(t, answered)
	assert.Equal(t, "[]", string(answer))
	last, err := st.LastSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, evs[len(evs)-1].Seq, last, "no event appended")
}
