package runcuetype

import (
	"errors"
	"fmt"
	"time"
)

// The errors a handler's run may end with, and ErrInvalid. runcue's
// variables of the same names are these errors.
var (
	// ErrInvalid: a registration or submission is malformed.
	ErrInvalid = errors.New("runcue: invalid argument")
	// ErrShutdown is the cause of a handler's context cancelled by
	// StopAndCancel or Close.
	ErrShutdown = errors.New("runcue: shutting down")
	// ErrPanic marks a failure recorded for a handler that panicked (or
	// called runtime.Goexit).
	ErrPanic = errors.New("runcue: handler panicked")
	// ErrTimeout is the cause of a handler's context cancelled at its
	// deadline, and matches the error recorded for the run.
	ErrTimeout = errors.New("runcue: timeout")
	// ErrCancelled is the cause of a handler's context cancelled by Cancel.
	ErrCancelled = errors.New("runcue: cancelled")
	// ErrPermanent matches every error made with Permanent: the run fails
	// without a retry.
	ErrPermanent = errors.New("runcue: permanent failure")
	// ErrOverloaded matches every error made with Overloaded: the service
	// said it is overloaded (see Adaptive).
	ErrOverloaded = errors.New("runcue: service overloaded")
)

// PermanentError marks a failure that is never retried.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Is reports whether target is ErrPermanent.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent marks err as a failure that retrying cannot fix (invalid input,
// refused authorization): the unit fails at once, whatever its retry policy.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// SkipError ends a unit as skipped. Make one with Skip.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "skipped: " + e.Reason }

// Skip returns an error that ends the unit as skipped (StateSkipped): a
// finished outcome that is not a failure, for work that need not be done
// (robots.txt forbids the fetch, the content has not changed). reason is
// stored in the unit's Error (its ErrorKind is "skipped") and carried by the
// work_skipped event. A skipped unit spends no retry budget, never counts
// toward a circuit, and satisfies its dependents unless their task sets
// FailOnSkippedDependency. Skip is honoured wrapped too (errors.As).
func Skip(reason string) error { return &SkipError{Reason: reason} }

// OverloadedError marks a failure as the service's overload: it answered
// 503 Service Unavailable, or shed the request, without saying how long
// to wait. Make one with Overloaded.
type OverloadedError struct{ Err error }

// Error is the underlying error's text (the service's own words).
func (e *OverloadedError) Error() string {
	if e.Err == nil {
		return ErrOverloaded.Error()
	}
	return e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *OverloadedError) Unwrap() error { return e.Err }

// Is makes every OverloadedError match ErrOverloaded.
func (e *OverloadedError) Is(target error) bool { return target == ErrOverloaded }

// Overloaded returns err marked as the service's overload. The run is a
// failure like any other (retried per the task's policy, counted by the
// circuit breaker); besides, it cuts the adaptive limits (Service.Adaptive)
// of every service the unit uses. A Retry-After (RetryAfter, a 429) is an
// overload signal by itself, and so is a run cut off by its timeout: a
// handler needs Overloaded only for an overload that says neither.
func Overloaded(err error) error { return &OverloadedError{Err: err} }

// RetryAfterError asks runcue to try a unit again after Delay because a
// service answered "not now" (HTTP 429 or 503 with Retry-After). Make one
// with RetryAfter.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
	// Services are the services to hold back; empty means all of the
	// unit's services (keyed instances included).
	Services []string
}

func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %v", e.Delay)
	}
	return fmt.Sprintf("retry after %v: %v", e.Delay, e.Err)
}

// Unwrap returns the underlying error.
func (e *RetryAfterError) Unwrap() error { return e.Err }

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
	return &RetryAfterError{Delay: d, Err: err, Services: services}
}

// ErrExecutorLost is the error recorded for a run whose executor stopped
// heartbeating before it reported the run's end: the unit is requeued, no
// retry budget spent (attempt outcome "abandoned").
var ErrExecutorLost = errors.New("runcue: the executor running the unit stopped")

// ErrLeaseLost is the cause an executor cancels a handler with when its
// run is no longer assigned to it (the scheduler requeued or ended it).
var ErrLeaseLost = errors.New("runcue: the run's lease was lost")
