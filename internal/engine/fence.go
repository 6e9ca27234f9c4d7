package engine

import (
	"errors"

	"github.com/runcue/runcue/store"
)

// Fencing: every op an owner makes carries its epoch (env.epoch), and the
// store fails it with store.ErrNotOwner, in its own transaction, once
// another Cue took ownership (the stored epoch moved on). The first such
// failure tells the engine it is deposed: it stops dispatching, lets no
// more handler start, cancels the running ones (cause ErrNotOwner) and
// exits once they are over. None of its writes is stored any more; the new
// owner recovers its runs when their leases end.

// noteNotOwner reports err, an op's failure, if it says this owner was
// deposed. Any goroutine (the writer's callbacks) calls it.
func (d *Engine) noteNotOwner(err error) {
	if errors.Is(err, store.ErrNotOwner) && d.deposed.CompareAndSwap(false, true) {
		d.in.Push(msgFenced{})
	}
}

// noteResults reports the results of a batch of this owner's ops.
func (d *Engine) noteResults(res []store.Result) {
	for i := range res {
		if res[i].Err != nil {
			d.noteNotOwner(res[i].Err)
		}
	}
}

// watchLease has the engine stop as deposed once its lease is lost
// (store.Leased): it may not have been renewed, and a standby may take
// over when it expires. Its goroutine ends with the engine.
func (d *Engine) watchLease() {
	l, ok := d.own.(store.Leased)
	if !ok {
		return
	}
	d.aux.Go(func() {
		select {
		case <-l.Lost():
			if d.deposed.CompareAndSwap(false, true) {
				d.in.Push(msgFenced{lease: true})
			}
		case <-d.auxStop:
		}
	})
}

// lostOwnership stops the engine of a deposed owner (lease: it stopped
// trusting its lease, rather than a write found another owner's epoch).
// The writer fails this epoch's ops still waiting (writer.Fence): a
// decision of a deposed owner is never stored after the loss.
func (d *Engine) lostOwnership(lease bool) {
	if d.failed == nil {
		d.failed = store.ErrNotOwner
	}
	d.w.Fence(d.epoch)
	d.closeStarts() // a handler not yet started never will
	msg := "runcue: another Cue took ownership of the database: this Cue stops dispatching and cancels its handlers"
	if lease {
		msg = "runcue: this Cue's ownership lease was not renewed in time (or another Cue took it over): it stops dispatching and cancels its handlers"
	}
	d.log.Error(msg, "owner", d.owner, "epoch", d.epoch, "running", len(d.runs))
	d.hub.Publish([]store.Event{{Type: store.TypeStoreFailed, Time: d.wall(),
		Data: store.EventData{Error: store.ErrNotOwner.Error(), ErrorKind: "not_owner"}.Encode()}})
	d.stopping = true
	for _, r := range d.runs {
		d.stopRun(r, store.ErrNotOwner)
	}
}

// storeFailed stops the engine of an owner whose store failed for good (a
// fatal error): nothing it decides can be stored, so it starts nothing
// more, cancels its handlers, and exits, releasing its lease (an owner
// that cannot dispatch never holds it: a standby elsewhere takes over).
func (d *Engine) storeFailed(err error) {
	if d.failed == nil {
		d.failed = err
	}
	if d.stopping {
		return
	}
	d.closeStarts()
	d.log.Error("runcue: the store failed: this Cue stops dispatching, cancels its handlers and gives ownership up", "owner", d.owner, "error", err, "running", len(d.runs))
	d.stopping = true
	for _, r := range d.runs {
		d.stopRun(r, err)
	}
}

// noteUnwritten records run r, whose handler this process saw return (or
// never start), when its Finish was not stored: if this owner lost
// ownership, the unit stays running in the store under this epoch, and the
// process's next engine requeues it at once (EndedRuns).
func (d *Engine) noteUnwritten(r *run) {
	if d.failed == nil || !d.localRun(r) {
		return // an executor's run: its executor, not this process, knows
	}
	fin := &r.mem.fin
	d.unwritten = append(d.unwritten, store.RunRef{ID: fin.ID, Run: fin.Run, Epoch: fin.Epoch})
}

// localRun reports whether r's handler runs in this process.
func (d *Engine) localRun(r *run) bool {
	_, local := r.lane.task.spec.Runner.(InProcess)
	return local || r.lane.keyErr != nil
}

// unwrittenAtExit adds to the runs noteUnwritten records those whose
// Finish is still pending as an engine that lost ownership (or whose store
// failed) exits: their handlers are over, and the Finish is fenced (or
// commits, and then the unit is no longer running on that run, which
// recovery checks).
func (d *Engine) unwrittenAtExit() {
	if d.failed == nil {
		return
	}
	for r := range d.finPending {
		d.noteUnwritten(r)
	}
	clear(d.finPending)
}
