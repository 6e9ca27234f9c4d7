package runcue_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// leasedStore gives its ownerships a lease (store.Leased) the test
// controls: trusted or not, lost or not.
type leasedStore struct {
	store.Store
	trusted atomic.Bool
	lost    chan struct{}
}

func (s *leasedStore) Acquire(ctx context.Context, h store.Holder) (store.Ownership, error) {
	own, err := s.Store.Acquire(ctx, h)
	if err != nil {
		return nil, err
	}
	return &leasedOwnership{Ownership: own, s: s}, nil
}

type leasedOwnership struct {
	store.Ownership
	s *leasedStore
}

func (o *leasedOwnership) Trusted() bool         { return o.s.trusted.Load() }
func (o *leasedOwnership) Lost() <-chan struct{} { return o.s.lost }

// TestUntrustedLeaseStartsNothing: an owner whose lease is not trusted at
// the instant a handler would start (a process frozen past its lease and
// resumed, before it noticed) does not start it: the run is requeued
// without spending its retry budget, and runs once the lease is trusted
// again. When the lease is lost, the owner stops as deposed.
func TestUntrustedLeaseStartsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	ls := &leasedStore{Store: st, lost: make(chan struct{})}
	ls.trusted.Store(true)
	c, err := runcue.New(ls, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	var calls atomic.Int32
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) {
		calls.Add(1)
		return nil, nil
	}}))
	rec := record(t, c)
	require.NoError(t, c.Start(ctx))
	first, err := c.Submit(ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	wi, err := c.Wait(ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, runcue.StateCompleted, wi.State)

	ls.trusted.Store(false)
	second, err := c.Submit(ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	rec.waitFor(t, 1, ofType(runcue.EventWorkRequeued, second.ID))
	assert.Equal(t, int32(1), calls.Load(), "no handler started while the lease was not trusted")
	ls.trusted.Store(true)
	wi, err = c.Wait(ctx, second.ID)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.Zero(t, wi.Failures, "a refused start spends no retry budget")
	assert.Equal(t, int32(2), calls.Load())

	close(ls.lost)
	require.Eventually(t, func() bool { return c.Owner() == "" }, time.Minute, 5*time.Millisecond, "a lost lease deposes the owner")
}
