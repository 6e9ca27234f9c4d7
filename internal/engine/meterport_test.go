package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runcue/runcue/internal/broker"
	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
)

// widgetMeter is a meter the engine does not know: at most limit widgets
// in any window of length, each start charged the unit's cost in widgets.
// It plugs in through the meter port (broker.Limiter) alone.
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

// finished reports whether the store holds no queued and no running unit.
func (w *world) finished() bool {
	n, err := w.st.QueuedCount(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	counts, err := w.st.CountActive(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, k := range counts {
		n += k
	}
	return n == 0
}

// TestMeterPortProperty: a meter of widgets (at most 10 in any 2 s), each
// unit costing 1 to 6 widgets (stored with the unit), plugged in through
// the meter port, is never exceeded, counted at the handlers' starts,
// across five owners: each of the first four is stopped mid-run (its
// running handlers cancelled) and the next rebuilds the meter from the
// service log. Logged seed. (Moved from the root, where it plugged the
// meter and the costs in through back doors.)
func TestMeterPortProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 5))
	const (
		units  = 160
		limit  = 10
		window = 2 * time.Second
	)
	w := newWorld(t)
	defer w.close()
	t0 := w.clk.Now()
	costs := map[string]int64{}
	durations := map[string]time.Duration{}
	var subs []*store.Unit
	for i := range units {
		id := fmt.Sprintf("u%03d", i)
		costs[id] = 1 + rnd.Int64N(6)
		durations[id] = time.Duration(50+rnd.IntN(700)) * time.Millisecond
		subs = append(subs, &store.Unit{ID: id, Task: "w", Costs: map[string]int64{"widgets": costs[id]}})
	}
	type start struct {
		at   time.Time
		cost int64
		id   string
	}
	var mu sync.Mutex
	var starts []start
	w.do("service api")
	w.useRunner("task w services=api attempts=100", &funcRunner{w: w, f: func(ctx context.Context, p *Run, at time.Time, _ []byte) Ending {
		mu.Lock()
		starts = append(starts, start{at, costs[p.ID], p.ID})
		mu.Unlock()
		tm := w.clk.NewTimer(durations[p.ID])
		defer tm.Stop()
		select {
		case <-tm.C():
			return Ending{}
		case <-ctx.Done():
			return stopped(ctx)
		}
	}})
	w.settings = func(s *Settings) { s.MaxConcurrent = 16 }
	w.hooks = func(h *Hooks) {
		h.Meters = map[string][]func() broker.Limiter{"api": {func() broker.Limiter { return &widgetMeter{limit: limit, length: window} }}}
	}
	w.do("start")
	w.insert(subs...)
	step := func() { w.do(fmt.Sprintf("tick %dms", 10+rnd.IntN(90))) }
	step()
	// Explain names the meter that holds a unit back.
	said := false
	for _, s := range subs {
		ex, _, err := w.e.Explain(w.ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		said = said || slices.ContainsFunc(ex.Reasons, func(r rt.Reason) bool {
			return r.Kind == rt.ReasonMeterFull && r.Service == "api" && r.Meter == "widgets" && strings.Contains(r.Detail, "widgets meter is full")
		})
	}
	if !said {
		t.Error("no unit is held back by the widgets meter, says Explain")
	}
	for owner := range 4 {
		for range 60 + rnd.IntN(120) {
			step()
		}
		mu.Lock()
		t.Logf("owner %d stops after %d starts", owner, len(starts))
		mu.Unlock()
		w.do("stop")
		w.do("start")
	}
	for n := 0; n%20 != 0 || !w.finished(); n++ {
		if n > 50_000 {
			t.Fatal("the units did not finish")
		}
		step()
	}

	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(starts, func(a, b start) int { return a.at.Compare(b.at) })
	var charged int64
	for i := range starts {
		var sum int64
		for j := i; j < len(starts) && starts[j].at.Sub(starts[i].at) < window; j++ {
			sum += starts[j].cost
		}
		if sum > limit {
			t.Fatalf("%d widgets started in [%v, +%v), at most %d", sum, starts[i].at.Sub(t0), window, limit)
		}
		charged += starts[i].cost
	}
	t.Logf("%d starts, %d widgets, virtual time %v", len(starts), charged, w.clk.Now().Sub(t0))
	t.Logf("%d runs interrupted by a stop ran again", len(starts)-units)
}
