// Package writer is runcue's group commit: one goroutine owns the store's
// write side and runs every request waiting at the time in one transaction.
package writer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

	// state is where the request is: queued (waiting, or between two
	// attempts of a transaction that failed and stored nothing), in flight
	// (in a transaction being tried, or whose commit's outcome is being
	// resolved), withdrawn (given up by Do: never told) or done.
	state atomic.Int32
}

const (
	rQueued int32 = iota
	rInFlight
	rWithdrawn
	rDone
)

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
	// Failed is called once when the store fails with a fatal error (see
	// store.FaultOf); from then on every request fails with the same
	// error.
	Failed func(err error)
	// Outage is called once when a transaction fails with a transient
	// error after the last one that succeeded: the store is unavailable
	// since then, and the writer retries. Recovered is called with the
	// outage's start when a transaction succeeds again.
	Outage    func(since time.Time, err error)
	Recovered func(since time.Time)
}

// Settings configures a Writer.
type Settings struct {
	Store store.Store
	Clock clock.Clock
	// Poll is how often the writer checks for commits by other processes.
	Poll time.Duration
	// MaxOps caps the ops in one transaction (requests are never split).
	MaxOps int
	// LastSeq is the sequence number already published.
	LastSeq int64
	Hooks   Hooks
	// TxTimeout bounds each transaction and each read of others'
	// commits (0: none); transactions that time out in a row get twice
	// the time each, up to 8 times TxTimeout.
	TxTimeout time.Duration
	// MinBackoff and MaxBackoff bound the pause between two attempts of a
	// transaction that failed with a transient error: it doubles from
	// MinBackoff up to MaxBackoff, each pause drawn in its upper half
	// (jitter). Defaults 50 ms and 2 s.
	MinBackoff, MaxBackoff time.Duration
	// MaxFlaky is how many store.Flaky failures in a row are retried
	// before the store is taken as failed. Default 5.
	MaxFlaky int
	// StopGrace is how long Close goes on retrying the transactions
	// still pending when it is called, during an outage, before failing
	// them with ErrUnavailable. Default 10 s.
	StopGrace time.Duration
}

// Writer runs requests in group-committed transactions.
type Writer struct {
	cfg   Settings
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
	// polls counts pollExternal's calls (writer goroutine).
	polls int
	// timeouts counts the transactions that timed out in a row (writer
	// goroutine): the next gets more time (see store.TxTimeouter).
	timeouts int
	// kick wakes a retry's pause early (Fence, Close).
	kick chan struct{}
	// fenced is the highest owner epoch whose ops fail without being tried
	// (Fence).
	fenced atomic.Int64
	// outage: when the current outage began (zero: none) and its last
	// error; under mu.
	outSince time.Time
	outErr   error
	// Stats (see Stats), written by the writer goroutine.
	statMu  sync.Mutex
	batches int64
	ops     int64
	busy    time.Duration
}

// New starts a Writer. Close stops it.
func New(cfg Settings) *Writer {
	if cfg.MaxOps <= 0 {
		cfg.MaxOps = 4096
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 50 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 2 * time.Second
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	if cfg.MaxFlaky <= 0 {
		cfg.MaxFlaky = 5
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 10 * time.Second
	}
	follow := cfg.Hooks.Publish != nil
	if !follow {
		cfg.Hooks.Publish = func([]store.Event, bool) {}
		cfg.Poll = 0
	}
	w := &Writer{cfg: cfg, in: inbox.New[*Request](), stop: make(chan struct{}), done: make(chan struct{}), lastSeq: cfg.LastSeq, follow: follow, kick: make(chan struct{}, 1)}
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
	r.state.Store(rQueued) // a request may be submitted again once done
	w.in.Push(r)
	return nil
}

// Do submits ops and waits for their commit or ctx. If ctx ends first,
// the ops are withdrawn if no transaction holds them (then nothing of them
// is stored, and the error matches ErrUnavailable during an outage, else
// it is ctx's); a transaction that holds them may still commit, and the
// error matches ErrOutcomeUnknown. Either error wraps ctx's.
func (w *Writer) Do(ctx context.Context, ops ...store.Op) ([]store.Result, error) {
	type out struct {
		res []store.Result
		err error
	}
	ch := make(chan out, 1)
	r := &Request{Ops: ops, Done: func(res []store.Result, err error) { ch <- out{res, err} }}
	if err := w.Submit(r); err != nil {
		return nil, err
	}
	select {
	case o := <-ch:
		return o.res, o.err
	case <-ctx.Done():
		return nil, w.Withdraw(r, ctx.Err())
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
		w.wake()
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
		ctx, cancel := w.txContext(0)
		evs, err := w.cfg.Store.EventsAfter(ctx, w.lastSeq, 1000)
		cancel()
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
	ctx, cancel := w.txContext(0)
	defer cancel()
	if w.polls++; w.polls%rewindCheckEvery == 0 && w.lastSeq > 0 {
		// A process that writes no events (a standby, a submitter) would
		// not see the log go back: look at its end now and then.
		if last, err := w.cfg.Store.LastSeq(ctx); err == nil && last < w.lastSeq {
			w.failWith(fmt.Errorf("%w: this process saw event %d, the database's log ends at %d", store.ErrRewound, w.lastSeq, last))
			return
		}
	}
	changed, err := w.cfg.Store.Changed(ctx)
	if err != nil || !changed {
		return
	}
	w.catchUp(0)
}

// rewindCheckEvery is how many polls pass between two checks that the
// log did not go back (see pollExternal).
const rewindCheckEvery = 16

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
