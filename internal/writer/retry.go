package writer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/runcue/runcue/store"
)

// Retries: a transaction that fails with a transient error (store.FaultOf)
// is tried again, after a jittered backoff, until it commits; a caller that
// gives up meanwhile withdraws its request if no transaction holds it
// (Withdraw); an owner that lost its lease has its waiting ops failed
// (Fence); a COMMIT whose answer was lost is resolved by asking the store,
// never by trying again (store.UnknownCommitError).

// ErrUnavailable matches the error of a request given up while the store
// was unreachable (an outage: its transactions failed with transient
// errors and are being retried). The request was withdrawn: nothing of it
// is stored.
var ErrUnavailable = errors.New("runcue: the store is unavailable")

// ErrOutcomeUnknown matches the error of a request given up while its
// transaction was in flight (sent, or committed with its answer lost): it
// may or may not be stored.
var ErrOutcomeUnknown = errors.New("runcue: the outcome is unknown: the write may or may not be stored")

// UnavailableError is the error of a request withdrawn during an outage
// (see ErrUnavailable): since when the store has been failing, its last
// error, and why the request was given up (the caller's context).
type UnavailableError struct {
	Since time.Time
	Last  error
	Cause error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("runcue: the store is unavailable since %s (%v): %v", e.Since.Format(time.RFC3339), e.Last, e.Cause)
}

// Unwrap matches ErrUnavailable and the cause.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Cause} }

// outcomeUnknown is the error of a request given up in flight.
type outcomeUnknown struct{ cause error }

func (e *outcomeUnknown) Error() string   { return ErrOutcomeUnknown.Error() + ": " + e.cause.Error() }
func (e *outcomeUnknown) Unwrap() []error { return []error{ErrOutcomeUnknown, e.cause} }

// Withdraw gives r up, for a caller whose wait ended with cause, and
// returns the error to report: r is withdrawn, and will never be stored or
// told, if no transaction holds it (an *UnavailableError during an
// outage, else cause); otherwise r goes on (its Done is still called) and
// the error matches ErrOutcomeUnknown.
func (w *Writer) Withdraw(r *Request, cause error) error {
	if r.state.CompareAndSwap(rQueued, rWithdrawn) {
		if since, last, ok := w.Outage(); ok {
			return &UnavailableError{Since: since, Last: last, Cause: cause}
		}
		return cause
	}
	return &outcomeUnknown{cause}
}

// Outage reports whether the store is unavailable: since when its
// transactions have failed with transient errors, and the last error.
func (w *Writer) Outage() (since time.Time, last error, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.outSince, w.outErr, !w.outSince.IsZero()
}

// Fence fails, without trying them, the requests not yet committed that
// hold an op of an owner epoch up to epoch (store.OwnerOp): the owner of
// that epoch lost its lease, and its decisions may not be stored after
// it. A transaction in flight is not stopped (the store fences it by its
// epoch).
func (w *Writer) Fence(epoch int64) {
	for {
		old := w.fenced.Load()
		if epoch <= old || w.fenced.CompareAndSwap(old, epoch) {
			break
		}
	}
	w.wake()
}

