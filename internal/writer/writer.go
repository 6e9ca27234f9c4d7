// Package writer is runcue's group commit: one goroutine owns the store's
// write side and runs every request waiting at the time in one transaction.
package writer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/inbox"
	"github.com/runcue/runcue/store"
)

// ErrClosed is returned for requests made after Close.
var ErrClosed = errors.New("runcue: closed")

// ErrUnavailable matches the error of a request given up while the store
// was unreachable (an outage: its transactions failed with transient
// errors and are being retried). The request was withdrawn: nothing of it
// is stored.
var ErrUnavailable = errors.New("runcue: the store is unavailable")

// ErrOutcomeUnknown matches the error of a request given up while its
// transaction was in flight (sent, or committed with its answer lost): it
// may or may not be stored.
var ErrOutcomeUnknown = errors.New("runcue: the outcome is unknown: the write may or may not be stored")

// UnavailableError is the error of a request withdrawn during an outage
// (see ErrUnavailable): since when the store has been failing, its last
// error, and why the request was given up (the caller's context).
type UnavailableError struct {
	Since time.Time
	Last  error
	Cause error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("runcue: the store is unavailable since %s (%v): %v", e.Since.Format(time.RFC3339), e.Last, e.Cause)
}

// Unwrap matches ErrUnavailable and the cause.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Cause} }

// outcomeUnknown is the error of a request given up in flight.
type outcomeUnknown struct{ cause error }

func (e *outcomeUnknown) Error() string   { return ErrOutcomeUnknown.Error() + ": " + e.cause.Error() }
func (e *outcomeUnknown) Unwrap() []error { return []error{ErrOutcomeUnknown, e.cause} }

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
	// TxTimeout bounds each transaction and each read of others'
	// commits (0: no bound of the writer's own; the store may have one).
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
func New(cfg Config) *Writer {
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
		return nil, w.Withdraw(r, context.Cause(ctx))
	}
}

// Withdraw gives r up, for a caller whose wait ended with cause, and
// returns the error to report: r is withdrawn, and will never be stored or
// told, if no transaction holds it (an *UnavailableError during an
// outage, else cause); otherwise r goes on (its Done is still called) and
// the error matches ErrOutcomeUnknown.
func (w *Writer) Withdraw(r *Request, cause error) error {
	if r.state.CompareAndSwap(rQueued, rWithdrawn) {
		if since, last, ok := w.Outage(); ok {
			return &UnavailableError{Since: since, Last: last, Cause: cause}
		}
		return cause
	}
	return &outcomeUnknown{cause}
}

// Outage reports whether the store is unavailable: since when its
// transactions have failed with transient errors, and the last error.
func (w *Writer) Outage() (since time.Time, last error, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.outSince, w.outErr, !w.outSince.IsZero()
}

// Fence fails, without trying them, the requests not yet committed that
// hold an op of an owner epoch up to epoch (store.OwnerOp): the owner of
// that epoch lost its lease, and its decisions may not be stored after
// it. A transaction in flight is not stopped (the store fences it by its
// epoch).
func (w *Writer) Fence(epoch int64) {
	for {
		old := w.fenced.Load()
		if epoch <= old || w.fenced.CompareAndSwap(old, epoch) {
			break
		}
	}
	w.wake()
}

func (w *Writer) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
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

// commit runs reqs in one transaction, retrying it through transient
// failures (see Hooks.Outage) until it commits, the store fails, or the
// writer stops and its grace ends.
func (w *Writer) commit(reqs []*Request) {
	var stopBy time.Time // when Close gives up retrying
	flaky := 0
	for attempt := 0; ; attempt++ {
		if err := w.Err(); err != nil {
			for _, r := range reqs {
				w.finish(r, nil, err)
			}
			return
		}
		live := w.takeLive(reqs)
		if len(live) == 0 {
			return
		}
		batch, err := w.apply(live)
		var unknown *store.UnknownCommitError
		if errors.As(err, &unknown) {
			committed, rerr := w.resolve(unknown, &stopBy)
			switch {
			case rerr != nil:
				w.giveUp(live, rerr)
				return
			case committed:
				batch, err = unknown.Batch, nil
			default:
				err = unknown.Err // not stored: retry
			}
		}
		if err == nil {
			w.committed(live, batch)
			return
		}
		fault := store.FaultOf(w.cfg.Store, err)
		if fault == store.Flaky {
			if flaky++; flaky > w.cfg.MaxFlaky {
				fault = store.Fatal
				err = fmt.Errorf("%w (failed %d times in a row)", err, flaky)
			}
		}
		if fault == store.Fatal {
			w.failWith(err)
			for _, r := range live {
				w.finish(r, nil, err)
			}
			return
		}
		w.noteOutage(err)
		for _, r := range live {
			r.state.Store(rQueued) // nothing stored: Do may withdraw it
		}
		if !w.pause(attempt, &stopBy) {
			since, last, _ := w.Outage()
			for _, r := range live {
				if r.state.CompareAndSwap(rQueued, rDone) {
					r.done(nil, &UnavailableError{Since: since, Last: last, Cause: ErrClosed})
				}
			}
			return
		}
	}
}

// takeLive moves the requests of reqs still queued in flight and returns
// them; those withdrawn are dropped, and those of a fenced epoch fail
// with store.ErrNotOwner.
func (w *Writer) takeLive(reqs []*Request) []*Request {
	live := make([]*Request, 0, len(reqs))
	fenced := w.fenced.Load()
	for _, r := range reqs {
		if fenced > 0 && holdsEpoch(r.Ops, fenced) {
			if r.state.CompareAndSwap(rQueued, rDone) {
				r.done(nil, store.ErrNotOwner)
			}
			continue
		}
		if r.state.CompareAndSwap(rQueued, rInFlight) {
			live = append(live, r)
		}
	}
	return live
}

