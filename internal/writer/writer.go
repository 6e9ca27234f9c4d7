// Package writer is runcue's group commit: one goroutine owns the store's
// write side and runs every request waiting at the time in one transaction.
package writer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/inbox"
	"github.com/runcue/runcue/store"
)

// ErrClosed is returned for requests made after Close.
var ErrClosed = errors.New("runcue: closed")

// Request is a group of ops that commit together, in order, in one
// transaction shared with other requests.
type Request struct {
	Ops []store.Op
	// Done is called on the writer goroutine once the transaction has
	// committed (err nil, one result per op) or failed. It must not block.
	Done func(results []store.Result, err error)
	// Sink, when Done is nil, is told instead, under the same rules: a
	// pointer the caller already holds converts to it without an
	// allocation, where a closure would allocate per request.
	Sink Sink
}

// Sink receives a Request's outcome (see Request.Sink).
type Sink interface {
	Committed(results []store.Result, err error)
}

// done reports the request's outcome to Done, or else to Sink.
func (r *Request) done(results []store.Result, err error) {
	if r.Done != nil {
		r.Done(results, err)
		return
	}
	r.Sink.Committed(results, err)
}

// Hooks are called on the writer goroutine. They must not block.
type Hooks struct {
	// Publish receives committed events in sequence order, before any Done
	// of their transaction runs. external marks events committed by other
	// connections or processes. Without it the writer publishes nothing and
	// never reads what others commit (an executor, which writes no events:
	// following every commit of the scheduler would cost it a read of the
	// log each).
	Publish func(events []store.Event, external bool)
	// Failed is called once when the store fails; from then on every
	// request fails with the same error.
	Failed func(err error)
}

// Config configures a Writer.
type Config struct {
	Store store.Store
	Clock clock.Clock
	// Poll is how often the writer checks for commits by other processes.
	Poll time.Duration
	// MaxOps caps the ops in one transaction (requests are never split).
	MaxOps int
	// LastSeq is the sequence number already published.
	LastSeq int64
	Hooks   Hooks
}

// Writer runs requests in group-committed transactions.
type Writer struct {
	cfg   Config
	in    *inbox.Inbox[*Request]
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	fail  error // sticky store failure
	close bool
	// follow: Hooks.Publish was set; read and publish others' commits.
	// Fixed at New.
	follow bool

	lastSeq int64
	// Stats (see Stats), written by the writer goroutine.
	statMu  sync.Mutex
	batches int64
	ops     int64
	busy    time.Duration
}

// New starts a Writer. Close stops it.
func New(cfg Config) *Writer {
	if cfg.MaxOps <= 0 {
		cfg.MaxOps = 4096
	}
	follow := cfg.Hooks.Publish != nil
	if !follow {
		cfg.Hooks.Publish = func([]store.Event, bool) {}
		cfg.Poll = 0
	}
	w := &Writer{cfg: cfg, in: inbox.New[*Request](), stop: make(chan struct{}), done: make(chan struct{}), lastSeq: cfg.LastSeq, follow: follow}
	go w.run()
	return w
}

// Submit queues r. It fails at once with ErrClosed after Close, or with the
// sticky error after a store failure.
func (w *Writer) Submit(r *Request) error {
	w.mu.Lock()
	err := w.fail
	if w.close {
		err = ErrClosed
	}
	w.mu.Unlock()
	if err != nil {
		return err
	}
	w.in.Push(r)
	return nil
}

