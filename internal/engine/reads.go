package engine

import (
	"context"

	"github.com/runcue/runcue/internal/inbox"
	"github.com/runcue/runcue/store"
)

// Store reads off the loop: what the loop needs to read from the store (the
// units another process submitted, the states of dependencies it does not
// hold, a service's changed record) is read by the reader goroutine, in the
// order asked, and the answer comes back as a msgRead the loop applies. The
// loop never waits for the database.

// storeReader is the loop's side of the reader goroutine.
type storeReader struct {
	reads *inbox.Inbox[readJob] // nil until the first read
	// pending counts the reads not yet answered. While one is, ended
	// records the terminal states units reached, so that an answer read
	// before the change is not taken for the present (see resolveDeps and
	// external).
	pending int
	ended   map[string]store.State
}

// readJob reads on the reader goroutine and returns what the loop is to do
// with the answer.
type readJob func(ctx context.Context) func(*Engine)

// read has job run on the reader goroutine, starting it if need be.
func (d *Engine) read(job readJob) {
	if d.reads == nil {
		d.reads = inbox.New[readJob]()
		d.aux.Go(d.reader)
	}
	d.pending++
	d.reads.Push(job)
}

// reader runs read jobs until the dispatcher exits (auxCtx is cancelled
// then, so a read in progress ends early).
func (d *Engine) reader() {
	d.reads.Serve(d.auxStop, func(jobs []readJob) {
		for _, job := range jobs {
			d.in.Push(msgRead{apply: job(d.auxCtx)})
		}
	})
}

// noteEnded records that unit id reached a terminal state, for the reads
// in flight.
func (r *storeReader) noteEnded(id string, st store.State) {
	if r.pending == 0 {
		return
	}
	if r.ended == nil {
		r.ended = make(map[string]store.State)
	}
	r.ended[id] = st
}
