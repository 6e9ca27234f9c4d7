package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Refusal checks in a fixed order, so Explain names the reason that holds
// longest first: pause, Retry-After, open circuit, probe, cap, rate.
func TestRefusalOrder(t *testing.T) {
	r := &Resource{}
	r.SetLimits(Limits{Concurrency: 1, Rate: 1, Window: time.Second, Threshold: 1, Timeout: time.Minute})
	_, refused := r.Refusal(t0)
	assert.False(t, refused)

	r.Take(t0, false)
	rf, _ := r.Refusal(t0)
	assert.Equal(t, RefuseBusy, rf.Kind)
	r.Cap = true
	rf, _ = r.Refusal(t0)
	assert.Equal(t, RefuseTaskCap, rf.Kind)
	r.Cap = false
	r.Return()
	r.Window.Commit(t0)
	rf, _ = r.Refusal(t0)
	assert.Equal(t, Refusal{Kind: RefuseRateLimited, Until: t0.Add(time.Second)}, rf)

	assert.True(t, r.Judge(t0, Failure, false), "threshold 1: one failure opens")
	rf, _ = r.Refusal(t0)
	assert.Equal(t, Refusal{Kind: RefuseCircuitOpen, Until: t0.Add(time.Minute)}, rf)
	r.BlockedUntil = t0.Add(2 * time.Minute)
	rf, _ = r.Refusal(t0)
	assert.Equal(t, RefuseRetryAfter, rf.Kind)
	r.Paused = true
	rf, _ = r.Refusal(t0)
	assert.Equal(t, RefusePaused, rf.Kind)
}

// Admit moves an open circuit whose time is over to half-open and makes the
// dispatch its probe; Refusal alone moves nothing. The change is left for
// the caller, once.
func TestAdmitProbeAndCircuitChange(t *testing.T) {
	r := &Resource{}
	r.SetLimits(Limits{Threshold: 2, Timeout: time.Minute})
	_, _, changed := r.CircuitChange()
	assert.False(t, changed, "a new circuit starts closed, reported")

	assert.False(t, r.Judge(t0, Failure, false))
	assert.True(t, r.Judge(t0, Failure, false))
	from, to, changed := r.CircuitChange()
	require.True(t, changed)
	assert.Equal(t, [2]CircuitState{Closed, Open}, [2]CircuitState{from, to})
	_, _, changed = r.CircuitChange()
	assert.False(t, changed, "reported once")

	later := t0.Add(time.Minute)
	_, refused := r.Refusal(later)
	assert.False(t, refused)
	assert.Equal(t, Open, r.Circuit.State, "Refusal changes nothing")
	ok, _, probe := r.Admit(later)
	assert.True(t, ok)
	assert.True(t, probe)
	assert.Equal(t, HalfOpen, r.Circuit.State)
	r.Take(t0, probe)
	ok, until, _ := r.Admit(later)
	assert.False(t, ok, "one probe at a time")
	assert.True(t, until.IsZero(), "ask again when the probe ends")

	assert.True(t, r.Judge(later, Neutral, true), "a probe without a verdict frees the slot")
	ok, _, probe = r.Admit(later)
	require.True(t, ok && probe)
	r.Take(t0, true)
	assert.True(t, r.Judge(later, Success, true))
	assert.Equal(t, Closed, r.Circuit.State)
}

// Quiet: a keyed instance may be forgotten only when nothing it holds
// outlives it.
func TestQuiet(t *testing.T) {
	r := &Resource{}
	r.SetLimits(Limits{Rate: 2, Window: time.Second})
	q, _ := r.Quiet(t0)
	assert.True(t, q)
	r.Window.Commit(t0)
	q, recheck := r.Quiet(t0)
	assert.False(t, q)
	assert.Equal(t, t0.Add(time.Second), recheck)
	q, _ = r.Quiet(t0.Add(time.Second))
	assert.True(t, q)
	r.Take(t0, false)
	q, recheck = r.Quiet(t0.Add(time.Hour))
	assert.False(t, q)
	assert.True(t, recheck.IsZero())
}
