package runcue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

func validateRetry(p RetryPolicy) error {
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("%w: MaxAttempts %d is negative", ErrInvalid, p.MaxAttempts)
	case p.BaseDelay < 0 || p.MaxDelay < 0:
		return fmt.Errorf("%w: negative retry delay", ErrInvalid)
	case p.BaseDelay > MaxTimeout || p.MaxDelay > MaxTimeout:
		return fmt.Errorf("%w: retry delay longer than %v", ErrInvalid, MaxTimeout)
	case p.Backoff > BackoffLinear:
		return fmt.Errorf("%w: unknown backoff %d", ErrInvalid, p.Backoff)
	case p.Jitter > JitterNone:
		return fmt.Errorf("%w: unknown jitter %d", ErrInvalid, p.Jitter)
	}
	return nil
}

// retryable reports whether err may be retried under the policy.
func retryable(p RetryPolicy, err error) bool {
	if errors.Is(err, ErrPermanent) {
		return false
	}
	if p.RetryOn != nil {
		return p.RetryOn(err)
	}
	return true
}

// encodeRetry returns a per-submission policy's stored form (RetryOn is
// not stored: the task's applies).
func encodeRetry(p RetryPolicy) []byte {
	b, _ := json.Marshal(store.RetryDef{MaxAttempts: p.MaxAttempts, Backoff: uint8(p.Backoff), BaseDelay: p.BaseDelay,
		MaxDelay: p.MaxDelay, Jitter: uint8(p.Jitter)})
	return b
}

func decodeRetry(b []byte) (RetryPolicy, error) {
	var r store.RetryDef
	if err := json.Unmarshal(b, &r); err != nil {
		return RetryPolicy{}, err
	}
	p := RetryPolicy{MaxAttempts: r.MaxAttempts, Backoff: Backoff(r.Backoff), BaseDelay: r.BaseDelay, MaxDelay: r.MaxDelay, Jitter: Jitter(r.Jitter)}
	return p, validateRetry(p)
}

// Retry requeues a failed unit with a fresh retry budget, and with it the
// dependents that failed only because of it. Failed units stay in the
// database until pruned: they are runcue's dead-letter queue.
func (c *Cue) Retry(ctx context.Context, id string) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	res, err := c.w.Do(ctx, &store.Requeue{IDs: []string{id}, At: c.clock.Now()})
	if err != nil {
		return wrapStoreErr(err)
	}
	if len(res[0].IDs) == 0 {
		wi, err := c.Get(ctx, id)
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: %s is %s", ErrNotFailed, id, wi.State)
	}
	c.requeued(res[0])
	return nil
}

// RetryFilter selects the failed units RetryFailed requeues.
type RetryFilter struct {
	// Tasks limits the retry to these task types; empty means all.
	Tasks []string
	// FinishedBefore, when set, takes only units that failed before it.
	FinishedBefore time.Time
}

// RetryFailed requeues every failed unit matching f with a fresh retry
// budget, and the dependents that failed only because of them, in one
// transaction. It returns the number of units requeued.
func (c *Cue) RetryFailed(ctx context.Context, f RetryFilter) (int, error) {
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	res, err := c.w.Do(ctx, &store.Requeue{Tasks: f.Tasks, FinishedBefore: f.FinishedBefore, At: c.clock.Now()})
	if err != nil {
		return 0, wrapStoreErr(err)
	}
	c.requeued(res[0])
	return len(res[0].IDs), nil
}

// requeued hands units this Cue requeued to its dispatcher, which loads
// them as it does units queued by other processes.
func (c *Cue) requeued(r store.Result) {
	if d := c.disp.Load(); d != nil && len(r.Events) > 0 {
		d.external(r.Events)
	}
}

// Permanent marks err as a failure that retrying cannot fix (invalid input,
// refused authorization): the unit fails at once, whatever its retry policy.
// Permanent(nil) is nil.
func Permanent(err error) error { return runcuetype.Permanent(err) }

// Skip returns an error that ends the unit as skipped (StateSkipped): a
// finished outcome that is not a failure, for work that need not be done
// (robots.txt forbids the fetch, the content has not changed). reason is
// stored in the unit's Error (its ErrorKind is "skipped") and carried by the
// work_skipped event. A skipped unit spends no retry budget, never counts
// toward a circuit, and satisfies its dependents unless their task sets
// FailOnSkippedDependency. Skip is honoured wrapped too (errors.As).
func Skip(reason string) error { return runcuetype.Skip(reason) }

// Overloaded returns err marked as the service's overload. The run is a
// failure like any other (retried per the task's policy, counted by the
// circuit breaker); besides, it cuts the adaptive limits (Service.Adaptive)
// of every service the unit uses. A Retry-After (RetryAfter, a 429) is an
// overload signal by itself, and so is a run cut off by its timeout: a
// handler needs Overloaded only for an overload that says neither.
func Overloaded(err error) error { return runcuetype.Overloaded(err) }

// RetryAfter returns an error that makes runcue hold back the named
// services (all of the unit's when none are named; a class name covers its
// keyed instances) until d has passed, and run the unit again no earlier
// than that. The run is recorded (outcome "deferred") but spends no retry
// budget, up to the task's MaxDeferrals, and never counts toward a circuit.
//
// A handler may instead return any error with a method
// RetryAfter() time.Duration, such as one an HTTP client builds from a
// Retry-After header; it then holds back all of the unit's services.
func RetryAfter(d time.Duration, err error, services ...string) error {
	return runcuetype.RetryAfter(d, err, services...)
}
