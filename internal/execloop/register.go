package execloop

import (
	"context"
	"errors"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// An executor's registration and heartbeat (see Executor.Run): one live
// process per executor ID, and a store outage ridden through.

// register registers the executor (again); registered is false while
// another live process holds its ID. What is assigned to the name before
// it registers was assigned to an earlier process of the name (see found).
func (x *Loop) register(ctx context.Context) (registered bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, x.cfg.TTL/2)
	defer cancel()
	prior, err := x.es.Assigned(rctx, x.cfg.ID)
	if err != nil {
		return false, err
	}
	sent := x.cfg.Clock.Now()
	res, err := x.w.Do(rctx, &store.RegisterExecutor{Executor: x.rec})
	if err != nil {
		return false, err
	}
	if errors.Is(res[0].Err, store.ErrExecutorTaken) {
		x.logOnce(&x.saidTaken, "runcue: another live process holds this executor's ID: this one waits, running nothing, until its heartbeat stops",
			"executor", x.cfg.ID)
		return false, nil
	}
	if res[0].Err != nil {
		return false, res[0].Err
	}
	x.mu.Lock()
	x.found = make(map[string]int, len(prior))
	for _, a := range prior {
		x.found[a.ID] = a.Run
	}
	x.mu.Unlock()
	x.saidTaken = false
	x.trust(sent)
	return true, nil
}

// beat stores a heartbeat; registered is false once the store judged this
// process gone and another took its ID over.
func (x *Loop) beat(ctx context.Context) (registered bool, err error) {
	sent := x.cfg.Clock.Now()
	bctx, cancel := context.WithTimeout(ctx, x.cfg.Heartbeat)
	defer cancel()
	res, err := x.w.Do(bctx, &store.ExecutorBeat{ID: x.cfg.ID, TTL: x.cfg.TTL, Host: x.rec.Host, PID: x.rec.PID})
	if err != nil {
		return true, err // not stored now: the lease's trust runs out by itself
	}
	if res[0].Applied {
		x.trust(sent)
		return true, nil
	}
	// Removed (judged gone), or its ID taken over: register again; the
	// runs it held were requeued, and their reports will be refused.
	x.mu.Lock()
	for _, r := range x.runs {
		r.cancel(rt.ErrLeaseLost)
	}
	x.mu.Unlock()
	return x.register(ctx)
}

// unavailable notes a transient failure of the store, logged once per
// outage.
func (x *Loop) unavailable(err error) {
	if x.outage.IsZero() {
		x.outage = time.Now()
		x.log.Warn("runcue: executor: the store is unavailable: retrying; no run starts until a heartbeat is stored", "executor", x.cfg.ID, "error", err)
	}
}

// available notes that the store answered.
func (x *Loop) available() {
	if !x.outage.IsZero() {
		x.log.Info("runcue: executor: the store answers again", "executor", x.cfg.ID, "unavailable_for", time.Since(x.outage).Round(time.Millisecond))
		x.outage = time.Time{}
	}
}

// logOnce logs msg at Warn unless *said, and sets it.
func (x *Loop) logOnce(said *bool, msg string, args ...any) {
	if !*said {
		x.log.Warn(msg, args...)
		*said = true
	}
}
