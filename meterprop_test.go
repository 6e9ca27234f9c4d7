package runcue_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/broker"
)

// widgetMeter is a meter the engine does not know: at most limit widgets
// in any window of length, each start charged the unit's cost in widgets.
// It plugs in through the Meter port alone.
type widgetMeter struct {
	limit   int64
	length  time.Duration
	entries []widgetEntry // by start
	pending int64
}

type widgetEntry struct {
	at     time.Time
	amount int64
}

func (m *widgetMeter) Counts() string            { return "widgets" }
func (m *widgetMeter) Horizon() time.Duration    { return m.length }
func (m *widgetMeter) Take(_ time.Time, n int64) { m.pending += n }
func (m *widgetMeter) Release(n int64)           { m.pending -= n }
func (m *widgetMeter) End(int64)                 {}

func (m *widgetMeter) Start(start, _ time.Time, n int64) {
	m.pending -= n
	m.add(start, n)
}

func (m *widgetMeter) add(at time.Time, n int64) {
	i, _ := slices.BinarySearchFunc(m.entries, at, func(e widgetEntry, t time.Time) int { return e.at.Compare(t) })
	m.entries = slices.Insert(m.entries, i, widgetEntry{at, n})
}

// live returns the entries still in the window at now.
func (m *widgetMeter) live(now time.Time) []widgetEntry {
	cut := now.Add(-m.length)
	i, _ := slices.BinarySearchFunc(m.entries, cut, func(e widgetEntry, t time.Time) int {
		if !e.at.After(t) {
			return -1
		}
		return 1
	})
	return m.entries[i:]
}

func (m *widgetMeter) Refusal(now time.Time, n int64) (broker.Refusal, bool) {
	live := m.live(now)
	used := m.pending
	for _, e := range live {
		used += e.amount
	}
	if used+n <= m.limit {
		return broker.Refusal{}, false
	}
	if n > m.limit-m.pending {
		return broker.Refusal{}, true // only a release or a start can help
	}
	for _, e := range live { // the oldest leave first
		used -= e.amount
		if used+n <= m.limit {
			return broker.Refusal{Until: e.at.Add(m.length)}, true
		}
	}
	return broker.Refusal{}, true
}

func (m *widgetMeter) Restore(starts []broker.Logged, now time.Time) {
	for _, s := range starts {
		if s.At.After(now.Add(-m.length)) {
			m.add(s.At, s.Amount)
		}
	}
}

func (m *widgetMeter) Quiet(now time.Time) (bool, time.Time) {
	live := m.live(now)
	switch {
	case m.pending > 0:
		return false, time.Time{}
	case len(live) > 0:
		return false, live[len(live)-1].at.Add(m.length)
	}
	return true, time.Time{}
}

// TestMeterPortProperty: a meter of widgets (at most 10 in any 2 s), each
// unit costing 1 to 6 widgets (stored with the unit at submit), plugged in
// through the Meter port, is never exceeded, counted at the handlers'
// starts, across four owners: each is stopped mid-run (its running
// handlers interrupted) and the next rebuilds the meter from the service
// log. Logged seed.
func TestMeterPortProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 5))
	const (
		units  = 160
		limit  = 10
		window = 2 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	path := filepath.Join(t.TempDir(), "runcue.db")
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	costs := map[string]int64{}
	durations := map[string]time.Duration{}
	subs := make([]runcue.Submission, units)
	for i := range subs {
		id := fmt.Sprintf("u%03d", i)
		subs[i] = runcue.Submission{ID: id, Task: "w"}
		costs[id] = 1 + rnd.Int64N(6)
		durations[id] = time.Duration(50+rnd.IntN(700)) * time.Millisecond
	}
	type start struct {
		at   time.Time
		cost int64
		id   string
	}
	var mu sync.Mutex
	var starts []start
	open := func() *runcue.Cue {
		c, err := runcue.Open(path, runcue.Config{Clock: clk, Logger: slog.New(slog.DiscardHandler), MaxConcurrent: 16})
		require.NoError(t, err)
		runcue.CheckInvariants(c, func(err error) { t.Error(err) })
		runcue.AddMeter(c, "api", func() broker.Limiter { return &widgetMeter{limit: limit, length: window} })
		runcue.SetCosts(c, func(s runcue.Submission) map[string]int64 { return map[string]int64{"widgets": costs[s.ID]} })
		require.NoError(t, c.Service("api", runcue.Service{}))
		require.NoError(t, c.Task("w", runcue.Task{Services: []string{"api"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			mu.Lock()
			starts = append(starts, start{w.Started, costs[w.ID], w.ID})
			mu.Unlock()
			tm := clk.NewTimer(durations[w.ID])
			defer tm.Stop()
			select {
			case <-tm.C():
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}}))
		require.NoError(t, c.Start(ctx))
		return c
	}
	c := open()
	_, err := c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	step := func(c *runcue.Cue) {
		_, err := c.Settle(ctx)
		require.NoError(t, err)
		clk.Advance(time.Duration(10+rnd.IntN(90)) * time.Millisecond)
	}
	step(c)
	// Explain names the meter that holds a unit back, at the unit's cost.
	said := false
	for _, s := range subs {
		ex, err := c.Explain(ctx, s.ID)
		require.NoError(t, err)
		for _, r := range ex.Reasons {
			if r.Kind == runcue.ReasonRateLimited && r.Service == "api" && strings.Contains(r.Detail, "widgets meter is full") {
				said = true
			}
		}
	}
	assert.True(t, said, "no unit is held back by the widgets meter, says Explain")
	c = succeedOwners(t, ctx, c, open, step, func() int { return 60 + rnd.IntN(120) }, units, func(owner int) {
		mu.Lock()
		defer mu.Unlock()
		t.Logf("owner %d stops after %d starts", owner, len(starts))
	})
	defer c.Close()

	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(starts, func(a, b start) int { return a.at.Compare(b.at) })
	var charged int64
	for i := range starts {
		var sum int64
		for j := i; j < len(starts) && starts[j].at.Sub(starts[i].at) < window; j++ {
			sum += starts[j].cost
		}
		if !assert.LessOrEqual(t, sum, int64(limit), "widgets started in [%v, +%v)", starts[i].at.Sub(t0), window) {
			break
		}
		charged += starts[i].cost
	}
	t.Logf("%d starts, %d widgets, virtual time %v", len(starts), charged, clk.Now().Sub(t0))
	t.Logf("%d runs interrupted by a stop ran again", len(starts)-units)
}
