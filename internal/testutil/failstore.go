// Package testutil holds test helpers shared by runcue's packages.
package testutil

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/runcue/runcue/store"
)

// ErrInjected is the error a FailStore returns once failing.
var ErrInjected = errors.New("disk I/O error (injected)")

// FailStore wraps a store; after Fail, every Apply fails with ErrInjected
// and nothing it was given is stored.
type FailStore struct {
	store.Store
	failing atomic.Bool
	applies atomic.Int64
}

// Fail makes every later Apply fail.
func (f *FailStore) Fail() { f.failing.Store(true) }

// Applies returns the number of Apply calls made.
func (f *FailStore) Applies() int64 { return f.applies.Load() }

// Apply fails once Fail has been called.
func (f *FailStore) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	f.applies.Add(1)
	if f.failing.Load() {
		return store.Batch{}, ErrInjected
	}
	return f.Store.Apply(ctx, ops)
}