func (w *Writer) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// commit runs reqs in one transaction, retrying it through transient
// failures (see Hooks.Outage) until it commits, the store fails, or the
// writer stops and its grace ends.
func (w *Writer) commit(reqs []*Request) {
	var stopBy time.Time // when Close gives up retrying
	flaky := 0
	for attempt := 0; ; attempt++ {
		if err := w.Err(); err != nil {
			for _, r := range reqs {
				w.finish(r, nil, err)
			}
			return
		}
		live := w.takeLive(reqs)
		if len(live) == 0 {
			return
		}
		batch, err := w.apply(live)
		var unknown *store.UnknownCommitError
		if errors.As(err, &unknown) {
			committed, rerr := w.resolve(unknown, &stopBy)
			switch {
			case rerr != nil:
				w.giveUp(live, rerr)
				return
			case committed:
				batch, err = unknown.Batch, nil
			default:
				err = unknown.Err // not stored: retry
			}
		}
		if err == nil {
			w.committed(live, batch)
			return
		}
		fault := store.FaultOf(w.cfg.Store, err)
		if fault == store.Flaky {
			if flaky++; flaky > w.cfg.MaxFlaky {
				fault = store.Fatal
				err = fmt.Errorf("%w (failed %d times in a row)", err, flaky)
			}
		}
		if fault == store.Fatal {
			w.failWith(err)
			for _, r := range live {
				w.finish(r, nil, err)
			}
			return
		}
		w.noteOutage(err)
		for _, r := range live {
			r.state.Store(rQueued) // nothing stored: Do may withdraw it
		}
		if !w.pause(attempt, &stopBy) {
			since, last, _ := w.Outage()
			for _, r := range live {
				if r.state.CompareAndSwap(rQueued, rDone) {
					r.done(nil, &UnavailableError{Since: since, Last: last, Cause: ErrClosed})
				}
			}
			return
		}
	}
}

// takeLive moves the requests of reqs still queued in flight and returns
// them; those withdrawn are dropped, and those of a fenced epoch fail
// with store.ErrNotOwner.
func (w *Writer) takeLive(reqs []*Request) []*Request {
	live := make([]*Request, 0, len(reqs))
	fenced := w.fenced.Load()
	for _, r := range reqs {
		if fenced > 0 && holdsEpoch(r.Ops, fenced) {
			if r.state.CompareAndSwap(rQueued, rDone) {
				r.done(nil, store.ErrNotOwner)
			}
			continue
		}
		if r.state.CompareAndSwap(rQueued, rInFlight) {
			live = append(live, r)
		}
	}
	return live
}

// holdsEpoch reports whether ops hold an owner op of an epoch up to epoch.
func holdsEpoch(ops []store.Op, epoch int64) bool {
	for _, op := range ops {
		if o, ok := op.(store.OwnerOp); ok && o.OwnerEpoch() > 0 && o.OwnerEpoch() <= epoch {
			return true
		}
	}
	return false
}

// apply runs the ops of reqs in one transaction.
func (w *Writer) apply(reqs []*Request) (store.Batch, error) {
	var ops []store.Op
	if len(reqs) == 1 {
		ops = reqs[0].Ops
	} else {
		for _, r := range reqs {
			ops = append(ops, r.Ops...)
		}
	}
	if len(ops) == 0 {
		return store.Batch{}, nil
	}
	// Transactions that timed out in a row give this one more time.
	ctx, cancel := w.txContext(w.timeouts)
	defer cancel()
	began := w.cfg.Clock.Monotonic()
	batch, err := w.cfg.Store.Apply(ctx, ops)
	if ctx.Err() != nil && err != nil {
		w.timeouts++
	} else {
		w.timeouts = 0
	}
	took := w.cfg.Clock.Monotonic() - began
	w.statMu.Lock()
	w.busy += max(took, 0)
	if err == nil {
		w.batches++
		w.ops += int64(len(ops))
	}
	w.statMu.Unlock()
	return batch, err
}

// txContext bounds a transaction or a read by TxTimeout, doubled for each
// of the timeouts in a row before it, up to 8 times (none without
// TxTimeout).
func (w *Writer) txContext(timeouts int) (context.Context, context.CancelFunc) {
	if w.cfg.TxTimeout > 0 {
		return context.WithTimeout(context.Background(), w.cfg.TxTimeout<<min(timeouts, 3))
	}
	return context.Background(), func() {}
}

