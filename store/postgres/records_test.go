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

// TestInsertRecordsAfterRefusal: a unit's record of its events is written
// with its INSERT; an Insert refused in the same transaction (a duplicate
// ID, rolled back to its savepoint) gives its events' numbers back, and
// the next Insert's unit records its own events under those numbers.
func TestInsertRecordsAfterRefusal(t *testing.T) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, schemaURL(t), postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	at := time.Now()
	unit := func(id string) *store.Unit { return &store.Unit{ID: id, Task: "a", State: store.Queued, CreatedAt: at} }
	_, err = st.Apply(ctx, []store.Op{&store.Insert{At: at, Units: []*store.Unit{unit("u1")}}})
	require.NoError(t, err)
	res, err := st.Apply(ctx, []store.Op{
		&store.Insert{At: at, Units: []*store.Unit{unit("u2"), unit("u1")}}, // u1 is stored: refused, u2 with it
		&store.Insert{At: at, Units: []*store.Unit{unit("u3")}},
		&store.AppendEvent{Event: store.Event{Type: "note", WorkID: "u3", Task: "a", Time: at}},
	})
	require.NoError(t, err)
	require.ErrorIs(t, res.Results[0].Err, store.ErrDuplicateID)
	require.True(t, res.Results[1].Applied)
	var want []int64
	for _, r := range res.Results[1:] {
		for _, e := range r.Events {
			want = append(want, e.Seq)
		}
	}
	require.Len(t, want, 2, "u3's work_queued and the note")
	last, err := st.LastSeq(ctx)
	require.NoError(t, err)
	evs, err := st.MatchingEvents(ctx, store.EventQuery{WorkID: "u3", Upto: last, Limit: 100})
	require.NoError(t, err)
	var got []int64
	for _, e := range evs {
		got = append(got, e.Seq)
	}
	assert.Equal(t, want, got)
	states, err := st.UnitStates(ctx, []string{"u2", "u3"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"u3": store.Queued}, states)
}
