package engine

import (
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// The writes of a run, and the writers' reports of their commits: a claim
// (ahead of its handler's start or behind it), a start logged ahead of its
// claim, a Finish.

// claimSink and finishSink report the commit of a run's claim and Finish
// (the run record is the request's Sink, so a write costs no allocation).
// They run on the writer goroutine.
type (
	claimSink  run
	finishSink run
)

// Committed implements writer.Sink.
func (s *claimSink) Committed(res []store.Result, err error) {
	r := (*run)(s)
	if err == nil {
		r.d.noteResults(res)
	}
	r.d.in.Push(msgRunWritten{run: r, claim: true, applied: err == nil && res[0].Applied})
}

// Committed implements writer.Sink.
func (s *finishSink) Committed(res []store.Result, err error) {
	r := (*run)(s)
	if err == nil {
		r.d.noteResults(res)
	}
	m := msgRunWritten{run: r, applied: err == nil && res[0].Applied}
	if m.applied && len(res[0].Events) > len(r.mem.fin.Events) {
		m.derived = res[0].Events[len(r.mem.fin.Events):] // the dependents the store ended with it
	}
	r.d.in.Push(m)
}

// startLogAhead writes r's start log ahead of its handler's start, on the
// starts' writer (store.LogStart), and its claim (without the log) behind
// it, with the rest: a crash after the log's commit forgets no request the
// service saw, and the claim, written with the run's Finish when the run
// is short, leaves the unit queued if it never commits (it runs again).
// The handler waits for its own log entry only, not for the turn of the
// writer's next transaction.
func (d *Engine) startLogAhead(r *run) {
	r.logAhead = true
	c := &r.mem.claim
	r.mem.logStart = store.LogStart{Epoch: c.Epoch, WorkID: c.ID, Run: c.Run, At: c.At, Log: c.Log}
	c.Log = nil
	r.mem.logOps[0] = &r.mem.logStart
	r.mem.logReq = writer.Request{Ops: r.mem.logOps[:], Sink: (*logSink)(r)}
	if err := d.sw.Submit(&r.mem.logReq); err != nil {
		// The writer is closed or failed: the run cannot be recorded.
		d.failed = err
		r.claimFailed = true
		d.claims--
		d.claimed(r, false)
		return
	}
	if err := d.write(r, c); err != nil {
		// The claim cannot be written: the run is abandoned when its log
		// entry commits (claimed).
		d.failed = err
		r.claimFailed = true
	}
}

// logSink reports the commit of a run's start logged ahead (the run
// record is the request's Sink). It runs on the starts' writer goroutine.
type logSink run

// Committed implements writer.Sink.
func (s *logSink) Committed(res []store.Result, err error) {
	r := (*run)(s)
	if err == nil {
		r.d.noteResults(res) // a deposed owner's start is refused: it learns it is deposed
	}
	r.d.in.Push(msgRunWritten{run: r, logged: true, applied: err == nil && res[0].Applied})
}

// logWritten continues a run whose start logged ahead (m.logged), or
// whose claim written behind it, committed (applied) or not.
func (d *Engine) logWritten(m msgRunWritten) {
	r := m.run
	if m.logged {
		// Its claim may have been refused first.
		d.claims--
		d.claimed(r, m.applied && !r.claimFailed)
		return
	}
	// Only a refusal matters; before the log commits, claimed hears of it.
	if !m.applied {
		r.claimFailed = true
		if r.state != runClaiming && !r.over() {
			d.stopRun(r, ErrCancelled)
		}
	}
}
