// Package call is the one way runcue calls a handler and reads what its
// error means: in the owner's process (internal/local), in an executor
// (internal/execloop), and in the owner reading an executor's report of a
// run (internal/remote). The process pool (package proc) runs inside a
// handler and reports through the same errors.
package call

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

// Reporter is what a run's Work reports to: its runner's record of the
// run. Its methods are safe for concurrent use.
type Reporter interface {
	Progress(b []byte)
	Heartbeat()
	Use(amounts rt.Costs)
	Observe(o rt.Observation)
}

// Ctx is a handler's context. runcue cancels it with the reason
// (context.Cause: ErrTimeout, ErrCancelled, ErrShutdown, ...). It shows
// the run's deadline when Shown is set, but no runtime timer enforces it:
// the runner does, calling Expire before it cancels, and from then Err
// reports context.DeadlineExceeded, as a context with that deadline would.
// A context a handler derives from it is cancelled at the deadline too,
// and its Err reports context.Canceled (its Cause is ErrTimeout).
type Ctx struct {
	context.Context // from context.WithCancelCause
	// Shown is the deadline shown; zero: none (a fake clock's deadline
	// means nothing to the runtime).
	Shown   time.Time
	expired atomic.Bool
}

// Deadline returns the run's deadline, if it is shown.
func (c *Ctx) Deadline() (time.Time, bool) { return c.Shown, !c.Shown.IsZero() }

// Err is context.DeadlineExceeded once the run's deadline has passed.
func (c *Ctx) Err() error {
	err := c.Context.Err()
	if err != nil && c.expired.Load() {
		return context.DeadlineExceeded
	}
	return err
}

// Expire marks the deadline passed; call it before cancelling with
// ErrTimeout.
func (c *Ctx) Expire() { c.expired.Store(true) }

// Invoke calls fn with ctx and encodes its result. A panic becomes an
// error matching ErrPanic, with the stack (at most 8 KiB). A result that
// does not encode as JSON, or whose JSON is longer than maxPayload bytes,
// fails the run permanently.
func Invoke(ctx context.Context, fn func(context.Context) (any, error), maxPayload int) ([]byte, error) {
	res, err := recovered(ctx, fn)
	if err != nil {
		return nil, err
	}
	out, err := json.Marshal(res)
	switch {
	case err != nil:
		return nil, rt.Permanent(fmt.Errorf("runcue: encode result: %w", err))
	case len(out) > maxPayload:
		return nil, rt.Permanent(fmt.Errorf("runcue: result of %d bytes exceeds Config.MaxPayload (%d)", len(out), maxPayload))
	}
	return out, nil
}

func recovered(ctx context.Context, fn func(context.Context) (any, error)) (res any, err error) {
	defer func() {
		if v := recover(); v != nil {
			stack := debug.Stack()
			if len(stack) > 8<<10 {
				stack = stack[:8<<10]
			}
			res, err = nil, &panicError{value: v, stack: stack}
		}
	}()
	return fn(ctx)
}

// ErrGoexit is the failure recorded for a handler that called
// runtime.Goexit. It matches ErrPanic: the handler did not return.
var ErrGoexit error = &panicError{value: "handler called runtime.Goexit (t.FailNow, t.SkipNow or log.Fatal-like code in a handler?) instead of returning"}

// panicError records a handler panic.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string {
	if len(e.stack) == 0 {
		return fmt.Sprintf("panic: %v", e.value)
	}
	return fmt.Sprintf("panic: %v\n%s", e.value, e.stack)
}

func (e *panicError) Is(target error) bool { return target == rt.ErrPanic }

// Verdict is what a run's error says to the scheduler. At most one of
// Skip, RetryAfter, Timeout and Panic is set, in that order of precedence;
// Permanent and Overload may accompany any.
type Verdict struct {
	// Permanent: the error matches ErrPermanent (never retried);
	// Overload: ErrOverloaded (cuts the adaptive limits).
	Permanent, Overload bool
	// Skip: the handler skipped the unit (Skip), for SkipReason.
	Skip       bool
	SkipReason string
	// RetryAfter: a service asked to wait Delay (at most MaxTimeout),
	// holding Services (empty: all of the unit's).
	RetryAfter bool
	Delay      time.Duration
	Services   []string
	// Timeout: the run's deadline passed (ErrTimeout); Panic: the handler
	// panicked (ErrPanic).
	Timeout, Panic bool
}

