package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/runcue/runcue/internal/call"
	"github.com/runcue/runcue/store"
)

// Handler performs one run of a work unit. It should return when ctx is
// done; context.Cause(ctx) tells why (ErrTimeout, ErrCancelled, ErrShutdown).
// The result is stored as its JSON encoding. Return an error made with
// Permanent for failures that retrying cannot fix.
type Handler func(ctx context.Context, w *Work) (any, error)

// Task describes a type of work: the services each unit of it needs and the
// handler that performs it.
type Task struct {
	// Services lists the services every unit of the task uses; each must be
	// registered first. A unit is dispatched only when all of them have
	// capacity, and holds all of them while it runs.
	Services []string
	// Handler performs a unit. Required, unless Remote.
	Handler Handler
	// Remote makes the task's handlers run in executors (NewExecutor): in
	// other processes on this host (SQLite) or on other hosts
	// (PostgreSQL). This Cue still decides every start, under every
	// limit; a run goes to a live executor that registered the task and
	// has room, and none is dispatched while no such executor lives (see
	// ReasonNoExecutor). The store must implement store.ExecutorStore.
	// A remote task has no Handler here.
	Remote bool
	// Timeout bounds a run. Default Config.DefaultTimeout. A submission's
	// own Timeout takes precedence. At the deadline the handler's context is
	// cancelled with cause ErrTimeout and the run is recorded as failed (kind
	// "timeout") and retried per Retry, even if the handler ignores its
	// context; whatever the handler returns later is discarded.
	Timeout time.Duration
	// MaxConcurrent caps the units of this task running at once, under the
	// Cue's MaxConcurrent. Zero means no cap of its own.
	MaxConcurrent int
	// Retry is the retry policy for failed runs. Its zero value is the
	// default policy (see RetryPolicy).
	Retry RetryPolicy
	// ServiceKeys, when set, derives from a unit the keyed services it uses
	// besides Services: each key "class:key" (say "host:example.org") names
	// an instance of the registered service "class" with that service's
	// limits of its own, created on first use and forgotten when idle. Use it
	// for limits whose keys are known only at run time: per host, per tenant.
	// A unit whose keys cannot be derived (a panic, a malformed key, an
	// unknown class) fails permanently without running its handler.
	ServiceKeys func(w *Work) []string
	// MaxDeferrals caps the runs of a unit that end in a Retry-After and
	// spend no retry budget; further ones count as failed runs. Default 10.
	MaxDeferrals int
	// HoldSlotsUntilReturn keeps a timed-out or cancelled run's service
	// slots (and its place under the caps) until its handler actually
	// returns. By default they are released at the deadline, as soon as the
	// unit is recorded failed: a handler that ignores its context can then
	// still be talking to the service while the next unit starts, so the
	// service may see more than MaxConcurrent requests at once. Set this for
	// services where that matters more than throughput.
	HoldSlotsUntilReturn bool
	// FailOnSkippedDependency fails a unit of this task (ErrorKind
	// prerequisite_skipped) when one of its dependencies is skipped (Skip),
	// as a failed dependency fails it. By default a skipped dependency
	// satisfies it as a completed one does: set this when the unit needs
	// what the dependency would have produced.
	FailOnSkippedDependency bool
	// Estimate gives the cost of a submission that states none (its Cost
	// is nil): the amounts one run will charge its services' meters, at
	// least what the service will count (see Meter). It is called at
	// submit, in the submitting process, and its answer is stored with the
	// unit; a process that submits units of a task it has not registered
	// states their Cost itself.
	Estimate func(s Submission) Costs
	// Debounce collapses a burst of submissions of one key into one run
	// (see Debounce). Like Estimate, it applies where the task is
	// registered: a process that submits units of a task it has not
	// registered submits them undebounced.
	Debounce *Debounce
	// Sequence makes the units of one key start one at a time, in
	// submission order (see Sequence).
	Sequence *Sequence
	// Batch makes the task's handler take its units in batches (see
	// Batch); its Handler is then Batch.Handler.
	Batch *Batch
}

// Sequence makes a task's units of one key (an account, a document, a
// host) start one at a time, in the order they were submitted (stored),
// retries included: a unit waiting out its backoff or a Retry-After holds
// its key, and the next waits. Cancelled and skipped units give the turn
// to the next; so does a unit that fails for good, unless HoldOnFailure.
// Explain says "waits for <unit> in sequence <key>" (ReasonSequence). The
// owner decides, from the units it holds, which it loads in submission
// order: a new owner goes on in the same order.
type Sequence struct {
	// Key gives a unit's key from its target; nil means the target
	// itself. An empty key puts the unit in no sequence; a Key that
	// panics puts it in the sequence of its target.
	Key func(target string) string
	// HoldOnFailure makes a unit that fails for good hold its key: the
	// key's next units wait until it is retried (Cue.Retry,
	// RetryFailed) and completes, is skipped or is cancelled. Without it,
	// the next unit goes on.
	HoldOnFailure bool
}

