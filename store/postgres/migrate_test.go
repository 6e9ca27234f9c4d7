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
	u := schemaURL(t)
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join("testdata", "schema1.sql"))
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, os.Getenv("RUNCUE_TEST_POSTGRES"))
	require.NoError(t, err)
	_, err = conn.PgConn().Exec(ctx, strings.ReplaceAll(string(b), "{{schema}}", parsed.Query().Get("search_path"))).ReadAll()
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	assert.Equal(t, 2, postgres.SchemaVersion)
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1", "running-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued, "running-1": store.Running}, states)
	got, err := st.GetUnit(ctx, "done-1")
	require.NoError(t, err)
	assert.JSONEq(t, `"ok"`, string(got.Result))
	execs, _, err := st.Executors(ctx)
	require.NoError(t, err)
	assert.Empty(t, execs)
	rep, err := st.Reported(ctx)
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
