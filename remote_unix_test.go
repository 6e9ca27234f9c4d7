//go:build unix

package runcue_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/internal/hoststest"
)

// TestExecutorFrozen: an executor stopped with SIGSTOP past its lease and
// resumed stores no outcome for the run that was requeued meanwhile (see
// hoststest.Frozen). It is frozen between its transactions: SQLite's
// write lock, held by a frozen process, stops every writer until it
// resumes.
func TestExecutorFrozen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "frozen.db")
	t.Setenv("RUNCUE_HOSTS_DB", path)
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(50)")
	require.NoError(t, err)
	defer db.Close()
	writable := func(ctx context.Context) bool {
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			t.Logf("the write lock is held: %v", err)
			return false
		}
		_, err = conn.ExecContext(ctx, "ROLLBACK")
		require.NoError(t, err)
		return true
	}
	hoststest.Frozen(t, openHostsDB, []string{"RUNCUE_HOSTS_DB=" + path}, writable)
}
