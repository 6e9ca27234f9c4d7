package broker

import (
	"testing"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Refusal checks in a fixed order, so Explain names the reason that holds
// longest first: pause, Retry-After, open circuit, probe, cap, rate.
func TestRefusalOrder(t *testing.T) {
	r := &Resource{}
	r.SetLimits(Limits{Concurrency: 1, Rate: 1, Window: time.Second, Threshold: 1, Timeout: time.Minute})
	_, refused := r.Refusal(t0, nil)
	assert.False(t, refused)

	r.Take(t0, false, nil)
	rf, _ := r.Refusal(t0, nil)
	assert.Equal(t, RefuseBusy, rf.Kind)
	r.Cap = true
	rf, _ = r.Refusal(t0, nil)
	assert.Equal(t, RefuseTaskCap, rf.Kind)
	r.Cap = false
	r.Return(nil)
	r.Window.Commit(t0)
	rf, _ = r.Refusal(t0, nil)
	assert.Equal(t, Refusal{Kind: RefuseRateLimited, Until: t0.Add(time.Second)}, rf)

	assert.True(t, r.Judge(t0, Failure, false), "threshold 1: one failure opens")
	rf, _ = r.Refusal(t0, nil)
	assert.Equal(t, Refusal{Kind: RefuseCircuitOpen, Until: t0.Add(time.Minute)}, rf)
	r.BlockedUntil = t0.Add(2 * time.Minute)
	rf, _ = r.Refusal(t0, nil)
	assert.Equal(t, RefuseRetryAfter, rf.Kind)
	r.Paused = true
	rf, _ = r.Refusal(t0, nil)
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
	assert.Equal(t, [2]rt.CircuitState{rt.CircuitClosed, rt.CircuitOpen}, [2]rt.CircuitState{from, to})
	_, _, changed = r.CircuitChange()
	assert.False(t, changed, "reported once")

	later := t0.Add(time.Minute)
	_, refused := r.Refusal(later, nil)
	assert.False(t, refused)
	assert.Equal(t, rt.CircuitOpen, r.Circuit.State, "Refusal changes nothing")
	ok, _, probe := r.Admit(later, nil)
	assert.True(t, ok)
	assert.True(t, probe)
	assert.Equal(t, rt.CircuitHalfOpen, r.Circuit.State)
	r.Take(t0, probe, nil)
	ok, until, _ := r.Admit(later, nil)
	assert.False(t, ok, "one probe at a time")
	assert.True(t, until.IsZero(), "ask again when the probe ends")

	assert.True(t, r.Judge(later, Neutral, true), "a probe without a verdict frees the slot")
	ok, _, probe = r.Admit(later, nil)
	require.True(t, ok && probe)
	r.Take(t0, true, nil)
	assert.True(t, r.Judge(later, Success, true))
	assert.Equal(t, rt.CircuitClosed, r.Circuit.State)
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
	r.Take(t0, false, nil)
	q, recheck = r.Quiet(t0.Add(time.Hour))
	assert.False(t, q)
	assert.True(t, recheck.IsZero())
}

// countMeter is a test meter: at most limit of its amount held at once,
// counting every call it gets.
type countMeter struct {
	amount            string
	limit, held       int64
	took, started     int64
	released, ended   int64
	restored          int
	lastStart, wallAt time.Time
}

func (m *countMeter) Counts() string { return m.amount }
func (m *countMeter) Refusal(now time.Time, cost int64) (Refusal, bool) {
	if m.held+cost > m.limit {
		return Refusal{Until: now.Add(time.Minute)}, true
	}
	return Refusal{}, false
}
func (m *countMeter) Take(now time.Time, cost int64) { m.held += cost; m.took += cost }
func (m *countMeter) Start(start, wall time.Time, cost int64) {
	m.started += cost
	m.lastStart, m.wallAt = start, wall
}
func (m *countMeter) Release(cost int64)                     { m.held -= cost; m.released += cost }
func (m *countMeter) End(cost int64)                         { m.held -= cost; m.ended += cost }
func (m *countMeter) Restore(starts []Logged, now time.Time) { m.restored += len(starts) }
func (m *countMeter) Quiet(now time.Time) (bool, time.Time)  { return m.held == 0, time.Time{} }

// An extra meter takes part in everything a built-in one does, charged the
// unit's cost of its amount: admission (RefuseMeter, after the built-in
// refusals), take, start, release, end, the amounts logged, restore.
func TestExtraMeter(t *testing.T) {
	m := &countMeter{amount: "widgets", limit: 10}
	r := &Resource{Extra: []Limiter{m}}
	r.SetLimits(Limits{Concurrency: 5, Rate: 100, Window: time.Minute})
	costs := rt.Costs{"widgets": 7}
	ok, _, _ := r.Admit(t0, costs)
	require.True(t, ok)
	r.Take(t0, false, costs)
	assert.Equal(t, int64(7), m.held)
	rf, refused := r.Refusal(t0, costs)
	require.True(t, refused, "7 + 7 > 10")
	assert.Equal(t, Refusal{Kind: RefuseMeter, Until: t0.Add(time.Minute), Meter: "widgets"}, rf)
	_, refused = r.Refusal(t0, rt.Costs{"widgets": 3})
	assert.False(t, refused, "7 + 3 fits")
	wall := time.Unix(1_800_000_000, 0)
	r.Start(t0.Add(time.Second), wall, costs)
	assert.Equal(t, int64(7), m.started)
	assert.Equal(t, 1, r.Window.Count(t0.Add(time.Second)), "the window counted the same start")
	r.Return(costs)
	assert.Equal(t, int64(0), m.held)
	r.Take(t0, false, nil)
	r.Release(nil)
	assert.Equal(t, int64(1), m.released, "a nil rt.Costs charges one")
	assert.Equal(t, []string{rt.Requests, "widgets"}, r.Logs(nil), "each amount once")
	assert.True(t, r.Counted())
	r.Restore(map[string][]Logged{"widgets": {{At: t0, Amount: 2}}, rt.Requests: {{At: t0, Amount: 1}}}, t0)
	assert.Equal(t, 1, m.restored)
	r.Paused = true
	rf, _ = r.Refusal(t0, costs)
	assert.Equal(t, RefusePaused, rf.Kind, "a pause comes first")
}

// TestCeilings: a meter's limit lowered by an adaptive controller below a
// unit's cost, with its configured limit in Ceilings, admits the unit
// when nothing else counts (it starts alone) instead of never; a cost
// above the configured limit stays unfit; without Ceilings the lowered
// limit is all there is.
func TestCeilings(t *testing.T) {
	r := &Resource{}
	r.SetAmounts([]AmountLimits{{Name: "tokens", Limit: 60, Window: time.Minute}}, 0)
	big := rt.Costs{"tokens": 80}
	if why := r.Unfit(big); why == "" {
		t.Fatal("without Ceilings, 80 never fits a limit of 60")
	}
	r.Ceilings = map[string]int64{"tokens": 100}
	if why := r.Unfit(big); why != "" {
		t.Fatalf("within the configured 100: %s", why)
	}
	if r.Unfit(rt.Costs{"tokens": 101}) == "" {
		t.Fatal("above the configured limit: unfit")
	}
	if ok, _, _ := r.Admit(t0, big); !ok {
		t.Fatal("alone, 80 starts under a lowered limit of 60")
	}
	r.Take(t0, false, big)
	r.Start(t0, t0, big)
	if ok, _, _ := r.Admit(t0, rt.Costs{"tokens": 1}); ok {
		t.Fatal("beside it, nothing: 80 already counts against 60")
	}
	if ok, _, _ := r.Admit(t0.Add(time.Minute+time.Nanosecond), big); !ok {
		t.Fatal("once it left the window, the next alone")
	}
}
