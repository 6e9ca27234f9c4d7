package engine

import (
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// Commits: how the dispatcher hands ops to the writer without waiting,
// and learns of their commit (msgSettled, msgApplied) on its inbox.

// submit queues ops for the writer without waiting. An op that ends a unit
// (a terminal Finish, a FailQueued) reports its commit back (mSettled), so
// that the unit's dependents are released only once its end is durable;
// events the store derived for other units (dependents failed or cancelled
// with it) come back too, and the dispatcher drops those units from memory.
func (d *Engine) submit(ops ...store.Op) {
	d.enqueue(&writer.Request{Ops: ops, Done: func(res []store.Result, err error) { d.committed(ops, res, err) }})
}

// enqueue queues req for the writer (see submit).
func (d *Engine) enqueue(req *writer.Request) {
	for _, op := range req.Ops {
		if id, _, _, ends := opEnds(op); ends {
			d.finishing[id] = struct{}{}
		}
	}
	if err := d.w.Submit(req); err != nil && d.failed == nil {
		d.failed = err
	}
}

// committed reports the commit of ops (or its failure) back to the
// dispatcher: see submit. It runs on the writer goroutine.
func (d *Engine) committed(ops []store.Op, res []store.Result, err error) {
	if err == nil {
		d.noteResults(res)
	}
	for i, op := range ops {
		id, state, own, ends := opEnds(op)
		if id == "" {
			continue
		}
		var derived []store.Event
		applied := err == nil && res[i].Applied
		if applied && len(res[i].Events) > own {
			derived = res[i].Events[own:]
		}
		if ends {
			d.in.Push(msgSettled{id: id, state: state, applied: applied, derived: derived})
			continue
		}
		if len(derived) > 0 {
			d.in.Push(msgApplied{events: derived})
		}
	}
}

// opEnds describes an op that finishes or fails a unit: its ID, the state
// it leaves the unit in, how many of its result's events are its own (the
// rest the store derived for dependents), and whether the unit ends. id is
// "" for other ops.
func opEnds(op store.Op) (id string, state store.State, own int, ends bool) {
	switch op := op.(type) {
	case *store.Finish:
		return op.ID, op.State, len(op.Events), op.State.Terminal()
	case *store.FailQueued:
		return op.ID, store.Failed, len(op.Events), true
	}
	return "", "", 0, false
}
