//go:build unix

package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// TestCopyCutResolved: a SubmitBatch of 40 units, written with COPY, whose
// connection is cut once right after the COPY's command reached the server
// (the transaction is lost: the writer writes it again), and once right
// after its COMMIT did (the writer asks whether it committed). Each time
// every unit is stored once, none is reported a duplicate of itself, and
// each has one work_queued event.
func TestCopyCutResolved(t *testing.T) {
	ctx := testCtx(t)
	u := schemaURL(t)
	p := startProxy(t, upstreamOf(u))
	_, c := noopCue(t, proxiedURL(u, p), 2*time.Second, runcue.Config{})

	const n = 40 // above the COPY's threshold
	batch := func(prefix string) {
		t.Helper()
		subs := make([]runcue.Submission, n)
		for i := range subs {
			subs[i] = runcue.Submission{Task: "t", ID: fmt.Sprintf("%s-%02d", prefix, i)}
		}
		got, err := c.SubmitBatch(ctx, subs)
		require.NoError(t, err)
		require.Len(t, got, n)
		for i, s := range got {
			assert.False(t, s.Duplicate, "%s: unit %d is its own submission, not a duplicate of an attempt that committed", prefix, i)
			assert.Equal(t, subs[i].ID, s.ID)
		}
	}
	p.cutAfterMessage([]byte("from stdin"))
	batch("copy")
	require.Equal(t, 1, p.cutCount(), "the COPY's connection was cut")
	p.cutAfterMessage([]byte("commit"))
	batch("commit")
	require.Equal(t, 2, p.cutCount(), "the COMMIT's connection was cut")

	direct, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer direct.Close()
	evs, err := direct.EventsAfter(ctx, 0, 1000)
	require.NoError(t, err)
	queued := map[string]int{}
	for _, e := range evs {
		if e.Type == store.TypeWorkQueued {
			queued[e.WorkID]++
		}
	}
	assert.Len(t, queued, 2*n, "every unit queued")
	for id, k := range queued {
		assert.Equal(t, 1, k, "%s: work_queued once", id)
	}
	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var rows int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM work_units`).Scan(&rows))
	assert.Equal(t, 2*n, rows, "each unit's row written once")
}
