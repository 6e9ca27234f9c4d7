// Package testutil holds test helpers shared by runcue's packages.
package testutil

import (
	"context"
	"errors"
	"sync"
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

// FaultStore wraps a store and injects the errors a test scripts: each
// Apply takes the next fault queued (Inject), if any, and fails with it
// without reaching the store; an Unknown fault reaches the store or not,
// as scripted, and then reports that its commit's outcome is unknown. It
// classifies errors as Class says (store.Classifier), falling back on the
// wrapped store's own rules. FaultStore is safe for simultaneous use.
type FaultStore struct {
	store.Store
	// Class classifies an injected error; nil leaves every error to the
	// wrapped store's rules and store.GenericFault.
	Class func(err error) (store.Fault, bool)

	mu      sync.Mutex
	queue   []Fault
	applies int
	// down fails every Apply with its error until Up; with downReads,
	// LastSeq too.
	down      error
	downReads bool
	consumed  int
}

// Consumed returns how many injected faults Applies have met.
func (f *FaultStore) Consumed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.consumed
}

// Fault is one scripted failure of an Apply.
type Fault struct {
	// Err is the error Apply returns (or, for an Unknown fault, the
	// connection's error).
	Err error
	// Unknown: Apply reports store.UnknownCommitError; Committed says
	// whether the ops were applied, and ResolveErrs are the errors the
	// first calls of Resolve give before it answers.
	Unknown     bool
	Committed   bool
	ResolveErrs []error
	// Match, when set, makes the fault wait for an Apply whose ops it
	// matches; the others pass.
	Match func([]store.Op) bool
}

// Inject queues faults for the next Applies, in order.
func (f *FaultStore) Inject(faults ...Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = append(f.queue, faults...)
}

// Down makes every Apply fail with err until Up.
func (f *FaultStore) Down(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down, f.downReads = err, false
}

// DownReads is Down that also fails LastSeq (the reads a page makes
// first).
func (f *FaultStore) DownReads(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down, f.downReads = err, true
}

// Up ends Down and DownReads.
func (f *FaultStore) Up() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down, f.downReads = nil, false
}

// LastSeq fails while DownReads holds.
func (f *FaultStore) LastSeq(ctx context.Context) (int64, error) {
	f.mu.Lock()
	err := f.down
	if !f.downReads {
		err = nil
	}
	f.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return f.Store.LastSeq(ctx)
}

// Applies returns the number of Apply calls made.
func (f *FaultStore) Applies() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applies
}

// Fault implements store.Classifier.
func (f *FaultStore) Fault(err error) (store.Fault, bool) {
	if f.Class != nil {
		if c, ok := f.Class(err); ok {
			return c, true
		}
	}
	return store.FaultOf(f.Store, err), true
}

// Apply fails as scripted, else applies ops.
func (f *FaultStore) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	f.mu.Lock()
	f.applies++
	if f.down != nil {
		err := f.down
		f.mu.Unlock()
		return store.Batch{}, err
	}
	var ft Fault
	have := false
	for i, q := range f.queue {
		if q.Match == nil || q.Match(ops) {
			ft, have = q, true
			f.queue = append(f.queue[:i:i], f.queue[i+1:]...)
			f.consumed++
			break
		}
	}
	f.mu.Unlock()
	if !have {
		return f.Store.Apply(ctx, ops)
	}
	if !ft.Unknown {
		return store.Batch{}, ft.Err
	}
	var b store.Batch
	if ft.Committed {
		var err error
		if b, err = f.Store.Apply(ctx, ops); err != nil {
			return b, err
		}
	}
	var mu sync.Mutex
	errs := ft.ResolveErrs
	return store.Batch{}, &store.UnknownCommitError{Err: ft.Err, Batch: b, Resolve: func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) > 0 {
			err := errs[0]
			errs = errs[1:]
			return false, err
		}
		return ft.Committed, nil
	}}
}
