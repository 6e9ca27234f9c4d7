package engine

import (
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Amount meters (token meters) beyond what every meter does: room held
// for a large unit that smaller ones would keep waiting, and what a run
// used, which its Runner reports (Ending.Used) and which replaces the
// charges its start made, in memory and in the service log, per each
// meter's charge policy.

// hold keeps room in r's amount windows for l's next unit (of costs),
// refused at now by one of them, so that smaller units of other lanes do
// not take it first: for at most the window's hold plus MaxStartDelay,
// by when everything that counted at now has left it (broker.Held).
func (t *resourceTable) hold(l *lane, r *resource, now time.Time, costs broker.Costs) {
	rf, refused := r.RefusalFor(now, costs, l)
	if !refused || rf.Kind != broker.RefuseMeter || rf.Held {
		return
	}
	a := r.Amount(rf.Meter)
	if a == nil {
		return
	}
	until := now.Add(a.Hold() + t.cfg.MaxStartDelay)
	r.Hold(l, costs, rf.Meter, now, until)
	if r.Held.For == l {
		t.resourceTimer(r, until) // the others may go when it lapses
	}
}

// noteUsed applies the amounts r's Runner reports it used: at once if its
// start is counted (the ops go with its Finish, or alone if that is
// written already), else when it is.
func (d *Engine) noteUsed(r *run, used map[string]int64) {
	switch {
	case len(used) == 0:
	case r.counted:
		r.used = used
	case r.over():
		if ops := d.reconcile(r, used); len(ops) > 0 {
			d.submit(ops...)
		}
	default:
		r.reconciles = d.reconcile(r, used)
	}
}

// reconcile replaces the charges of r's counted start, in every meter of
// its resources that reconciles (broker.Reconciler), by what its charge
// policy makes of the amount used; it returns the ops that replace them in
// the service log. A meter whose charge does not change, or whose entry has
// left its window, needs no op.
func (d *Engine) reconcile(r *run, used map[string]int64) []store.Op {
	if r.countedAt.IsZero() {
		return nil
	}
	costs := r.u.costs()
	var ops []store.Op
	for _, res := range r.lane.resources {
		for _, m := range res.Meters() {
			rc, ok := m.(broker.Reconciler)
			if !ok {
				continue
			}
			amount := rc.Counts()
			actual, ok := used[amount]
			if !ok {
				continue
			}
			est := costs.Of(amount)
			to := rc.ChargePolicy().Charged(est, actual)
			if to == est {
				continue
			}
			rc.Reconcile(r.countedAt, est, to)
			ops = append(ops, &store.Reconcile{Epoch: d.epoch, Service: res.name, Meter: amount, WorkID: r.u.id, At: r.start, Amount: to})
			d.markStatus(res)
			d.wake(res)
		}
	}
	return ops
}
