package runcuecli_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/postgres"
)

// postgresURL returns the URL of a schema of the test's own on the server
// RUNCUE_TEST_POSTGRES names (scripts/test starts one: see
// scripts/with-postgres). Without it the test skips, or fails with
// CI=true.
func postgresURL(t *testing.T) string {
	t.Helper()
	base := os.Getenv("RUNCUE_TEST_POSTGRES")
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and RUNCUE_TEST_POSTGRES is not set: .ci/run starts PostgreSQL (scripts/with-postgres)")
		}
		t.Skip("SKIP: RUNCUE_TEST_POSTGRES is not set (scripts/with-postgres starts a server)")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "cli_" + hex.EncodeToString(b)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	conn.Close(ctx)
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, base)
		if err == nil {
			_, _ = conn.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`)
			conn.Close(ctx)
		}
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestCommandsOnPostgres: stats, explain and serve work on a PostgreSQL
// URL from a process that is not the scheduler: stats counts what the
// scheduler ran, explain gets the scheduler's live answer (a rate window
// full until a time), and serve's dashboard shows the units.
func TestCommandsOnPostgres(t *testing.T) {
	db := postgresURL(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, db, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("api", runcue.Service{RateLimit: 1, RateWindow: time.Hour}))
	require.NoError(t, c.Task("fetch", runcue.Task{Services: []string{"api"}, Handler: func(context.Context, *runcue.Work) (any, error) {
		return nil, nil
	}}))
	first, err := c.Submit(ctx, runcue.Submission{Task: "fetch", Target: "a"})
	require.NoError(t, err)
	second, err := c.Submit(ctx, runcue.Submission{Task: "fetch", Target: "b"})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	wi, err := c.Wait(ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, runcue.StateCompleted, wi.State)

	var stats runcue.Stats
	require.NoError(t, json.Unmarshal([]byte(ok(t, db, "stats", "-o", "json")), &stats))
	assert.Equal(t, 1, stats.States[runcue.StateCompleted])
	assert.Equal(t, 1, stats.States[runcue.StateQueued])

	var ex runcue.Explanation
	require.NoError(t, json.Unmarshal([]byte(ok(t, db, "explain", second.ID, "-o", "json")), &ex))
	assert.True(t, ex.Live, "the scheduler answered")
	kinds := map[runcue.ReasonKind]bool{}
	for _, r := range ex.Reasons {
		kinds[r.Kind] = true
	}
	assert.True(t, kinds[runcue.ReasonRateLimited], "%+v", ex.Reasons)

	base := startServe(t, db, nil)
	code, body := get(t, base+"/work/"+second.ID, "", "")
	assert.Equal(t, 200, code)
	assert.Contains(t, body, second.ID)
	require.NoError(t, c.Stop(ctx))
}
