//go:build unix

package postgres_test

import (
	"testing"

	"github.com/runcue/runcue/internal/hoststest"
)

// TestExecutorFrozenOnPostgres: an executor stopped with SIGSTOP past its
// lease and resumed stores no outcome for the requeued run.
func TestExecutorFrozenOnPostgres(t *testing.T) {
	url := schemaURL(t)
	t.Setenv("RUNCUE_HOSTS_PG", url)
	hoststest.Frozen(t, openHosts, []string{"RUNCUE_HOSTS_PG=" + url}, nil)
}
