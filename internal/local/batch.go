package local

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/runcue/runcue/internal/call"
	"github.com/runcue/runcue/internal/engine"
)

// executeBatch runs on a batch's goroutine: the leader's run l and the
// runs of its batch (l.p.Batch) in one call of the handler, started at the
// leader's start; each run's end is reported with its own outcome. A
// unit whose params cannot be read leaves the batch, not started.
func (lr *Runner) executeBatch(l *run) {
	p := l.p
	runs := append([]*engine.Run{p}, p.Batch...)
	ends := make([]engine.Ending, len(runs))
	sent := false
	defer func() {
		if !sent { // runtime.Goexit: see execute
			l.cancel(nil)
			for _, q := range runs {
				q.Done(engine.Ending{Err: call.ErrGoexit, Class: engine.ClassPanic, At: lr.Clock.Now()})
			}
		}
	}()
	in := make([]*engine.Run, 0, len(runs))
	idx := make([]int, 0, len(runs))
	params := make([]json.RawMessage, 0, len(runs))
	for i, q := range runs {
		b, err := q.Params()
		if err != nil {
			ends[i] = engine.Ending{Err: err, NotStarted: true}
			continue
		}
		in, idx, params = append(in, q), append(idx, i), append(params, b)
	}
	err := context.Cause(&l.ctx)
	var started time.Time
	if err == nil && len(in) > 0 {
		started, err = p.Begin()
	}
	if err != nil || len(in) == 0 {
		for _, i := range idx {
			ends[i] = engine.Ending{Err: err, NotStarted: true}
		}
	} else {
		if ends[0].NotStarted {
			ends[0] = engine.Ending{Err: ends[0].Err} // the call is counted at its start
		}
		var results []any
		var errs []error
		_, err = call.Invoke(&l.ctx, func(ctx context.Context) (any, error) {
			var err error
			results, errs, err = lr.Batch(ctx, in, params, started, l)
			if err == nil && (len(results) != len(in) || len(errs) != len(in)) {
				err = fmt.Errorf("runcue: the batch handler returned %d outcomes for %d units", min(len(results), len(errs)), len(in))
			}
			return nil, err
		}, lr.MaxPayload)
		for k, i := range idx {
			if err != nil {
				ends[i] = engine.Ending{Err: err}
				continue
			}
			if errs[k] != nil {
				ends[i] = engine.Ending{Err: errs[k]}
				continue
			}
			res := results[k]
			ends[i].Result, ends[i].Err = call.Invoke(&l.ctx, func(context.Context) (any, error) { return res, nil }, lr.MaxPayload)
		}
	}
	now := lr.Clock.Now()
	ends[0].Used = l.takeUsed()
	l.cancel(nil)
	sent = true
	for i := len(runs) - 1; i >= 0; i-- { // the leader last: its end frees the batch's slot
		ends[i].At = now
		Classify(&ends[i])
		runs[i].Done(ends[i])
	}
}
