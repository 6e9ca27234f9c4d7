package runcue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/runcue/runcue/internal/recur"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// validTime refuses a time (named what) a store cannot represent; the zero
// time (not set) is valid.
func validTime(what string, t time.Time) error {
	if !t.IsZero() && (t.Before(minTime) || t.After(maxTime)) {
		return fmt.Errorf("%w: %s %s is outside the times a store represents (%s to %s)", ErrInvalid, what,
			t.UTC().Format(time.RFC3339), minTime.UTC().Format(time.DateOnly), maxTime.UTC().Format(time.DateOnly))
	}
	return nil
}

// validText refuses a submitted string (named what) longer than limit
// bytes, or holding NUL or bytes that are not UTF-8.
func validText(what, s string, limit int) error {
	switch {
	case len(s) > limit:
		return fmt.Errorf("%w: %s of %d bytes is longer than %d", ErrInvalid, what, len(s), limit)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: %s contains NUL", ErrInvalid, what)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	return nil
}

func validID(id string) error {
	return validText("ID", id, MaxID)
}

func encodeParams(p any) ([]byte, error) {
	switch v := p.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(v) == 0 {
			return nil, nil
		}
		if !json.Valid(v) {
			return nil, fmt.Errorf("%w: Params is not valid JSON", ErrInvalid)
		}
		return v, nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("%w: Params: %v", ErrInvalid, err)
	}
	return b, nil
}

// Submit stores a unit of work and returns once it is committed. If ctx ends
// first, Submit returns ctx's error and the unit may or may not be stored.
// Submit works before Start; the unit then stays queued until a Cue that
// owns the database runs it.
//
// A submission whose IdempotencyKey belongs to a failed or cancelled unit
// returns an error matching ErrDuplicate (under RejectFailedDuplicates).
func (c *Cue) Submit(ctx context.Context, s Submission) (Submitted, error) {
	out, err := c.SubmitBatch(ctx, []Submission{s})
	if err != nil {
		return Submitted{}, err
	}
	return out[0], out[0].Err
}

// SubmitBatch stores the submissions in one transaction and returns their
// outcomes in order.
//
// A submission that is invalid, names an unknown task or dependency, or
// closes a dependency cycle refuses the whole batch: nothing is stored and
// the error says which. A duplicate is not an error of the batch: a
// submission whose IdempotencyKey belongs to a queued, running or completed
// unit is reported Duplicate with that unit's ID (and its dependents in the
// batch depend on that unit); one whose key belongs to a failed or
// cancelled unit is refused on its own, with Submitted.Err matching
// ErrDuplicate (under RejectFailedDuplicates; with ResubmitFailedDuplicates
// a new unit takes the key over), and so is every submission of the batch
// that depends on it, with Err matching ErrDependencyRefused. The rest of
// the batch is stored, so an import can be run again after any failure.
func (c *Cue) SubmitBatch(ctx context.Context, subs []Submission) ([]Submitted, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	if len(subs) == 0 {
		return nil, nil
	}
	if err := c.checkTasks(ctx, subs); err != nil {
		return nil, err
	}
	now := c.clock.Now()
	units := make([]*store.Unit, len(subs))
	trace := traceCarrier(ctx) // the submitter's span, for the runs' spans
	for i, s := range subs {
		u, err := c.unitFor(s, now)
		if err == nil && strings.HasPrefix(s.IdempotencyKey, recur.KeyPrefix) {
			err = fmt.Errorf("%w: an IdempotencyKey beginning %q is a schedule's", ErrInvalid, recur.KeyPrefix)
		}
		if err != nil {
			if len(subs) > 1 {
				err = fmt.Errorf("submission %d: %w", i, err)
			}
			return nil, err
		}
		u.Trace = trace
		units[i] = u
	}
	if err := c.checkCosts(ctx, units); err != nil {
		return nil, err
	}
	op := &store.Insert{Units: units, At: now,
		MaxQueued: c.cfg.MaxQueued, DropOldest: c.cfg.Overflow == OverflowDropOldest}
	if c.cfg.FailedDuplicates == ResubmitFailedDuplicates {
		op.OnFailedDuplicate = store.ResubmitFailedDuplicate
	}
	if c.cfg.MaxQueued > 0 && len(units) > c.cfg.MaxQueued {
		return nil, fmt.Errorf("%w: a batch of %d is larger than MaxQueued %d", ErrBackpressure, len(units), c.cfg.MaxQueued)
	}
	var o insertOutcome
	for {
		// Watch for commits before trying, so that room made between a
		// refusal and the wait is not missed.
		changed := c.hub.Changed()
		var err error
		if o, err = c.insert(ctx, op); err != nil {
			return nil, err
		}
		if !errors.Is(o.res.Err, ErrBackpressure) || c.cfg.Overflow != OverflowBlock {
			break
		}
		select {
		case <-changed:
		case <-c.hub.Done():
			return nil, ErrClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ErrBackpressure, ctx.Err())
		}
	}
	if o.res.Err != nil {
		return nil, o.res.Err
	}
	res := make([]Submitted, len(units))
	for i, iu := range o.res.Units {
		res[i] = Submitted{ID: iu.ID, Duplicate: iu.Duplicate, Err: iu.Refused}
	}
	return res, nil
}

type insertOutcome struct {
	res store.Result
	err error
}

