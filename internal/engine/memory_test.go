package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
	"weak"

	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
)

// reachable returns a function that reports whether p's run and its unit
// are still reachable (held by weak pointers, after a collection).
func reachable(p *Run) func() (run, unit bool) {
	rw, uw := weak.Make(p.r), weak.Make(p.r.u)
	return func() (bool, bool) { return rw.Value() != nil, uw.Value() != nil }
}

// TestFinishedRunsUnreachable: once a unit has finished, nothing the
// engine keeps reaches its run (unit record, contexts, span) or its unit
// record, whatever the way it ended and although its deadline, its
// dependency deadline and its cancellation grace are still far off. A
// timer entry once kept each run alive until its deadline. (Moved from
// the root, where it tracked runs through a back door.)
func TestFinishedRunsUnreachable(t *testing.T) {
	w := newWorld(t)
	defer w.close()
	var mu sync.Mutex
	var tracked []func() (bool, bool)
	// Each run ends at once as its task says: "fails" fails, "cancelled"
	// waits to be cancelled, any other succeeds.
	cancelled := make(chan struct{}, 1)
	er := &funcRunner{w: w, f: func(ctx context.Context, p *Run, _ time.Time, _ []byte) Ending {
		switch p.Task {
		case "fails":
			return Ending{Err: errors.New("no")}
		case "cancelled":
			cancelled <- struct{}{}
			<-ctx.Done()
			return stopped(ctx)
		}
		return Ending{Result: []byte(`null`)}
	}, launched: func(p *Run) { mu.Lock(); tracked = append(tracked, reachable(p)); mu.Unlock() }}
	for _, task := range []string{"ok", "fails", "cancelled"} {
		w.useRunner("task "+task+" timeout=30m", er)
	}
	w.do("start priority") // a priority function holds scores too
	const n = 300
	units := make([]*store.Unit, n)
	for i := range units {
		task := "ok"
		if i%3 == 1 {
			task = "fails"
		}
		units[i] = &store.Unit{ID: fmt.Sprintf("u%03d", i), Task: task, State: store.Queued, CreatedAt: w.clk.Now(),
			DependencyDeadline: w.clk.Now().Add(24 * time.Hour)}
	}
	w.write(&store.Insert{Units: units, At: w.clk.Now()})
	w.e.Inserted(units, nil)
	w.do("submit c1 cancelled")
	<-cancelled
	if _, _, err := w.e.Cancel(w.ctx, "c1", rt.CancelOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.e.Drain(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.settle()
	runtime.GC()
	runtime.GC()
	mu.Lock()
	defer mu.Unlock()
	runs, us := 0, 0
	for _, f := range tracked {
		r, u := f()
		if r {
			runs++
		}
		if u {
			us++
		}
	}
	t.Logf("%d runs started; %d runs and %d units still reachable", len(tracked), runs, us)
	if len(tracked) != n+1 || runs != 0 || us != 0 {
		t.Fatalf("%d runs started (want %d); %d runs and %d units still reachable (want none)", len(tracked), n+1, runs, us)
	}
}
