package call

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	rt "github.com/runcue/runcue/runcuetype"
)

// TestClassifyAndReport: every kind of handler error reads the same after
// a trip through a Report (an executor's, a pool worker's), and Classify
// gives each its verdict.
func TestClassifyAndReport(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want Verdict
	}{
		{"success", nil, Verdict{}},
		{"plain", errors.New("boom"), Verdict{}},
		{"permanent", rt.Permanent(errors.New("bad input")), Verdict{Permanent: true}},
		{"skip", fmt.Errorf("wrapped: %w", rt.Skip("unchanged")), Verdict{Skip: true, SkipReason: "unchanged"}},
		{"retry after", rt.RetryAfter(3*time.Second, errors.New("429"), "api"), Verdict{RetryAfter: true, Delay: 3 * time.Second, Services: []string{"api"}}},
		{"retry after, unbounded", rt.RetryAfter(time.Duration(math.MaxInt64), nil), Verdict{RetryAfter: true, Delay: rt.MaxTimeout}},
		{"an error with RetryAfter()", delayErr{}, Verdict{RetryAfter: true, Delay: 2 * time.Second}},
		{"overloaded", rt.Overloaded(errors.New("503")), Verdict{Overload: true}},
		{"permanent overload", rt.Permanent(rt.Overloaded(errors.New("503"))), Verdict{Permanent: true, Overload: true}},
		{"timeout", fmt.Errorf("handler: %w", rt.ErrTimeout), Verdict{Timeout: true}},
		{"panic", ErrGoexit, Verdict{Panic: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.err)
			assert.Equal(t, tc.want, got)
			back := ReportOf(tc.err).Err()
			if tc.err == nil {
				assert.NoError(t, back)
				return
			}
			if !tc.want.Skip {
				assert.Equal(t, tc.err.Error(), back.Error())
			}
			again := Classify(back)
			if tc.want.RetryAfter {
				again.Delay = again.Delay.Round(time.Millisecond)
			}
			assert.Equal(t, tc.want, again, "after a report")
		})
	}
}

// delayErr is an error an HTTP client might build from a Retry-After.
type delayErr struct{}

func (delayErr) Error() string             { return "429 Too Many Requests" }
func (delayErr) RetryAfter() time.Duration { return 2 * time.Second }

// TestInvoke: a panic becomes an error matching ErrPanic; a result that
// does not encode, or is over the payload's bound, fails permanently.
func TestInvoke(t *testing.T) {
	ctx := context.Background()
	out, err := Invoke(ctx, func(context.Context) (any, error) { return map[string]int{"n": 1}, nil }, 100)
	require.NoError(t, err)
	assert.JSONEq(t, `{"n":1}`, string(out))
	_, err = Invoke(ctx, func(context.Context) (any, error) { panic("oops") }, 100)
	assert.ErrorIs(t, err, rt.ErrPanic)
	assert.Contains(t, err.Error(), "panic: oops")
	_, err = Invoke(ctx, func(context.Context) (any, error) { return func() {}, nil }, 100)
	assert.ErrorIs(t, err, rt.ErrPermanent)
	_, err = Invoke(ctx, func(context.Context) (any, error) { return "0123456789", nil }, 5)
	assert.ErrorIs(t, err, rt.ErrPermanent)
	assert.Contains(t, err.Error(), "exceeds")
}

// TestCtxDeadline: Err reports DeadlineExceeded only once expired.
func TestCtxDeadline(t *testing.T) {
	var c Ctx
	var cancel context.CancelCauseFunc
	c.Context, cancel = context.WithCancelCause(context.Background())
	_, shown := c.Deadline()
	assert.False(t, shown)
	cancel(rt.ErrCancelled)
	assert.ErrorIs(t, c.Err(), context.Canceled)
	c.Expire()
	assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	assert.ErrorIs(t, context.Cause(&c), rt.ErrCancelled)
}
