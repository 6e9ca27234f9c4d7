//go:build unix

package runcue_test

import (
	"path/filepath"
	"testing"

	"github.com/runcue/runcue/internal/hoststest"
)

// TestExecutorFrozen: an executor stopped with SIGSTOP past its lease and
// resumed stores no outcome for the run that was requeued meanwhile (see
// hoststest.Frozen).
func TestExecutorFrozen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "frozen.db")
	t.Setenv("RUNCUE_HOSTS_DB", path)
	hoststest.Frozen(t, openHostsDB, []string{"RUNCUE_HOSTS_DB=" + path})
}