// Debounce collapses a burst of submissions of one key (a document edited
// ten times) into one run, for the latest. A submission whose key a
// queued unit of the task holds, one that has not started, replaces it:
// that unit ends skipped, its reason naming the new one (error kind
// "debounced"), and the new one runs Period after its submission, unless
// another replaces it in turn. The store decides, in the transaction that
// stores the new unit: submissions from several processes, and a change
// of owner, collapse exactly. Once the unit has started (its burst is
// over), a submission of its key begins a new burst. The latest
// submission's params win.
type Debounce struct {
	// Key derives a submission's key; nil means its Target. An empty key
	// does not debounce the submission.
	Key func(s Submission) string
	// Period is how long after the last submission of a burst its unit
	// runs. At least 1ms.
	Period time.Duration
	// MaxWait bounds a burst that does not settle: its unit runs at the
	// latest MaxWait after the burst's first submission. Zero: no bound;
	// else at least Period.
	MaxWait time.Duration
}

// Work is the unit a Handler performs.
type Work struct {
	// ID is the unit's identifier.
	ID string
	// Task is the unit's task type.
	Task string
	// Target is what the unit works on (a path, a URL, a record ID).
	Target string
	// Params is the JSON encoding of the submission's parameters; null or
	// empty when there were none.
	Params json.RawMessage
	// Attempt is the run number, from 1.
	Attempt int
	// Started is the instant runcue read on the handler's goroutine just
	// before it called the handler: the start that rate windows count. For
	// every rate-limited service, no interval of length RateWindow plus
	// the service's Margin holds more than RateLimit of these instants, in
	// one process and across owners. Zero outside a run (in ServiceKeys,
	// Priority).
	Started time.Time

	// run reports the run's progress and heartbeats; nil outside a run.
	run call.Reporter
	// cue is the Cue the run belongs to (see Cue); nil outside a run.
	cue *Cue
}

// Cue returns the Cue to submit follow-up work through and to read the
// unit's dependencies with (Cue.DependencyResults): in a handler this
// process's dispatcher runs, the Cue that runs it; in an executor made
// with Cue.Executor, that Cue, whose registered tasks (their Estimate,
// Services and ServiceKeys) apply to what it submits. Nil outside a run
// and in an executor made with NewExecutor, which knows no tasks.
func (w *Work) Cue() *Cue { return w.cue }

// WorkFrom returns the Work of the run whose handler was given ctx, or a
// context derived from it; nil for any other context. It lets code the
// handler calls without its Work (an HTTP client's middleware, an SDK
// adapter such as runcue's llm/openai) report what the run used and what
// the service said of its limits (Work.Used, Work.Observe). In a batch
// handler it returns the batch's first Work: the amounts reported
// through it add up with the others'.
func WorkFrom(ctx context.Context) *Work {
	w, _ := ctx.Value(workKey{}).(*Work)
	return w
}

// workKey is the context key of a run's Work.
type workKey struct{}

// withWork returns ctx carrying w, for WorkFrom.
func withWork(ctx context.Context, w *Work) context.Context {
	return context.WithValue(ctx, workKey{}, w)
}

// Progress reports how far the handler has got: any JSON-encodable value
// (a percentage, "page 3 of 12", a struct). It is published as a
// work_progress event, at most one a second per unit, the latest value
// winning; it is not stored. Params and results are never logged, nor is
// progress.
func (w *Work) Progress(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("runcue: progress: %w", err)
	}
	if w.run != nil {
		w.run.Progress(b)
	}
	return nil
}

// Heartbeat reports that the handler is alive: the unit's HeartbeatAt is
// set and its lease extended to at least now + Config.LeaseBuffer. Handlers
// waiting a long time on an external system may call it as often as they
// like; runcue writes at most one heartbeat a second. On SQLite the owner's
// lock, not the lease, proves a run alive (a run is never taken from a live
// owner, only its timeout ends it), so there a heartbeat is a progress sign
// for UIs; it keeps leases meaningful for stores shared by several nodes.
func (w *Work) Heartbeat() {
	if w.run != nil {
		w.run.Heartbeat()
	}
}

// Used reports the amounts the run actually used, by amount (the tokens a
// response reports, the bytes sent): when the handler returns, each meter
// that counts one of them (Service.Meters) replaces the start's charge,
// the unit's estimate, per its Charge policy, in memory and in the
// service log, in the transaction that records the run's end. A later
// call replaces an amount an earlier one reported; an amount not reported
// keeps its estimate. Negative amounts are taken as zero, and amounts
// above MaxCost as MaxCost (as a submission's costs are bounded), so that
// no report can overflow a meter's count. It is safe to call from any
// goroutine of the handler's; a call after the handler returned is
// ignored.
func (w *Work) Used(amounts Costs) {
	if w.run != nil {
		w.run.Use(amounts)
	}
}