// resolve asks the store whether the transaction of u committed, until it
// can tell. An error means it could not be told before the writer's stop
// grace ended, or the store failed (a rewind).
func (w *Writer) resolve(u *store.UnknownCommitError, stopBy *time.Time) (bool, error) {
	w.noteOutage(u)
	for attempt := 0; ; attempt++ {
		ctx, cancel := w.txContext(0)
		committed, err := u.Resolve(ctx)
		cancel()
		if err == nil {
			return committed, nil
		}
		if store.FaultOf(w.cfg.Store, err) == store.Fatal {
			w.failWith(err)
			return false, err
		}
		w.noteOutage(err)
		if !w.pause(attempt, stopBy) {
			return false, &outcomeUnknown{fmt.Errorf("%w: %w", ErrClosed, err)}
		}
	}
}

// giveUp ends reqs, whose transaction may have committed, with err.
func (w *Writer) giveUp(reqs []*Request, err error) {
	if !errors.Is(err, ErrOutcomeUnknown) && !errors.Is(err, store.ErrRewound) {
		err = &outcomeUnknown{err}
	}
	for _, r := range reqs {
		w.finish(r, nil, err)
	}
}

// pause waits before the next attempt: a jittered backoff, cut short by
// Fence or Close. It returns false once Close has been called and its
// grace (StopGrace) has passed.
func (w *Writer) pause(attempt int, stopBy *time.Time) bool {
	select {
	case <-w.stop:
		if stopBy.IsZero() {
			*stopBy = w.cfg.Clock.Now().Add(w.cfg.StopGrace)
		}
		if !w.cfg.Clock.Now().Before(*stopBy) {
			return false
		}
	default:
	}
	d := w.cfg.MinBackoff << min(attempt, 20)
	if d <= 0 || d > w.cfg.MaxBackoff {
		d = w.cfg.MaxBackoff
	}
	d = d/2 + rand.N(d/2+1)
	t := w.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-w.kick:
	}
	return true
}

// noteOutage records err, a transient failure, and calls Hooks.Outage at
// an outage's first.
func (w *Writer) noteOutage(err error) {
	w.mu.Lock()
	first := w.outSince.IsZero()
	if first {
		w.outSince = w.cfg.Clock.Now()
	}
	w.outErr = err
	since := w.outSince
	w.mu.Unlock()
	if first && w.cfg.Hooks.Outage != nil {
		w.cfg.Hooks.Outage(since, err)
	}
}

// finish tells r its outcome, unless it was withdrawn.
func (w *Writer) finish(r *Request, results []store.Result, err error) {
	for {
		s := r.state.Load()
		if s == rWithdrawn {
			return
		}
		if r.state.CompareAndSwap(s, rDone) {
			break
		}
	}
	r.done(results, err)
}

// committed publishes batch's events and tells reqs their results.
func (w *Writer) committed(reqs []*Request, batch store.Batch) {
	w.mu.Lock()
	since := w.outSince
	w.outSince, w.outErr = time.Time{}, nil
	w.mu.Unlock()
	if !since.IsZero() && w.cfg.Hooks.Recovered != nil {
		w.cfg.Hooks.Recovered(since)
	}
	results := batch.Results
	var evs []store.Event
	for i := range results {
		evs = append(evs, results[i].Events...)
	}
	if len(evs) > 0 {
		if w.follow && batch.Follows < w.lastSeq {
			// The log ended below what this writer already published:
			// the database lost commits (a restore, a lossy failover).
			err := fmt.Errorf("%w: this process saw event %d, the database's log ended at %d", store.ErrRewound, w.lastSeq, batch.Follows)
			w.failWith(err)
		}
		if batch.Follows > w.lastSeq && w.follow {
			// Other processes committed before this batch: publish
			// theirs first, so that the hub sees the log in order.
			w.catchUp(batch.Follows)
		}
		w.lastSeq = evs[len(evs)-1].Seq
		w.cfg.Hooks.Publish(evs, false)
	}
	i := 0
	for _, r := range reqs {
		n := len(r.Ops)
		r.state.Store(rDone)
		r.done(results[i:i+n:i+n], nil)
		i += n
	}
}
