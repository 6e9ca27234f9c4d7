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
	match   func([]store.Op) bool // for an Apply hold
	read    string                // for a read hold: the method's name
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
func (s *HoldStore) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	s.mu.Lock()
	var hit *Hold
	for i, h := range s.holds {
		if h.match != nil && h.match(ops) {
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
			return store.Batch{}, ctx.Err()
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

// HoldRead arms a hold for the next call of the read method named
// ("ListUnits", "UnitStates" or "Services").
func (s *HoldStore) HoldRead(method string) *Hold {
	h := &Hold{read: method, Entered: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.holds = append(s.holds, h)
	s.mu.Unlock()
	return h
}

func (s *HoldStore) holdRead(ctx context.Context, method string) error {
	s.mu.Lock()
	var hit *Hold
	for i, h := range s.holds {
		if h.read == method {
			hit = h
			s.holds = append(s.holds[:i], s.holds[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	if hit == nil {
		return nil
	}
	close(hit.Entered)
	select {
	case <-hit.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ListUnits blocks while a hold on it is not released.
func (s *HoldStore) ListUnits(ctx context.Context, f store.ListFilter) ([]*store.Unit, error) {
	if err := s.holdRead(ctx, "ListUnits"); err != nil {
		return nil, err
	}
	return s.Store.ListUnits(ctx, f)
}

// UnitStates blocks while a hold on it is not released.
func (s *HoldStore) UnitStates(ctx context.Context, ids []string) (map[string]store.State, error) {
	if err := s.holdRead(ctx, "UnitStates"); err != nil {
		return nil, err
	}
	return s.Store.UnitStates(ctx, ids)
}

// Services blocks while a hold on it is not released.
func (s *HoldStore) Services(ctx context.Context) ([]store.ServiceRecord, error) {
	if err := s.holdRead(ctx, "Services"); err != nil {
		return nil, err
	}
	return s.Store.Services(ctx)
}