// Classify reads err (nil: a success, the zero Verdict).
func Classify(err error) Verdict {
	var v Verdict
	if err == nil {
		return v
	}
	v.Permanent, v.Overload = errors.Is(err, rt.ErrPermanent), errors.Is(err, rt.ErrOverloaded)
	var skip *rt.SkipError
	var ra *rt.RetryAfterError
	var withDelay interface{ RetryAfter() time.Duration }
	switch {
	case errors.As(err, &skip):
		v.Skip, v.SkipReason = true, skip.Reason
	case errors.As(err, &ra):
		v.RetryAfter, v.Delay, v.Services = true, bound(ra.Delay), ra.Services
	case errors.As(err, &withDelay):
		v.RetryAfter, v.Delay = true, bound(withDelay.RetryAfter())
	case errors.Is(err, rt.ErrTimeout):
		v.Timeout = true
	case errors.Is(err, rt.ErrPanic):
		v.Panic = true
	}
	return v
}

func bound(d time.Duration) time.Duration { return min(max(d, 0), rt.MaxTimeout) }

// BoundUsed bounds an amount a run reported using (Work.Used) to [0,
// MaxCost], so that no report can overflow a meter's count.
func BoundUsed(n int64) int64 { return min(max(n, 0), rt.MaxCost) }

// Report is an executor's report of a run's end: store.ReportEnd's
// Ending, in JSON. The executor writes it (ReportOf); the owner reads it
// back into the engine's terms (internal/remote).
type Report struct {
	Error      string           `json:"error,omitempty"`
	Result     json.RawMessage  `json:"result,omitempty"`
	NotStarted bool             `json:"not_started,omitempty"`
	Late       bool             `json:"late,omitempty"`
	Lost       bool             `json:"lost,omitempty"`
	Permanent  bool             `json:"permanent,omitempty"`
	Overload   bool             `json:"overload,omitempty"`
	Skip       *string          `json:"skip,omitempty"`
	RetryAfter *int64           `json:"retry_after_ms,omitempty"`
	Services   []string         `json:"services,omitempty"`
	Timeout    bool             `json:"timeout,omitempty"`
	Panic      bool             `json:"panic,omitempty"`
	Used       map[string]int64 `json:"used,omitempty"`
	// Observations are what the handler reported of its services' limits
	// (Work.Observe), in order, each with the instant it reported it on
	// the store's clock; at most MaxObservations, the latest.
	Observations []Observed `json:"observations,omitempty"`
}

// Observed is one Work.Observe of a remote run.
type Observed struct {
	At          time.Time `json:"at"`
	Observation rt.Observation
}

// MaxObservations bounds the observations a report carries: the latest
// are kept (a reading replaces what an older one said).
const MaxObservations = 32

// ReportOf describes a handler's error as Classify reads it.
func ReportOf(err error) Report {
	var r Report
	if err == nil {
		return r
	}
	v := Classify(err)
	r.Error, r.Permanent, r.Overload = err.Error(), v.Permanent, v.Overload
	switch {
	case v.Skip:
		r.Skip = &v.SkipReason
	case v.RetryAfter:
		ms := v.Delay.Milliseconds()
		r.RetryAfter, r.Services = &ms, v.Services
	case v.Timeout:
		r.Timeout = true
	case v.Panic:
		r.Panic = true
	}
	return r
}

// Err rebuilds the error r reports (nil for none), so that it matches
// what the handler's error matched: ErrPermanent, ErrOverloaded, a Skip
// (*SkipError), a Retry-After (*RetryAfterError), ErrTimeout or ErrPanic.
// Its text is the handler's error's.
func (r Report) Err() error {
	if r.Error == "" {
		return nil
	}
	var err error = &reported{msg: r.Error}
	switch {
	case r.Skip != nil:
		err = &rt.SkipError{Reason: *r.Skip}
	case r.RetryAfter != nil:
		err = &reported{msg: r.Error, cause: &rt.RetryAfterError{Delay: time.Duration(*r.RetryAfter) * time.Millisecond, Services: r.Services}}
	case r.Timeout:
		err = &reported{msg: r.Error, cause: rt.ErrTimeout}
	case r.Panic:
		err = &reported{msg: r.Error, cause: rt.ErrPanic}
	}
	if r.Overload {
		err = &reported{msg: r.Error, cause: &rt.OverloadedError{Err: err}}
	}
	if r.Permanent {
		err = &reported{msg: r.Error, cause: &rt.PermanentError{Err: err}}
	}
	return err
}

// reported is an error read from a report: its text, and the error it
// matches (errors.Is, errors.As).
type reported struct {
	msg   string
	cause error
}

func (e *reported) Error() string { return e.msg }
func (e *reported) Unwrap() error { return e.cause }
