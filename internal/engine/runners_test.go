package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/runcue/runcue/store"
)

// funcRunner runs each run through f on a goroutine of its own, as
// runcue's local Runner does: it reads the run's params, passes the start
// gate, and reports what f returns (at the world's now when f leaves At
// zero). f gets the start instant the gate gave; its ctx ends, with the
// cause, when the engine cancels the run.
type funcRunner struct {
	w *world
	f func(ctx context.Context, p *Run, start time.Time, params []byte) Ending
	// launched, when set, is called with every run launched.
	launched func(*Run)

	mu      sync.Mutex
	cancels map[*Run]context.CancelCauseFunc
}

func (r *funcRunner) InProcess() {}

func (r *funcRunner) Launch(p *Run) {
	if r.launched != nil {
		r.launched(p)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	r.mu.Lock()
	if r.cancels == nil {
		r.cancels = map[*Run]context.CancelCauseFunc{}
	}
	r.cancels[p] = cancel
	r.mu.Unlock()
	go func() {
		defer func() {
			r.mu.Lock()
			delete(r.cancels, p)
			r.mu.Unlock()
			cancel(nil)
		}()
		var start time.Time
		b, err := p.Params()
		if err == nil {
			start, err = p.Begin()
		}
		if err != nil {
			p.Done(Ending{Err: err, NotStarted: true, At: r.w.clk.Now()})
			return
		}
		e := r.f(ctx, p, start, b)
		if e.At.IsZero() {
			e.At = r.w.clk.Now()
		}
		p.Done(e)
	}()
}

func (r *funcRunner) Cancel(p *Run, cause error) {
	r.mu.Lock()
	cancel := r.cancels[p]
	r.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
}

// stopped is the Ending of a handler that returned because ctx ended.
func stopped(ctx context.Context) Ending {
	cause := context.Cause(ctx)
	return Ending{Err: cause, Class: scriptClass(cause)}
}

// insert stores units (queued, created now) in one batch and tells the
// running engine, as a Cue's Submit does.
func (w *world) insert(units ...*store.Unit) {
	for _, u := range units {
		u.State, u.CreatedAt = store.Queued, w.clk.Now()
	}
	res := w.write(&store.Insert{Units: units, At: w.clk.Now()})
	if res.Err != nil {
		w.t.Fatal(res.Err)
	}
	if w.e != nil {
		w.e.Inserted(units, nil)
	}
}

// numbered returns n units of task t, IDs prefix0 to prefix<n-1>.
func numbered(t, prefix string, n int) []*store.Unit {
	units := make([]*store.Unit, n)
	for i := range units {
		units[i] = &store.Unit{ID: fmt.Sprint(prefix, i), Task: t}
	}
	return units
}

// useRunner registers a task (a script's task line, "task NAME ...") and
// makes r its Runner. Call before start.
func (w *world) useRunner(line string, r Runner) {
	w.do(line)
	w.reg.Tasks[strings.Fields(line)[1]].Runner = r
}
