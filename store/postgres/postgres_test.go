package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"testing"

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
	base := os.Getenv("RUNCUE_TEST_POSTGRES")
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
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