// Observe reports what a service said of its limits in a response (see
// Observation; httplimit.Report reads it from HTTP headers): where the
// service has less left of a limit than the meter counting it thinks, the
// difference was used from elsewhere (another process, another key on the
// same quota) and counts as such until the service said the limit is
// whole again, at most a window; a limit with nothing left holds its meter
// until its reset, at most a window. Reports apply in the order they are
// made; a meter ignores one older than the latest it took. The usage is
// logged, so a new owner counts it too.
func (w *Work) Observe(o Observation) {
	if w.run != nil {
		w.run.Observe(o)
	}
}

// Bind decodes Params into v. With no params, v is left unchanged.
func (w *Work) Bind(v any) error {
	if len(w.Params) == 0 || string(w.Params) == "null" {
		return nil
	}
	if err := json.Unmarshal(w.Params, v); err != nil {
		return fmt.Errorf("runcue: params of %s: %w", w.ID, err)
	}
	return nil
}

// Handle adapts a function with typed parameters and result to a Handler.
// Parameters that do not decode into P fail the run permanently.
func Handle[P, R any](fn func(ctx context.Context, w *Work, params P) (R, error)) Handler {
	return func(ctx context.Context, w *Work) (any, error) {
		var p P
		if err := w.Bind(&p); err != nil {
			return nil, Permanent(err)
		}
		return fn(ctx, w, p)
	}
}

// taskDef is the persisted form of a Task.
type taskDef struct {
	Services []string `json:"services,omitempty"`
}

// Task registers a task type under name. Every service it names must be
// registered. Registering a name twice is an error. Tasks may be registered
// after Start; units of the task already queued then become runnable.
func (c *Cue) Task(name string, t Task) error {
	if err := validName("task", name); err != nil {
		return err
	}
	switch {
	case t.Remote && t.Handler != nil:
		return fmt.Errorf("%w: task %q is remote: its handler runs in executors, not here", ErrInvalid, name)
	case t.Remote:
		if _, ok := c.st.(store.ExecutorStore); !ok {
			return fmt.Errorf("%w: task %q is remote, and the store has no executors (store.ExecutorStore)", ErrInvalid, name)
		}
	case t.Handler == nil && t.Batch == nil:
		return fmt.Errorf("%w: task %q has no handler", ErrInvalid, name)
	}
	if err := validBatch(name, &t); err != nil {
		return err
	}
	if t.Timeout < 0 || t.MaxConcurrent < 0 || t.MaxDeferrals < 0 {
		return fmt.Errorf("%w: task %q: negative Timeout, MaxConcurrent or MaxDeferrals", ErrInvalid, name)
	}
	if d := t.Debounce; d != nil && (d.Period < time.Millisecond || d.Period > MaxTimeout || d.MaxWait < 0 ||
		(d.MaxWait > 0 && d.MaxWait < d.Period) || d.MaxWait > MaxTimeout) {
		return fmt.Errorf("%w: task %q: Debounce Period %v, MaxWait %v (Period at least 1ms, MaxWait zero or at least Period, both at most %v)",
			ErrInvalid, name, d.Period, d.MaxWait, MaxTimeout)
	}
	if t.Timeout > MaxTimeout {
		return fmt.Errorf("%w: task %q: Timeout longer than %v", ErrInvalid, name, MaxTimeout)
	}
	if err := validateRetry(t.Retry); err != nil {
		return fmt.Errorf("task %q: %w", name, err)
	}
	t.Services = slices.Clone(t.Services)
	slices.Sort(t.Services)
	for i, s := range t.Services {
		if i > 0 && t.Services[i-1] == s {
			return fmt.Errorf("%w: task %q lists service %q twice", ErrInvalid, name, s)
		}
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if _, dup := c.tasks[name]; dup {
		c.mu.Unlock()
		return fmt.Errorf("%w: task %q is already registered", ErrInvalid, name)
	}
	for _, s := range t.Services {
		if _, ok := c.services[s]; !ok {
			c.mu.Unlock()
			return fmt.Errorf("task %q: %w: %q", name, ErrUnknownService, s)
		}
	}
	c.tasks[name] = &t
	c.mu.Unlock()
	def, _ := json.Marshal(taskDef{Services: t.Services})
	if _, err := c.w.Do(context.Background(), &store.PutTask{Name: name, Def: def}); err != nil {
		c.mu.Lock()
		delete(c.tasks, name)
		c.mu.Unlock()
		return fmt.Errorf("task %q: %w", name, wrapStoreErr(err))
	}
	c.mu.Lock()
	c.knownTasks[name] = true
	c.mu.Unlock()
	c.notifyRegistry()
	return nil
}

// DefaultMaxDeferrals is Task.MaxDeferrals' default.
const DefaultMaxDeferrals = 10

func (t *Task) maxDeferrals() int {
	if t.MaxDeferrals == 0 {
		return DefaultMaxDeferrals
	}
	return t.MaxDeferrals
}
