package postgres_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// openHosts opens the schema of TestExecutorsOnPostgres (in its child
// processes too), with a lease of 1 s, or RUNCUE_HOSTS_TTL.
func openHosts(ctx context.Context) (store.Store, error) {
	ttl := time.Second
	if v, err := time.ParseDuration(os.Getenv("RUNCUE_HOSTS_TTL")); err == nil {
		ttl = v
	}
	return postgres.Open(ctx, os.Getenv("RUNCUE_HOSTS_PG"), postgres.Options{LeaseTTL: ttl})
}

// TestExecutorsOnPostgres: the executors' protocol on PostgreSQL: a
// scheduler, a standby and three executors in processes of their own (one
// executor's clock 250 ms off), at least 10 SIGKILLs of executors and 3 of
// the scheduler while the units run (see internal/hoststest). Takeover
// times are logged.
func TestExecutorsOnPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the executors' test kills processes for about 20 s")
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("RUNCUE_HOSTS_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set RUNCUE_HOSTS_SEED=%d to repeat)", seed, seed)
	url := schemaURL(t)
	t.Setenv("RUNCUE_HOSTS_PG", url)
	hoststest.Run(t, openHosts, hoststest.Options{Env: []string{"RUNCUE_HOSTS_PG=" + url}, Units: 200,
		ExecutorKills: 10, SchedulerKills: 3, Skew: 250 * time.Millisecond, Seed: seed})
}
