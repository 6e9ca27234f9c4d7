package runcue_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // the lock holder's driver
)

// lockHolderEnv makes the test binary a process that holds a SQLite
// database's write lock (see holdWriteLock).
const lockHolderEnv = "RUNCUE_TEST_LOCK_HOLDER"

// holdLock is the lock holder's main: it begins an IMMEDIATE transaction
// on the database at path (SQLite's write lock), says "locked", and holds
// it until its standard input closes; then it commits.
func holdLock(path string) int {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		fmt.Fprintln(os.Stderr, "lock holder:", err)
		return 2
	}
	defer db.Close()
	conn, err := db.Conn(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "lock holder:", err)
		return 2
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		fmt.Fprintln(os.Stderr, "lock holder:", err)
		return 2
	}
	fmt.Println("locked")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if _, err := conn.ExecContext(context.Background(), "COMMIT"); err != nil {
		fmt.Fprintln(os.Stderr, "lock holder:", err)
		return 2
	}
	return 0
}

// holdWriteLock starts another process that holds the write lock of the
// SQLite database at path; release lets it go and waits for the process.
func holdWriteLock(t *testing.T, path string) (io.Closer, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockHolderEnv+"="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "locked\n", line)
	released := false
	release := func() {
		if !released {
			released = true
			stdin.Close()
			require.NoError(t, cmd.Wait())
		}
	}
	t.Cleanup(release)
	return closerFunc(release), release
}

type closerFunc func()

func (f closerFunc) Close() error { f(); return nil }

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }
