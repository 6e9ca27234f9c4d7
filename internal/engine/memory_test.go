package engine

import (
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

// endingRunner ends each run at once as its task says: "fails" fails,
// "cancelled" waits to be cancelled, any other succeeds.
type endingRunner struct {
	w         *world
	cancelled chan struct{}
	mu        sync.Mutex
	waiting   map[string]chan error
}

func (r *endingRunner) InProcess() {}

func (r *endingRunner) Launch(p *Run) {
	var stop chan error
	if p.Task == "cancelled" {
		stop = make(chan error, 1)
		r.mu.Lock()
		r.waiting[p.ID] = stop
		r.mu.Unlock()
	}
	go func() {
		if _, err := p.Begin(); err != nil {
			p.Done(Ending{Err: err, NotStarted: true, At: r.w.clk.Now()})
			return
		}
		switch p.Task {
		case "fails":
			p.Done(Ending{Err: errors.New("no"), At: r.w.clk.Now()})
		case "cancelled":
			r.cancelled <- struct{}{}
			p.Done(Ending{Err: <-stop, At: r.w.clk.Now()})
		default:
			p.Done(Ending{Result: []byte(`null`), At: r.w.clk.Now()})
		}
	}()
}

func (r *endingRunner) Cancel(p *Run, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if stop := r.waiting[p.ID]; stop != nil {
		stop <- cause
		delete(r.waiting, p.ID)
	}
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
	w.hooks = func(h *Hooks) {
		h.Started = func(p *Run) { mu.Lock(); tracked = append(tracked, reachable(p)); mu.Unlock() }
	}
	er := &endingRunner{w: w, cancelled: make(chan struct{}, 1), waiting: map[string]chan error{}}
	for _, task := range []string{"ok", "fails", "cancelled"} {
		w.do("task " + task + " timeout=30m")
		w.reg.Tasks[task].Runner = er
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
	<-er.cancelled
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
