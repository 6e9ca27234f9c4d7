package testutil

import (
	"context"
	"sync"

	"github.com/runcue/runcue/store"
)

// HoldStore wraps a store; an Apply whose ops match an armed hold blocks
// before it reaches the store until the hold is released. It lets a test
// stop a commit at a chosen point while the rest of the Cue goes on.
// HoldStore is safe for simultaneous use by multiple goroutines.
type HoldStore struct {
	store.Store
	mu    sync.Mutex
	holds []*Hold
}

// Hold is one armed hold. Entered is closed when a matching Apply blocks;
// Release lets it continue.
type Hold struct {
	match   func([]store.Op) bool
	Entered chan struct{}
	release chan struct{}
}

// Release lets the held Apply continue.
func (h *Hold) Release() { close(h.release) }

// Hold arms a hold for the next Apply whose ops satisfy match.
func (s *HoldStore) Hold(match func([]store.Op) bool) *Hold {
	h := &Hold{match: match, Entered: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.holds = append(s.holds, h)
	s.mu.Unlock()
	return h
}

// Apply blocks while a hold it matches is not released.
func (s *HoldStore) Apply(ctx context.Context, ops []store.Op) ([]store.Result, error) {
	s.mu.Lock()
	var hit *Hold
	for i, h := range s.holds {
		if h.match(ops) {
			hit = h
			s.holds = append(s.holds[:i], s.holds[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	if hit != nil {
		close(hit.Entered)
		select {
		case <-hit.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.Store.Apply(ctx, ops)
}

// HasOp returns a match for ops holding an op that satisfies f.
func HasOp(f func(store.Op) bool) func([]store.Op) bool {
	return func(ops []store.Op) bool {
		for _, op := range ops {
			if f(op) {
				return true
			}
		}
		return false
	}
}