// insert runs one Insert through the writer and tells the dispatcher.
func (c *Cue) insert(ctx context.Context, op *store.Insert) (insertOutcome, error) {
	ch := make(chan insertOutcome, 1)
	req := &writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
		if err == nil && res[0].Err == nil {
			c.inserted(op.Units, res[0])
		}
		var r store.Result
		if err == nil {
			r = res[0]
		}
		ch <- insertOutcome{r, err}
	}}
	if err := c.w.Submit(req); err != nil {
		return insertOutcome{}, wrapStoreErr(err)
	}
	select {
	case o := <-ch:
		if o.err != nil {
			return o, wrapStoreErr(o.err)
		}
		return o, nil
	case <-ctx.Done():
		// Withdrawn if no transaction holds it (ErrStoreUnavailable during
		// an outage, else ctx's error): nothing stored. Otherwise it may
		// commit (ErrOutcomeUnknown).
		return insertOutcome{}, c.w.Withdraw(req, ctx.Err())
	}
}

func (c *Cue) unitFor(s Submission, now time.Time) (*store.Unit, error) {
	if s.Task == "" {
		return nil, fmt.Errorf("%w: submission without a task", ErrInvalid)
	}
	if s.Timeout < 0 || s.DependencyTimeout < 0 {
		return nil, fmt.Errorf("%w: negative Timeout or DependencyTimeout", ErrInvalid)
	}
	if s.Timeout > MaxTimeout || s.DependencyTimeout > MaxTimeout {
		return nil, fmt.Errorf("%w: Timeout or DependencyTimeout longer than %v", ErrInvalid, MaxTimeout)
	}
	if err := errors.Join(validTime("RunAt", s.RunAt), validText("Target", s.Target, MaxTarget),
		validText("IdempotencyKey", s.IdempotencyKey, MaxIdempotencyKey)); err != nil {
		return nil, err
	}
	for _, dep := range s.DependsOn {
		// An ID stored before IDs had to be UTF-8 may be named.
		if len(dep) > MaxID || strings.IndexByte(dep, 0) >= 0 {
			return nil, fmt.Errorf("%w: DependsOn %.40q is not a unit ID", ErrInvalid, dep)
		}
	}
	id := s.ID
	if id == "" {
		id = c.ids.New(now)
	} else if err := validID(id); err != nil {
		return nil, err
	}
	params, err := encodeParams(s.Params)
	if err != nil {
		return nil, err
	}
	if len(params) > c.cfg.MaxPayload {
		return nil, fmt.Errorf("%w: params of %d bytes exceed Config.MaxPayload (%d)", ErrInvalid, len(params), c.cfg.MaxPayload)
	}
	u := &store.Unit{
		ID: id, Task: s.Task, Target: s.Target, Params: params, State: store.Queued,
		CreatedAt: now, RunAt: s.RunAt, Timeout: s.Timeout, IdempotencyKey: s.IdempotencyKey,
		DependsOn: slices.Clone(s.DependsOn),
	}
	if s.DependencyTimeout > 0 {
		u.DependencyDeadline = now.Add(s.DependencyTimeout)
	}
	if s.Retry != nil {
		if err := validateRetry(*s.Retry); err != nil {
			return nil, err
		}
		u.Retry = encodeRetry(*s.Retry)
	}
	c.mu.Lock()
	t := c.tasks[s.Task]
	c.mu.Unlock()
	if t != nil && t.Debounce != nil {
		if u.Debounce, err = debounceOf(t.Debounce, s); err != nil {
			return nil, err
		}
	}
	costs := s.Cost
	if costs == nil && t != nil && t.Estimate != nil {
		if costs, err = estimate(t.Estimate, s); err != nil {
			return nil, err
		}
	}
	if err := validCosts(costs); err != nil {
		return nil, err
	}
	if len(costs) > 0 {
		u.Costs = costs
	}
	return u, nil
}

// checkTasks verifies that every submission's task is known here or in the
// database (registered there by another process).
func (c *Cue) checkTasks(ctx context.Context, subs []Submission) error {
	var missing []string
	c.mu.Lock()
	for _, s := range subs {
		if s.Task != "" && !c.knownTasks[s.Task] {
			missing = append(missing, s.Task)
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	stored, err := c.st.Tasks(ctx)
	if err != nil {
		return c.readErr(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range stored {
		c.knownTasks[name] = true
	}
	for _, t := range missing {
		if !c.knownTasks[t] {
			return fmt.Errorf("%w: %q", ErrUnknownTask, t)
		}
	}
	return nil
}

// debounceOf is a submission's debounce under its task's d: nil for an
// empty key. The stored key is the task's own: its name (which holds no
// space), a space and the key.
func debounceOf(d *Debounce, s Submission) (db *store.Debounce, err error) {
	key := s.Target
	if d.Key != nil {
		defer func() {
			if p := recover(); p != nil {
				db, err = nil, fmt.Errorf("%w: the Debounce Key of task %q panicked: %v", ErrInvalid, s.Task, p)
			}
		}()
		key = d.Key(s)
	}
	if key == "" {
		return nil, nil
	}
	if err := validText("debounce key", key, MaxIdempotencyKey); err != nil {
		return nil, err
	}
	return &store.Debounce{Key: s.Task + " " + key, Period: d.Period, MaxWait: d.MaxWait}, nil
}

// estimate calls a task's Estimate, reporting a panic as an error (of the
// submission: ErrInvalid) instead of panicking through Submit.
func estimate(f func(Submission) Costs, s Submission) (costs Costs, err error) {
	defer func() {
		if p := recover(); p != nil {
			costs, err = nil, fmt.Errorf("%w: the Estimate of task %q panicked: %v", ErrInvalid, s.Task, p)
		}
	}()
	return f(s), nil
}