// holdsEpoch reports whether ops hold an owner op of an epoch up to epoch.
func holdsEpoch(ops []store.Op, epoch int64) bool {
	for _, op := range ops {
		if o, ok := op.(store.OwnerOp); ok && o.OwnerEpoch() > 0 && o.OwnerEpoch() <= epoch {
			return true
		}
	}
	return false
}

// apply runs the ops of reqs in one transaction.
func (w *Writer) apply(reqs []*Request) (store.Batch, error) {
	var ops []store.Op
	if len(reqs) == 1 {
		ops = reqs[0].Ops
	} else {
		for _, r := range reqs {
			ops = append(ops, r.Ops...)
		}
	}
	if len(ops) == 0 {
		return store.Batch{}, nil
	}
	ctx, cancel := w.txContext()
	defer cancel()
	began := w.cfg.Clock.Monotonic()
	batch, err := w.cfg.Store.Apply(ctx, ops)
	took := w.cfg.Clock.Monotonic() - began
	w.statMu.Lock()
	w.busy += max(took, 0)
	if err == nil {
		w.batches++
		w.ops += int64(len(ops))
	}
	w.statMu.Unlock()
	return batch, err
}

func (w *Writer) txContext() (context.Context, context.CancelFunc) {
	if w.cfg.TxTimeout > 0 {
		return context.WithTimeout(context.Background(), w.cfg.TxTimeout)
	}
	return context.Background(), func() {}
}

// resolve asks the store whether the transaction of u committed, until it
// can tell. An error means it could not be told before the writer's stop
// grace ended, or the store failed (a rewind).
func (w *Writer) resolve(u *store.UnknownCommitError, stopBy *time.Time) (bool, error) {
	w.noteOutage(u)
	for attempt := 0; ; attempt++ {
		ctx, cancel := w.txContext()
		committed, err := u.Resolve(ctx)
		cancel()
		if err == nil {
			return committed, nil
		}
		if store.FaultOf(w.cfg.Store, err) == store.Fatal {
			w.failWith(err)
			return false, err
		}
		w.noteOutage(err)
		if !w.pause(attempt, stopBy) {
			return false, &outcomeUnknown{fmt.Errorf("%w: %w", ErrClosed, err)}
		}
	}
}

// giveUp ends reqs, whose transaction may have committed, with err.
func (w *Writer) giveUp(reqs []*Request, err error) {
	if !errors.Is(err, ErrOutcomeUnknown) && !errors.Is(err, store.ErrRewound) {
		err = &outcomeUnknown{err}
	}
	for _, r := range reqs {
		w.finish(r, nil, err)
	}
}

// pause waits before the next attempt: a jittered backoff, cut short by
// Fence or Close. It returns false once Close has been called and its
// grace (StopGrace) has passed.
func (w *Writer) pause(attempt int, stopBy *time.Time) bool {
	select {
	case <-w.stop:
		if stopBy.IsZero() {
			*stopBy = w.cfg.Clock.Now().Add(w.cfg.StopGrace)
		}
		if !w.cfg.Clock.Now().Before(*stopBy) {
			return false
		}
	default:
	}
	d := w.cfg.MinBackoff << min(attempt, 20)
	if d <= 0 || d > w.cfg.MaxBackoff {
		d = w.cfg.MaxBackoff
	}
	d = d/2 + rand.N(d/2+1)
	t := w.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-w.kick:
	}
	return true
}

// noteOutage records err, a transient failure, and calls Hooks.Outage at
// an outage's first.
func (w *Writer) noteOutage(err error) {
	w.mu.Lock()
	first := w.outSince.IsZero()
	if first {
		w.outSince = w.cfg.Clock.Now()
	}
	w.outErr = err
	since := w.outSince
	w.mu.Unlock()
	if first && w.cfg.Hooks.Outage != nil {
		w.cfg.Hooks.Outage(since, err)
	}
}

// finish tells r its outcome, unless it was withdrawn.
func (w *Writer) finish(r *Request, results []store.Result, err error) {
	if r.state.Swap(rDone) == rWithdrawn {
		r.state.Store(rWithdrawn)
		return
	}
	r.done(results, err)
}

// committed publishes batch's events and tells reqs their results.
func (w *Writer) committed(reqs []*Request, batch store.Batch) {
	w.mu.Lock()
	since := w.outSince
	w.outSince, w.outErr = time.Time{}, nil
	w.mu.Unlock()
	if !since.IsZero() && w.cfg.Hooks.Recovered != nil {
		w.cfg.Hooks.Recovered(since)
	}
	results := batch.Results
	var evs []store.Event
	for i := range results {
		evs = append(evs, results[i].Events...)
	}
	if len(evs) > 0 {
		if w.follow && batch.Follows < w.lastSeq {
			// The log ended below what this writer already published:
			// the database lost commits (a restore, a lossy failover).
			err := fmt.Errorf("%w: this process saw event %d, the database's log ended at %d", store.ErrRewound, w.lastSeq, batch.Follows)
			w.failWith(err)
		}
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
		n := len(r.Ops)
		r.state.Store(rDone)
		r.done(results[i:i+n:i+n], nil)
		i += n
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
		ctx, cancel := w.txContext()
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
	ctx, cancel := w.txContext()
	changed, err := w.cfg.Store.Changed(ctx)
	cancel()
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