// Do submits ops and waits for their commit or ctx. If ctx ends first the
// ops may still commit.
func (w *Writer) Do(ctx context.Context, ops ...store.Op) ([]store.Result, error) {
	type out struct {
		res []store.Result
		err error
	}
	ch := make(chan out, 1)
	if err := w.Submit(&Request{Ops: ops, Done: func(res []store.Result, err error) { ch <- out{res, err} }}); err != nil {
		return nil, err
	}
	select {
	case o := <-ch:
		return o.res, o.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Err returns the sticky store failure, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fail
}

// Close commits what is queued, stops the writer and waits for it.
// Requests made afterwards fail with ErrClosed.
func (w *Writer) Close() {
	w.once.Do(func() {
		w.mu.Lock()
		w.close = true
		w.mu.Unlock()
		close(w.stop)
	})
	<-w.done
}

// Stats returns the number of transactions and ops committed (requests
// without ops take none), and the time (by the writer's clock) spent in
// the store's transactions, failed ones included. The writer runs one
// transaction at a time, so busy's growth over an interval, divided by the
// interval, is the share of it the writer was busy: near 1, the store's
// write path bounds throughput.
func (w *Writer) Stats() (batches, ops int64, busy time.Duration) {
	w.statMu.Lock()
	defer w.statMu.Unlock()
	return w.batches, w.ops, w.busy
}

func (w *Writer) run() {
	defer close(w.done)
	var poll clock.Timer
	var pollC <-chan time.Time
	if w.cfg.Poll > 0 {
		poll = w.cfg.Clock.NewTimer(w.cfg.Poll)
		pollC = poll.C()
		defer poll.Stop()
	}
	// A store that pushes change notifications (store.Watcher) is read at
	// each, besides the polls.
	var watchC <-chan struct{}
	if wt, ok := w.cfg.Store.(store.Watcher); ok && w.follow {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if ch, err := wt.Watch(ctx); err == nil {
			watchC = ch
		}
	}
	var pending []*Request
	for {
		stopping := false
		select {
		case <-w.in.Wake():
		case <-pollC:
			w.pollExternal()
			poll.Reset(w.cfg.Poll)
		case <-watchC:
			if w.Err() == nil {
				w.catchUp(0)
			}
		case <-w.stop:
			stopping = true
		}
		pending = append(pending, w.in.Take()...)
		for len(pending) > 0 {
			n, ops := 0, 0
			for n < len(pending) && (n == 0 || ops+len(pending[n].Ops) <= w.cfg.MaxOps) {
				ops += len(pending[n].Ops)
				n++
			}
			w.commit(pending[:n])
			clear(pending[:n])
			pending = pending[n:]
			if len(pending) == 0 {
				pending = append(pending[:0], w.in.Take()...)
			}
		}
		pending = pending[:0]
		if stopping {
			// Anything pushed after the final Take raced with Close: fail it.
			for _, r := range w.in.Take() {
				r.done(nil, ErrClosed)
			}
			return
		}
	}
}

func (w *Writer) commit(reqs []*Request) {
	if err := w.Err(); err != nil {
		for _, r := range reqs {
			r.done(nil, err)
		}
		return
	}
	var ops []store.Op
	if len(reqs) == 1 {
		ops = reqs[0].Ops
	} else {
		for _, r := range reqs {
			ops = append(ops, r.Ops...)
		}
	}
	var batch store.Batch
	var err error
	if len(ops) > 0 {
		began := w.cfg.Clock.Monotonic()
		batch, err = w.cfg.Store.Apply(context.Background(), ops)
		took := w.cfg.Clock.Monotonic() - began
		w.statMu.Lock()
		w.busy += max(took, 0)
		w.statMu.Unlock()
	}
	results := batch.Results
	if err != nil {
		w.failWith(err)
		for _, r := range reqs {
			r.done(nil, err)
		}
		return
	}
	if len(ops) > 0 {
		w.statMu.Lock()
		w.batches++
		w.ops += int64(len(ops))
		w.statMu.Unlock()
	}

	var evs []store.Event
	for i := range results {
		evs = append(evs, results[i].Events...)
	}
	if len(evs) > 0 {
		if batch.Follows > w.lastSeq && w.follow {
			// Other processes committed before this batch: publish
			// theirs first, so that the hub sees the log in order.
			w.catchUp(batch.Follows)
		}
		w.lastSeq = evs[len(evs)-1].Seq
		w.cfg.Hooks.Publish(evs, false)
	}
	i := 0
	for _, r := range reqs {
		r.done(results[i:i+len(r.Ops):i+len(r.Ops)], nil)
		i += len(r.Ops)
	}
}

func (w *Writer) failWith(err error) {
	w.mu.Lock()
	first := w.fail == nil
	if first {
		w.fail = err
	}
	w.mu.Unlock()
	if first && w.cfg.Hooks.Failed != nil {
		w.cfg.Hooks.Failed(err)
	}
}

// catchUp publishes events committed elsewhere, up to and including upTo
// (0 means all).
func (w *Writer) catchUp(upTo int64) {
	for upTo == 0 || w.lastSeq < upTo {
		evs, err := w.cfg.Store.EventsAfter(context.Background(), w.lastSeq, 1000)
		if err != nil || len(evs) == 0 {
			return
		}
		if upTo > 0 {
			k := len(evs)
			for k > 0 && evs[k-1].Seq > upTo {
				k--
			}
			evs = evs[:k]
			if len(evs) == 0 {
				return
			}
		}
		w.lastSeq = evs[len(evs)-1].Seq
		w.cfg.Hooks.Publish(evs, true)
	}
}

func (w *Writer) pollExternal() {
	if w.Err() != nil {
		return
	}
	changed, err := w.cfg.Store.Changed(context.Background())
	if err != nil || !changed {
		return
	}
	w.catchUp(0)
}

// Sync waits until every request submitted before the call has been
// committed and its Done called.
func (w *Writer) Sync(ctx context.Context) error {
	_, err := w.Do(ctx)
	if errors.Is(err, ErrClosed) {
		return nil
	}
	return err
}

// Poll makes the writer check for external commits now and waits for it.
func (w *Writer) Poll(ctx context.Context) error {
	ch := make(chan struct{})
	err := w.Submit(&Request{Done: func([]store.Result, error) {
		w.pollExternal()
		close(ch)
	}})
	if err != nil {
		return err
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
