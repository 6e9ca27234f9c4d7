package recur

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/runcue/runcue/clock"
	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
)

// loopWorld runs a Loop on a fake clock, one stored schedule (every
// minute from t0, created at t0), its records kept; refuse makes the
// store refuse the next submission.
type loopWorld struct {
	clk    *clock.Fake
	loop   *Loop
	mu     sync.Mutex
	fired  []Firing
	refuse bool
	hidden bool // Load returns nothing yet
}

func newLoopWorld(t *testing.T, created time.Time, hidden bool) *loopWorld {
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	w := &loopWorld{clk: clock.NewFake(t0), hidden: hidden}
	def, _ := json.Marshal(Def{Template: Template{Task: "t"}, Timing: rt.Timing{Every: time.Minute, Anchor: t0}, Missed: rt.MissedSkip})
	rec := store.ScheduleRecord{Name: "s", Def: def, Created: created, LastAt: created}
	w.loop = NewLoop(Deps{Clock: w.clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Load: func(context.Context) ([]store.ScheduleRecord, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.hidden {
				return nil, nil
			}
			return []store.ScheduleRecord{rec}, nil
		},
		Fire: func(_ context.Context, f Firing) (store.Result, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.fired = append(w.fired, f)
			if f.Submit && w.refuse {
				w.refuse = false
				return store.Result{Err: errors.New("a failed unit holds this idempotency key")}, nil
			}
			return store.Result{Applied: true}, nil
		}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.loop.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// step moves the clock and waits for the loop to record what is due.
func (w *loopWorld) step(t *testing.T, d time.Duration) []Firing {
	t.Helper()
	w.clk.Advance(d)
	if err := w.loop.Sync(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.fired
	w.fired = nil
	return out
}

// TestLoopSkipsARefusedPeriod: a period whose unit the store refuses is
// recorded as skipped, with the reason, and the schedule goes on (it
// does not retry the refused record, holding every schedule back).
func TestLoopSkipsARefusedPeriod(t *testing.T) {
	w := newLoopWorld(t, time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC), false)
	w.step(t, 0)
	w.mu.Lock()
	w.refuse = true
	w.mu.Unlock()
	fs := w.step(t, time.Minute)
	if len(fs) != 2 || !fs[0].Submit || fs[1].Submit || fs[1].Skipped != 1 || fs[1].Reason != "refused: a failed unit holds this idempotency key" ||
		fs[1].Period != fs[0].Period {
		t.Fatalf("%+v", fs)
	}
	if fs := w.step(t, time.Minute); len(fs) != 1 || !fs[0].Submit {
		t.Fatalf("the next period: %+v", fs)
	}
}

// TestLoopNewScheduleNotMissed: a schedule registered while the owner
// ran, which the owner reads only later (its next poll), misses nothing:
// its periods since its registration are submitted, even under
// MissedSkip.
func TestLoopNewScheduleNotMissed(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	w := newLoopWorld(t, t0.Add(30*time.Second), true) // created at 0:30, after the loop began
	w.step(t, 0)
	w.step(t, 150*time.Second) // periods 1:00 and 2:00 fall due, the schedule unread
	w.mu.Lock()
	w.hidden = false
	w.mu.Unlock()
	w.loop.Reload()
	fs := w.step(t, 0)
	if len(fs) != 2 || !fs[0].Submit || !fs[1].Submit || fs[0].Reason != "" {
		t.Fatalf("%+v", fs)
	}
}
