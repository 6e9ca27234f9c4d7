package postgres

import (
	"context"
	"sync"
	"time"
)

// The assignments table holds only the runs in flight, a few hundred rows,
// but each run inserts, updates and deletes its row, leaving dead row
// versions faster than autovacuum, which visits a table at most once a
// minute (autovacuum_naptime), can clear them: unvacuumed, a report's
// statement read 431 pages to find 96 rows after 20,000 runs, and every
// read of the table (the executors', the scheduler's, a report's) read them
// all. So the store that deletes assignments (the scheduler's, with each
// run's Finish) vacuums the table itself: after every vacuumEvery
// deletions, at most once per vacuumGap. VACUUM takes no lock that the
// protocol's statements wait for, and skips the table when another vacuum
// holds it.
const (
	vacuumEvery = 1000
	vacuumGap   = time.Second
)

// vacuumState is a Store's count of assignments deleted since its last
// vacuum.
type vacuumState struct {
	mu      sync.Mutex
	deleted int
	last    time.Time
	// off: a vacuum failed (the store's role may not own the table):
	// autovacuum's visits alone keep it.
	off bool
}

// unassigned counts n assignments deleted by a committed transaction, and
// vacuums the table when it is due.
func (s *Store) unassigned(ctx context.Context, n int) {
	if n == 0 {
		return
	}
	v := &s.vac
	v.mu.Lock()
	v.deleted += n
	due := !v.off && v.deleted >= vacuumEvery && time.Since(v.last) >= vacuumGap
	if due {
		v.deleted, v.last = 0, time.Now()
	}
	v.mu.Unlock()
	if !due {
		return
	}
	if _, err := s.pool.Exec(ctx, `VACUUM (SKIP_LOCKED) assignments`); err != nil && ctx.Err() == nil {
		v.mu.Lock()
		v.off = true
		v.mu.Unlock()
	}
}
