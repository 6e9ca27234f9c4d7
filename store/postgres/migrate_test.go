package postgres_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// TestMigrateFromSchema1 loads a database written by schema version 1
// (testdata/schema1.sql, dumped by testdata/mkschema1 with the runcue of
// that schema) and checks that the migration to executors keeps every
// unit as it was, starts with no executor and no assignment, and that the
// unit its dead owner left running is recovered as before (no executor
// holds it).
func TestMigrateFromSchema1(t *testing.T) {
	ctx := context.Background()
	u := loadFixture(t, "schema1.sql")
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	assert.GreaterOrEqual(t, postgres.SchemaVersion, 3)
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1", "running-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued, "running-1": store.Running}, states)
	got, err := st.GetUnit(ctx, "done-1")
	require.NoError(t, err)
	assert.JSONEq(t, `"ok"`, string(got.Result))
	execs, _, err := st.Executors(ctx)
	require.NoError(t, err)
	assert.Empty(t, execs)
	rep, err := st.Reported(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, rep)
	own, err := st.Acquire(ctx, store.Holder{Owner: "new-owner"})
	require.NoError(t, err)
	defer own.Release()
	res, err := st.Apply(ctx, []store.Op{&store.Recover{Epoch: own.Epoch(), At: time.Date(2026, 11, 27, 12, 0, 30, 0, time.UTC)}})
	require.NoError(t, err)
	assert.Equal(t, []string{"running-1"}, res.Results[0].Held, "its lease (to 12:01) holds at 12:00:30")
	res, err = st.Apply(ctx, []store.Op{&store.Recover{Epoch: own.Epoch(), At: time.Date(2026, 11, 27, 12, 2, 0, 0, time.UTC)}})
	require.NoError(t, err)
	assert.Equal(t, []string{"running-1"}, res.Results[0].IDs)
}

// TestMigrateFromSchema2 loads a database written by schema version 2
// (testdata/schema2.sql, dumped by testdata/mkschema2 with the runcue of
// that schema: an executor with a run pending, one started and one ended
// whose report the scheduler had not read) and checks that the migration
// to version 3 keeps the assignments as they were, both sides' reads find
// them, the executor's reports still apply (and a stale one is refused),
// and the assignments' indexes and fill factor are version 3's.
func TestMigrateFromSchema2(t *testing.T) {
	ctx := context.Background()
	u := loadFixture(t, "schema2.sql")
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	at := time.Unix(0, time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).UnixNano()) // as the store reads times
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1", "pending-1", "started-1", "ended-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued, "pending-1": store.Running,
		"started-1": store.Running, "ended-1": store.Running}, states)
	execs, _, err := st.Executors(ctx)
	require.NoError(t, err)
	require.Len(t, execs, 1)
	assert.Equal(t, "ex-1", execs[0].ID)
	mine, err := st.Assigned(ctx, "ex-1")
	require.NoError(t, err)
	byID := map[string]store.Assignment{}
	for _, a := range mine {
		byID[a.ID] = a
	}
	require.Len(t, byID, 2, "pending-1 and started-1")
	assert.Equal(t, store.Assignment{ID: "pending-1", Run: 1, Executor: "ex-1", Task: "a", Target: "t-pending-1", Params: []byte(`{"p":1}`),
		StartBy: at.Add(time.Second), Timeout: time.Minute}, byID["pending-1"])
	assert.Equal(t, store.AssignStarted, byID["started-1"].State)
	rep, err := st.Reported(ctx, nil)
	require.NoError(t, err)
	got := map[string]store.Assignment{}
	for _, a := range rep {
		got[a.ID] = a
	}
	require.Len(t, got, 2, "started-1 and ended-1")
	assert.Equal(t, store.AssignStarted, got["started-1"].State)
	assert.Equal(t, at.Add(100*time.Millisecond), got["started-1"].Started)
	assert.Equal(t, store.AssignEnded, got["ended-1"].State)
	assert.JSONEq(t, `{"result":"ok"}`, string(got["ended-1"].Ending))

	res, err := st.Apply(ctx, []store.Op{
		&store.ReportStart{Executor: "ex-1", ID: "pending-1", Run: 1, At: at.Add(200 * time.Millisecond)},
		&store.ReportEnd{Executor: "ex-1", ID: "started-1", Run: 1, Ending: []byte(`{}`)},
		&store.ReportEnd{Executor: "ex-1", ID: "done-1", Run: 1, Ending: []byte(`{}`)},
	})
	require.NoError(t, err)
	assert.True(t, res.Results[0].Applied)
	assert.True(t, res.Results[1].Applied)
	assert.ErrorIs(t, res.Results[2].Err, store.ErrStaleRun, "done-1's run was unassigned with its Finish")
	rep, err = st.Reported(ctx, nil)
	require.NoError(t, err)
	assert.Len(t, rep, 3)

	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'assignments' ORDER BY indexname`)
	require.NoError(t, err)
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, defs, 2)
	assert.Contains(t, defs[0], "assignments_executor ON ")
	assert.Contains(t, defs[0], "(executor)")
	assert.Contains(t, defs[1], "assignments_pkey")
	var opts []string
	require.NoError(t, conn.QueryRow(ctx, `SELECT reloptions FROM pg_class WHERE oid = 'assignments'::regclass`).Scan(&opts))
	assert.Equal(t, []string{"fillfactor=50"}, opts)
}

// loadFixture loads the dump testdata/name (its schema named {{schema}})
// into a schema of the test's own, and returns a URL whose connections
// use it.
func loadFixture(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	u := schemaURL(t)
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, os.Getenv("RUNCUE_TEST_POSTGRES"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.PgConn().Exec(ctx, strings.ReplaceAll(string(b), "{{schema}}", parsed.Query().Get("search_path"))).ReadAll()
	require.NoError(t, err)
	return u
}
