package runcue

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue/internal/recur"
	"github.com/runcue/runcue/store"
)

// State is the state of a work unit. It prints as the spec names it.
type State = store.State

// The states of a work unit.
const (
	StateQueued    State = store.Queued
	StateRunning   State = store.Running
	StateCompleted State = store.Completed
	StateFailed    State = store.Failed
	StateCancelled State = store.Cancelled
	// StateSkipped: the handler ended the unit with Skip. A finished,
	// non-error outcome; its dependents run unless their task sets
	// FailOnSkippedDependency.
	StateSkipped State = store.Skipped
)

// Submission is a request to perform a unit of work.
type Submission struct {
	// Task is the unit's task type. Required. It must be registered in this
	// Cue or, by another process, in the database.
	Task string
	// ID is an optional caller-chosen identifier, unique in the database.
	// Default: a generated, time-ordered identifier.
	ID string
	// Target is what the unit works on.
	Target string
	// Params are the unit's parameters; anything encoding/json can encode.
	// A json.RawMessage is stored as it is.
	Params any
	// Timeout bounds each run, overriding the task's.
	Timeout time.Duration
	// RunAt, when set, makes the unit ineligible before that time.
	RunAt time.Time
	// IdempotencyKey, when set, makes the submission idempotent: if a unit
	// with the key is queued, running or completed, Submit stores nothing and
	// returns that unit's ID with Submitted.Duplicate set. A key held by a
	// failed or cancelled unit is handled per Config.FailedDuplicates. Safe
	// under concurrent submits, across processes too.
	IdempotencyKey string
	// Retry, when set, replaces the task's retry policy for this unit. Its
	// RetryOn is not stored: the task's RetryOn applies.
	Retry *RetryPolicy
	// DependsOn lists units that must complete first: IDs of stored units,
	// or caller-chosen IDs of earlier or later submissions of the same
	// batch. A dependency that fails or is cancelled fails this unit
	// (ErrorKind prerequisite_failed or prerequisite_cancelled), at once
	// if it already has. A skipped dependency (Skip) counts as completed,
	// unless the unit's task sets FailOnSkippedDependency.
	DependsOn []string
	// DependencyTimeout, when set, fails the unit (ErrorKind
	// dependency_timeout) if its dependencies are still not satisfied that
	// long after submission.
	DependencyTimeout time.Duration
	// Cost is what one run of the unit charges the meters of its services,
	// by amount (see Costs), estimated now: it is stored with the unit. Nil
	// means the task's Estimate, if it has one. It must state every amount
	// its task's services meter (Service.Meters), and fit each limit.
	Cost Costs
}

// Submitted reports the outcome of one submission.
type Submitted struct {
	// ID is the unit's identifier.
	ID string
	// Duplicate reports that an existing unit matched the submission's
	// idempotency key; ID is that unit's.
	Duplicate bool
	// Err, when set, says why the submission was refused and nothing was
	// stored for it: its IdempotencyKey belongs to a failed or cancelled
	// unit (ErrDuplicate, under RejectFailedDuplicates), or it depends on a
	// submission of the same batch that was refused (ErrDependencyRefused).
	Err error
}

