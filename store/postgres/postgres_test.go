package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
	"github.com/runcue/runcue/store/storetest"
)

// The tests run against the server RUNCUE_TEST_POSTGRES names (a URL of
// a database where they may create schemas): scripts/with-postgres starts
// a throwaway one. Without it they do not run: with CI=true that fails the
// package; elsewhere go test says "[no tests to run]" on the package's ok
// line, which it shows without -v, and the reason goes to stderr.
func TestMain(m *testing.M) {
	hoststest.Child(openHosts)
	if os.Getenv("RUNCUE_TEST_POSTGRES") == "" {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "FAIL: CI=true and RUNCUE_TEST_POSTGRES is not set: .ci/run starts PostgreSQL (scripts/with-postgres)")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "SKIP: RUNCUE_TEST_POSTGRES is not set: store/postgres's tests did not run; run them with scripts/with-postgres scripts/test (apt-get install postgresql)")
		_ = flag.Set("test.run", "^$")
	}
	goleak.VerifyTestMain(m)
}

// schemaURL creates a schema of its own for the test (dropped at its end)
// and returns a URL whose connections use it.
func schemaURL(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return namedSchemaURL(t, "t_"+hex.EncodeToString(b))
}

// namedSchemaURL is schemaURL with the schema's name given.
func namedSchemaURL(t testing.TB, schema string) string {
	t.Helper()
	base := os.Getenv("RUNCUE_TEST_POSTGRES")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	conn.Close(ctx)
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`)
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, func() store.Store) {
		u := schemaURL(t)
		st, err := postgres.Open(context.Background(), u, postgres.Options{MaxConns: 4})
		require.NoError(t, err)
		return st, func() store.Store {
			other, err := postgres.Open(context.Background(), u, postgres.Options{MaxConns: 4})
			require.NoError(t, err)
			return other
		}
	})
}

// TestLongSchemaNotifies: a schema whose name is as long as PostgreSQL
// allows (63 bytes) still gets its notifications: the log's, and the
// executors' (whose channels add a suffix to the schema's), where
// pg_notify refused the channel's name ("channel name too long") and the
// transaction with it.
func TestLongSchemaNotifies(t *testing.T) {
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b) + "_" + strings.Repeat("s", 63-15)
	require.Len(t, schema, 63)
	u := namedSchemaURL(t, schema)
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changed, err := st.Watch(wctx)
	require.NoError(t, err)
	reported, err := st.WatchReported(wctx)
	require.NoError(t, err)
	// A second handle's commits (a handle skips its own).
	other, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer other.Close()
	res, err := other.Apply(ctx, []store.Op{&store.AppendEvent{Event: store.Event{Type: "note", Time: time.Now()}}})
	require.NoError(t, err)
	require.True(t, res.Results[0].Applied)
	waitNote(t, changed, "the log's notification")
	_, err = other.Apply(ctx, []store.Op{&store.RegisterExecutor{Executor: store.ExecutorRecord{ID: "x", Host: "h", Tasks: []string{"t"},
		Capacity: 1, Poll: time.Second, TTL: time.Minute}}})
	require.NoError(t, err)
	waitNote(t, reported, "the executors' notification")
}

func waitNote(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s in 30 s", what)
	}
}
