package httplimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
)

var now = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// Recorded header sets, as the providers send them (values as in their
// documentation's examples), and the readings they give.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		h      http.Header
		status int
		want   httplimit.Reading
	}{
		{"openai", header(
			"x-ratelimit-limit-requests", "60",
			"x-ratelimit-limit-tokens", "150000",
			"x-ratelimit-remaining-requests", "59",
			"x-ratelimit-remaining-tokens", "149984",
			"x-ratelimit-reset-requests", "1s",
			"x-ratelimit-reset-tokens", "6m0s"), 200,
			httplimit.Reading{Limits: []httplimit.Limit{
				{Name: httplimit.Requests, Max: 60, Remaining: 59, Reset: time.Second},
				{Name: httplimit.Tokens, Max: 150000, Remaining: 149984, Reset: 6 * time.Minute},
			}}},
		{"openai 429, milliseconds", header(
			"x-ratelimit-limit-tokens", "10000",
			"x-ratelimit-remaining-tokens", "0",
			"x-ratelimit-reset-tokens", "12ms",
			"retry-after", "1"), 429,
			httplimit.Reading{Throttled: true, RetryAfter: time.Second, Limits: []httplimit.Limit{
				{Name: httplimit.Tokens, Max: 10000, Remaining: 0, Reset: 12 * time.Millisecond},
			}}},
		{"anthropic", header(
			"anthropic-ratelimit-requests-limit", "50",
			"anthropic-ratelimit-requests-remaining", "49",
			"anthropic-ratelimit-requests-reset", "2026-11-25T12:00:01Z",
			"anthropic-ratelimit-input-tokens-limit", "40000",
			"anthropic-ratelimit-input-tokens-remaining", "39000",
			"anthropic-ratelimit-input-tokens-reset", "2026-11-25T12:00:02Z",
			"anthropic-ratelimit-output-tokens-limit", "8000",
			"anthropic-ratelimit-output-tokens-remaining", "7900",
			"anthropic-ratelimit-output-tokens-reset", "2026-11-25T12:01:07Z",
			"anthropic-ratelimit-tokens-limit", "48000",
			"anthropic-ratelimit-tokens-remaining", "46900",
			"anthropic-ratelimit-tokens-reset", "2026-11-25T12:00:02Z"), 200,
			httplimit.Reading{Limits: []httplimit.Limit{
				{Name: httplimit.Requests, Max: 50, Remaining: 49, Reset: time.Second},
				{Name: httplimit.Tokens, Max: 48000, Remaining: 46900, Reset: 2 * time.Second},
				{Name: httplimit.InputTokens, Max: 40000, Remaining: 39000, Reset: 2 * time.Second},
				{Name: httplimit.OutputTokens, Max: 8000, Remaining: 7900, Reset: 67 * time.Second},
			}}},
		{"anthropic 429", header(
			"retry-after", "20",
			"anthropic-ratelimit-output-tokens-limit", "8000",
			"anthropic-ratelimit-output-tokens-remaining", "0",
			"anthropic-ratelimit-output-tokens-reset", "2026-11-25T12:00:20Z"), 429,
			httplimit.Reading{Throttled: true, RetryAfter: 20 * time.Second, Limits: []httplimit.Limit{
				{Name: httplimit.OutputTokens, Max: 8000, Remaining: 0, Reset: 20 * time.Second},
			}}},
		{"ietf structured", header(
			"RateLimit-Policy", `"default";q=100;w=60, "daily";q=1000;w=86400`,
			"RateLimit", `"default";r=50;t=30`), 200,
			httplimit.Reading{Limits: []httplimit.Limit{
				{Name: "default", Max: 100, Remaining: 50, Reset: 30 * time.Second, Window: time.Minute},
			}}},
		{"ietf older draft", header(
			"RateLimit-Limit", "100, 100;w=60",
			"RateLimit-Remaining", "7",
			"RateLimit-Reset", "4"), 200,
			httplimit.Reading{Limits: []httplimit.Limit{
				{Name: "ratelimit", Max: 100, Remaining: 7, Reset: 4 * time.Second},
			}}},
		{"retry-after as an HTTP date", header(
			"Retry-After", "Wed, 25 Nov 2026 12:00:45 GMT"), 503,
			httplimit.Reading{RetryAfter: 45 * time.Second}},
		{"absurd values are not believed", header(
			"anthropic-ratelimit-requests-limit", "50",
			"anthropic-ratelimit-requests-remaining", "-3",
			"anthropic-ratelimit-requests-reset", "9999-12-31T23:59:59Z",
			"x-ratelimit-limit-tokens", "lots",
			"x-ratelimit-remaining-tokens", "12",
			"x-ratelimit-reset-tokens", "-5s",
			"retry-after", "999999999"), 429,
			httplimit.Reading{Throttled: true, Limits: []httplimit.Limit{
				{Name: httplimit.Requests, Max: 50, Remaining: -1},
				{Name: httplimit.Tokens, Max: -1, Remaining: 12},
			}}},
		{"a stale reset, already past", header(
			"anthropic-ratelimit-tokens-limit", "48000",
			"anthropic-ratelimit-tokens-remaining", "48000",
			"anthropic-ratelimit-tokens-reset", "2026-11-25T11:59:00Z",
			"retry-after", "Wed, 25 Nov 2026 11:00:00 GMT"), 200,
			httplimit.Reading{Limits: []httplimit.Limit{
				{Name: httplimit.Tokens, Max: 48000, Remaining: 48000},
			}}},
		{"no limit headers", header("Content-Type", "application/json"), 200, httplimit.Reading{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, httplimit.Parse(tc.h, tc.status, now))
		})
	}
}

func TestReadingLimit(t *testing.T) {
	r := httplimit.Parse(header("x-ratelimit-remaining-tokens", "5"), 200, now)
	l, ok := r.Limit(httplimit.Tokens)
	require.True(t, ok)
	assert.Equal(t, int64(5), l.Remaining)
	assert.Equal(t, int64(-1), l.Max)
	_, ok = r.Limit(httplimit.Requests)
	assert.False(t, ok)
}

// Reading what OpenAI said after a call.
func ExampleParse() {
	h := http.Header{}
	h.Set("x-ratelimit-remaining-tokens", "149984")
	h.Set("x-ratelimit-reset-tokens", "6m0s")
	r := httplimit.Parse(h, http.StatusOK, time.Now())
	if l, ok := r.Limit(httplimit.Tokens); ok {
		fmt.Println(l.Remaining, l.Reset)
	}
	// Output: 149984 6m0s
}

// TestReportUnavailable: a 503 is an overload signal: runcue.Overloaded,
// inside a RetryAfter when the response says how long to wait.
func TestReportUnavailable(t *testing.T) {
	err := httplimit.Report(nil, http.Header{}, http.StatusServiceUnavailable, now)
	assert.ErrorIs(t, err, runcue.ErrOverloaded)
	assert.ErrorIs(t, err, httplimit.ErrUnavailable)
	var ra *runcue.RetryAfterError
	assert.False(t, errors.As(err, &ra))
	err = httplimit.Report(nil, http.Header{"Retry-After": {"7"}}, http.StatusServiceUnavailable, now)
	require.True(t, errors.As(err, &ra))
	assert.Equal(t, 7*time.Second, ra.Delay)
	assert.ErrorIs(t, err, runcue.ErrOverloaded)
	assert.NoError(t, httplimit.Report(nil, http.Header{}, http.StatusOK, now))
}