// Attempt records one run of a unit.
type Attempt struct {
	// Run is the run number, from 1.
	Run   int       `json:"run"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Outcome is completed, skipped, failed, timeout, cancelled, panic,
	// interrupted (by shutdown), deferred (Retry-After), late_start (a
	// rate-limited run that could not start within Config.MaxStartDelay of
	// its dispatch; it was requeued, nothing ran) or abandoned (owner died).
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
	// Used are the amounts the run reported it used (Work.Used), by
	// amount; nil when it reported none. Beside WorkInfo.Cost (the
	// estimate each run is charged at its start), they audit an estimator.
	Used Costs `json:"used,omitempty"`
}

// Duration returns how long the run took.
func (a Attempt) Duration() time.Duration { return a.End.Sub(a.Start) }

// WorkInfo is a snapshot of a work unit. Its JSON follows runcue's one
// convention (as Event and ServiceStatus do): snake_case names, RFC 3339
// times, zero times left out, durations as integer milliseconds in fields
// named *_ms (timeout_ms).
type WorkInfo struct {
	ID     string          `json:"id"`
	Task   string          `json:"task"`
	Target string          `json:"target,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	State  State           `json:"state"`
	// Runs counts the runs started; Failures the failed runs that spent
	// retry budget.
	Runs     int `json:"runs"`
	Failures int `json:"failures"`
	// CreatedAt is the submission time; RunAt the time before which the unit
	// is not eligible (a delayed submission or a retry), zero if none.
	CreatedAt  time.Time     `json:"created_at"`
	RunAt      time.Time     `json:"run_at,omitzero"`
	StartedAt  time.Time     `json:"started_at,omitzero"`
	FinishedAt time.Time     `json:"finished_at,omitzero"`
	Timeout    time.Duration `json:"-"` // timeout_ms
	// Result is a completed unit's result.
	Result json.RawMessage `json:"result,omitempty"`
	// Error and ErrorKind describe the last failure; for a skipped unit,
	// Error is the reason given to Skip and ErrorKind is "skipped" (or,
	// for a unit a later submission of its debounce key replaced,
	// "replaced by <unit>" and "debounced").
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"error_kind,omitempty"`
	// LeasedBy and LeaseExpiresAt describe a running unit's lease;
	// HeartbeatAt is its handler's last Work.Heartbeat.
	LeasedBy       string    `json:"leased_by,omitempty"`
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
	HeartbeatAt    time.Time `json:"heartbeat_at,omitzero"`
	// DependsOn lists the units this one waits for.
	DependsOn []string `json:"depends_on,omitempty"`
	// DebounceKey is the key of a debounced unit (Task.Debounce) that has
	// not started: a later submission of the key replaces it.
	// DebounceSince is when its burst began.
	DebounceKey   string    `json:"debounce_key,omitempty"`
	DebounceSince time.Time `json:"debounce_since,omitzero"`
	// Cost is what one run charges the meters of its services, as stored
	// at submit (Submission.Cost or the task's Estimate); nil: one request.
	Cost Costs `json:"cost,omitempty"`
	// Attempts is the history of runs, oldest first.
	Attempts []Attempt `json:"attempts,omitempty"`
	// Schedule and Period name the schedule and the period that
	// submitted the unit, if one did.
	Schedule string `json:"schedule,omitempty"`
	Period   string `json:"period,omitempty"`
}

// workInfoJSON is WorkInfo's JSON form: the fields as tagged, and the
// timeout in milliseconds.
type workInfoJSON struct {
	plainWorkInfo
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

type plainWorkInfo WorkInfo

// MarshalJSON writes w in runcue's JSON convention.
func (w WorkInfo) MarshalJSON() ([]byte, error) {
	return json.Marshal(workInfoJSON{plainWorkInfo(w), w.Timeout.Milliseconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (w *WorkInfo) UnmarshalJSON(b []byte) error {
	var j workInfoJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*w = WorkInfo(j.plainWorkInfo)
	w.Timeout = time.Duration(j.TimeoutMS) * time.Millisecond
	return nil
}

func infoFrom(u *store.Unit) WorkInfo {
	wi := WorkInfo{
		ID: u.ID, Task: u.Task, Target: u.Target, Params: u.Params, State: u.State,
		Runs: u.Runs, Failures: u.Failures,
		CreatedAt: u.CreatedAt, RunAt: u.RunAt, StartedAt: u.StartedAt, FinishedAt: u.FinishedAt, Timeout: u.Timeout,
		Result: u.Result, Error: u.Error, ErrorKind: u.ErrorKind, Cost: u.Costs,
		LeasedBy: u.LeasedBy, LeaseExpiresAt: u.LeaseExpiresAt, HeartbeatAt: u.HeartbeatAt, DependsOn: u.DependsOn,
	}
	for _, a := range u.Attempts {
		wi.Attempts = append(wi.Attempts, Attempt{Run: a.Run, Start: a.Start, End: a.End, Outcome: a.Outcome, Error: a.Error, Used: a.Used})
	}
	wi.Schedule, wi.Period, _ = recur.ParseUnitKey(u.IdempotencyKey)
	return wi
}

// Bounds of a submission's inputs, refused with ErrInvalid beyond them.
// Units stored by a runcue before these bounds (a longer target, say)
// still load and run.
const (
	// MaxID is the longest unit ID, in bytes.
	MaxID = 255
	// MaxTarget is the longest Submission.Target, in bytes: a target is
	// copied into every event of its unit and every message about it.
	MaxTarget = 8 << 10
	// MaxIdempotencyKey is the longest Submission.IdempotencyKey, in bytes.
	MaxIdempotencyKey = 1 << 10
)

// minTime and maxTime bound the times a store represents (nanoseconds
// since 1970 in 64 bits: the years 1678 to 2262).
var (
	minTime = time.Unix(0, math.MinInt64+1)
	maxTime = time.Unix(0, math.MaxInt64)
)

// Get returns a snapshot of the unit with the given ID, or ErrNotFound.
func (c *Cue) Get(ctx context.Context, id string) (WorkInfo, error) {
	if err := c.checkOpen(); err != nil {
		return WorkInfo{}, err
	}
	u, err := c.st.GetUnit(ctx, id)
	if err != nil {
		return WorkInfo{}, c.readErr(err)
	}
	wi := infoFrom(u)
	if dr, ok := c.st.(store.DebounceReader); ok && u.State == store.Queued && u.Runs == 0 {
		key, since, held, err := dr.DebounceOf(ctx, id)
		if err != nil {
			return WorkInfo{}, c.readErr(err)
		}
		if held {
			_, wi.DebounceKey, _ = strings.Cut(key, " ") // the stored key begins with the task's name
			wi.DebounceSince = since
		}
	}
	return wi, nil
}

// Dependents returns the IDs of the units that depend on the unit id (that
// listed it in DependsOn), sorted, or ErrNotFound if no unit has that ID.
func (c *Cue) Dependents(ctx context.Context, id string) ([]string, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	states, err := c.st.UnitStates(ctx, []string{id})
	if err != nil {
		return nil, c.readErr(err)
	}
	if _, ok := states[id]; !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	ids, err := c.st.Dependents(ctx, id)
	if err != nil {
		return nil, c.readErr(err)
	}
	slices.Sort(ids)
	return ids, nil
}

// WorkEvents returns the retained durable events of the unit id with a
// sequence number above after, oldest first, at most limit of them (zero
// means 100; at most 1000). Pass the last one's Seq as after to read on.
// It reads the blocks of the log that the unit's own record of its events
// names, so its cost is what it returns, however long the log (a unit with
// more events than its record holds, a few hundred, has the rest read from
// the log after the last one recorded). The events outlive the unit until
// retention deletes them: a pruned or unknown unit is not an error, it has
// no events or only its old ones, found by reading the retained log.
func (c *Cue) WorkEvents(ctx context.Context, id string, after int64, limit int) ([]Event, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	switch {
	case after < 0 || limit < 0:
		return nil, fmt.Errorf("%w: after %d, limit %d", ErrInvalid, after, limit)
	case limit == 0:
		limit = 100
	case limit > 1000:
		limit = 1000
	}
	// The owner's answers about a unit (owner_asked, owner_answered: a
	// runcue before this one stored them with the unit's ID) are not the
	// unit's events: they are skipped, and the page filled from further on.
	var out []Event
	for {
		evs, err := c.st.MatchingEvents(ctx, store.EventQuery{WorkID: id, After: after, Upto: math.MaxInt64, Limit: limit - len(out)})
		if err != nil {
			return nil, c.readErr(err)
		}
		for i := range evs {
			if t := EventType(evs[i].Type); t != EventOwnerAsked && t != EventOwnerAnswered {
				out = append(out, eventFrom(&evs[i]))
			}
		}
		if len(evs) == 0 || len(out) == limit {
			return out, nil
		}
		after = evs[len(evs)-1].Seq
	}
}

// ListOptions select the units List returns.
type ListOptions struct {
	// States and Tasks filter; empty means all.
	States []State
	Tasks  []string
	// Newest lists the most recently submitted units first. Default oldest
	// first.
	Newest bool
	// Limit caps the page. Default 100, at most 1000.
	Limit int
	// Cursor continues from a previous page's Next.
	Cursor string
	// SubmittedAfter and SubmittedBefore bound the submission time (at or
	// after, before); FinishedAfter and FinishedBefore the finish time of
	// finished units. Zero means unbounded.
	SubmittedAfter, SubmittedBefore time.Time
	FinishedAfter, FinishedBefore   time.Time
	// TargetPrefix selects the units whose target starts with it.
	TargetPrefix string
	// ErrorContains selects the units whose error contains it (case
	// sensitive): "429", "timeout".
	ErrorContains string
	// MaxScan, when positive, bounds the work of one call whatever the
	// filters: List examines only the next MaxScan submission sequence
	// numbers from the cursor (in the direction of the listing), so its
	// cost does not grow with the database. If that stretch holds fewer
	// than Limit matching units, the page is short (or empty), Partial is
	// set and Next continues the search from where this call stopped.
	// Filters that no index serves (TargetPrefix, ErrorContains, a task,
	// a finished state) otherwise examine every unit to fill a page.
	MaxScan int
}

// filter is o as a store filter, without paging.
func (o ListOptions) filter() store.ListFilter {
	return store.ListFilter{States: o.States, Tasks: o.Tasks, CreatedAfter: clampTime(o.SubmittedAfter),
		CreatedBefore: clampTime(o.SubmittedBefore), FinishedAfter: clampTime(o.FinishedAfter),
		FinishedBefore: clampTime(o.FinishedBefore), TargetPrefix: o.TargetPrefix, ErrorContains: o.ErrorContains}
}

// clampTime brings a time a store cannot represent to the nearest one it
// can (the zero time, not set, stays): a filter from the year 9999 means
// "from the last time there is".
func clampTime(t time.Time) time.Time {
	switch {
	case t.IsZero():
		return t
	case t.Before(minTime):
		return minTime
	case t.After(maxTime):
		return maxTime
	}
	return t
}

// WorkPage is one page of List. Its JSON follows runcue's convention:
// units, next and partial.
type WorkPage struct {
	Units []WorkInfo `json:"units"`
	// Next is the cursor for the following page; empty on the last page.
	Next string `json:"next,omitempty"`
	// Partial reports that the page stopped at ListOptions.MaxScan, not at
	// Limit: more matching units may follow Next.
	Partial bool `json:"partial,omitempty"`
}

// List returns one page of units in submission order.
func (c *Cue) List(ctx context.Context, o ListOptions) (WorkPage, error) {
	if err := c.checkOpen(); err != nil {
		return WorkPage{}, err
	}
	limit := o.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	if o.MaxScan < 0 {
		return WorkPage{}, fmt.Errorf("%w: MaxScan %d", ErrInvalid, o.MaxScan)
	}
	f := o.filter()
	f.Desc, f.Limit = o.Newest, limit+1
	if o.Cursor != "" {
		seq, err := strconv.ParseInt(o.Cursor, 36, 64)
		if err != nil || seq <= 0 {
			return WorkPage{}, fmt.Errorf("%w: bad cursor %q", ErrInvalid, o.Cursor)
		}
		if o.Newest {
			f.BeforeSeq = seq
		} else {
			f.AfterSeq = seq
		}
	}
	// stop is where a bounded scan stops short of the whole database: the
	// cursor of the page that searches on. Zero: it reaches the end.
	var stop int64
	if o.MaxScan > 0 {
		last, err := c.st.ListUnits(ctx, store.ListFilter{Desc: true, Limit: 1})
		if err != nil {
			return WorkPage{}, c.readErr(err)
		}
		if len(last) == 0 {
			return WorkPage{}, nil
		}
		newest := last[0].Seq
		if o.Newest {
			hi := min(newest+1, cmp.Or(f.BeforeSeq, newest+1)) // examine [hi-MaxScan, hi)
			if lo := hi - int64(o.MaxScan); lo > 1 {
				f.AfterSeq, stop = lo-1, lo
			}
			f.BeforeSeq = hi
		} else if hi := f.AfterSeq + int64(o.MaxScan); hi < newest { // examine (AfterSeq, hi]
			f.BeforeSeq, stop = hi+1, hi
		}
	}
	units, err := c.st.ListUnits(ctx, f)
	if err != nil {
		return WorkPage{}, c.readErr(err)
	}
	var page WorkPage
	switch {
	case len(units) > limit:
		units = units[:limit]
		page.Next = strconv.FormatInt(units[limit-1].Seq, 36)
	case stop > 0:
		page.Next, page.Partial = strconv.FormatInt(stop, 36), true
	}
	page.Units = make([]WorkInfo, len(units))
	for i, u := range units {
		page.Units[i] = infoFrom(u)
	}
	return page, nil
}

// Wait returns the unit's snapshot once it is finished (completed,
// skipped, failed or cancelled), or ctx's error. It works in any process that has the
// database open, owner or not.
func (c *Cue) Wait(ctx context.Context, id string) (WorkInfo, error) {
	warned := false
	for {
		if err := c.checkOpen(); err != nil {
			return WorkInfo{}, err
		}
		watch := c.hub.Watch(id)
		var u *store.Unit
		err := c.retryRead(ctx, func() (err error) {
			u, err = c.st.GetUnit(ctx, id)
			return err
		})
		if err != nil {
			return WorkInfo{}, c.readErr(err)
		}
		if u.State.Terminal() {
			return infoFrom(u), nil
		}
		if !warned {
			warned = true
			c.warnIfUnowned(ctx, "Wait", "work_id", id)
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return WorkInfo{}, ctx.Err()
		}
	}
}

// DependencyResults returns the results of the units that unit id depends
// on (its DependsOn), by ID: a completed dependency's result (null when
// its handler returned none). A dependency not completed (skipped,
// satisfied outside runcue by DependencySatisfied, pruned) has no entry.
// A handler reads its own with w.Cue().DependencyResults(ctx, w.ID).
func (c *Cue) DependencyResults(ctx context.Context, id string) (map[string]json.RawMessage, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	u, err := c.st.GetUnit(ctx, id)
	if err != nil {
		return nil, c.readErr(err)
	}
	out := make(map[string]json.RawMessage, len(u.DependsOn))
	if len(u.DependsOn) == 0 {
		return out, nil
	}
	// One read for them all; a pruned dependency is simply not listed.
	deps, err := c.st.ListUnits(ctx, store.ListFilter{IDs: u.DependsOn, States: []store.State{store.Completed}, Limit: len(u.DependsOn)})
	if err != nil {
		return nil, c.readErr(err)
	}
	for _, d := range deps {
		r := json.RawMessage(d.Result)
		if len(r) == 0 {
			r = json.RawMessage("null")
		}
		out[d.ID] = r
	}
	return out, nil
}
