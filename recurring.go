package runcue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/runcue/runcue/internal/recur"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// Schedule submits a unit at each period of its Timing: hourly, every
// 90 seconds, at 02:30 every night in Europe/Berlin. Schedules are stored
// in the database; whichever process owns the queue submits each
// period's unit, exactly once, in the transaction that records the
// period (a takeover, a crash or a second process never submits it
// twice: the unit's idempotency key is the schedule's name and the
// period's key). A unit a schedule submitted says so in Explain.
type Schedule struct {
	// Submission is the unit each period submits. Its Task is required;
	// ID, IdempotencyKey, RunAt, DependsOn and DependencyTimeout must be
	// empty (each period's unit gets its own ID and key). A nil Cost
	// takes the task's Estimate at each period, in the owner.
	Submission Submission
	// Timing says when the periods are due; see Timing for daylight
	// saving time.
	Timing Timing
	// Missed says what to do with the periods that fell due while no
	// owner ran the schedule (a stop, a crash) or while it was paused:
	// MissedLatest (the default) submits the latest of them once,
	// MissedSkip none, MissedEach each of the latest MaxMissed (default
	// 10). Skipped periods are recorded (EventScheduleSkipped).
	Missed    Missed
	MaxMissed int
	// SkipIfRunning skips a period (recorded, with reason "overlap")
	// while the unit of the previous one is still queued or running.
	SkipIfRunning bool
}

// Errors of schedules.
var (
	// ErrUnknownSchedule: no schedule of that name is stored.
	ErrUnknownSchedule = store.ErrUnknownSchedule
)

// MaxScheduleName is the longest schedule name, in bytes.
const MaxScheduleName = 200

func validScheduleName(name string) error {
	switch {
	case name == "" || len(name) > MaxScheduleName:
		return fmt.Errorf("%w: a schedule name has 1 to %d bytes", ErrInvalid, MaxScheduleName)
	case strings.ContainsFunc(name, func(r rune) bool { return r == ':' || unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Errorf("%w: schedule name %q contains ':', whitespace or a control character", ErrInvalid, name)
	}
	return nil
}

// Schedule registers schedule name, or updates its definition. The first
// period due is the first after the registration (or after a change of
// definition); registering the same definition again changes nothing,
// so a program registers its schedules at every start. A pause or a
// timing set at run time (PauseSchedule, RetimeSchedule, from any
// process) holds across restarts until the definition registered here
// changes. Any Cue may register: the owner runs the schedules stored.
func (c *Cue) Schedule(ctx context.Context, name string, s Schedule) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	def, err := c.scheduleDef(ctx, name, s)
	if err != nil {
		return err
	}
	b, err := json.Marshal(def)
	if err != nil {
		return err
	}
	return c.putSchedule(ctx, &store.PutSchedule{Name: name, Def: b, At: c.clock.Now()})
}

// scheduleDef checks s and returns it as stored.
func (c *Cue) scheduleDef(ctx context.Context, name string, s Schedule) (recur.Def, error) {
	sub := s.Submission
	switch {
	case validScheduleName(name) != nil:
		return recur.Def{}, validScheduleName(name)
	case sub.ID != "" || sub.IdempotencyKey != "" || !sub.RunAt.IsZero() || len(sub.DependsOn) > 0 || sub.DependencyTimeout != 0:
		return recur.Def{}, fmt.Errorf("%w: a schedule's Submission has no ID, IdempotencyKey, RunAt, DependsOn or DependencyTimeout", ErrInvalid)
	case s.Missed != "" && s.Missed != MissedLatest && s.Missed != MissedSkip && s.Missed != MissedEach:
		return recur.Def{}, fmt.Errorf("%w: Missed %q", ErrInvalid, s.Missed)
	case s.MaxMissed < 0:
		return recur.Def{}, fmt.Errorf("%w: negative MaxMissed", ErrInvalid)
	}
	if _, err := recur.Compile(name, s.Timing); err != nil {
		return recur.Def{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := c.checkTasks(ctx, []Submission{sub}); err != nil {
		return recur.Def{}, err
	}
	u, err := c.unitFor(sub, c.clock.Now())
	if err != nil {
		return recur.Def{}, err
	}
	if err := c.checkCosts(ctx, []*store.Unit{u}); err != nil {
		return recur.Def{}, err
	}
	if sub.Timeout%time.Millisecond != 0 {
		return recur.Def{}, fmt.Errorf("%w: a schedule's Timeout is a whole number of milliseconds", ErrInvalid)
	}
	def := recur.Def{Template: recur.Template{Task: sub.Task, Target: sub.Target, Params: u.Params, TimeoutMS: sub.Timeout.Milliseconds(),
		Retry: u.Retry, Cost: sub.Cost}, Timing: s.Timing, Missed: s.Missed, MaxMissed: s.MaxMissed, SkipIfRunning: s.SkipIfRunning}
	return def, nil
}

// PauseSchedule stops schedule name from submitting until ResumeSchedule.
// The periods that fall due meanwhile are missed (see Schedule.Missed).
// The pause is stored: it holds across restarts, until the registered
// definition changes.
func (c *Cue) PauseSchedule(ctx context.Context, name string) error {
	paused := true
	return c.putSchedule(ctx, &store.PutSchedule{Name: name, Paused: &paused, At: c.clock.Now()})
}

// ResumeSchedule lets a paused schedule submit again.
func (c *Cue) ResumeSchedule(ctx context.Context, name string) error {
	paused := false
	return c.putSchedule(ctx, &store.PutSchedule{Name: name, Paused: &paused, At: c.clock.Now()})
}

// RetimeSchedule gives schedule name a new timing, from now on, in place
// of the registered one; the zero Timing goes back to the registered
// one. Like a pause it is stored, until the registered definition
// changes.
func (c *Cue) RetimeSchedule(ctx context.Context, name string, t Timing) error {
	var b []byte
	if t != (Timing{}) {
		if _, err := recur.Compile(name, t); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		var err error
		if b, err = json.Marshal(t); err != nil {
			return err
		}
	}
	return c.putSchedule(ctx, &store.PutSchedule{Name: name, Timing: &b, At: c.clock.Now()})
}

// DeleteSchedule deletes schedule name. The units it submitted stay.
func (c *Cue) DeleteSchedule(ctx context.Context, name string) error {
	return c.putSchedule(ctx, &store.PutSchedule{Name: name, Delete: true, At: c.clock.Now()})
}

func (c *Cue) putSchedule(ctx context.Context, op *store.PutSchedule) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	res, err := c.w.Do(ctx, op)
	if err != nil {
		return wrapStoreErr(err)
	}
	if res[0].Err != nil {
		return fmt.Errorf("%w: %q", res[0].Err, op.Name)
	}
	if d := c.disp.Load(); d != nil && d.sched != nil {
		d.sched.Reload()
	}
	return nil
}

// Schedules returns the stored schedules, by name, each with its next
// period.
func (c *Cue) Schedules(ctx context.Context) ([]ScheduleStatus, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	recs, err := c.st.Schedules(ctx)
	if err != nil {
		return nil, c.readErr(err)
	}
	out := make([]ScheduleStatus, 0, len(recs))
	for _, rec := range recs {
		s, err := recur.Decode(rec)
		if err != nil {
			// One schedule this runcue cannot read does not hide the others.
			out = append(out, ScheduleStatus{Name: rec.Name, Paused: rec.Paused, Last: rec.LastKey, LastUnit: rec.LastUnit, Error: err.Error()})
			continue
		}
		out = append(out, s.Status())
	}
	return out, nil
}

// fire records one of the owner's firings (recur.Loop's Fire): the
// period's unit, made as Submit makes one, written with the schedule's
// cursor; the running engine is told of the unit.
func (c *Cue) fire(ctx context.Context, epoch int64, f recur.Firing) (store.Result, error) {
	s := f.Schedule
	now := c.clock.Now()
	op := &store.Fire{Epoch: epoch, Schedule: s.Name, Key: f.Period.Key, Nominal: f.Period.Nominal, At: now, Reason: f.Reason,
		Skipped: f.Skipped, FirstSkipped: f.FirstSkipped, Prev: s.LastUnit, SkipIfRunning: s.Def.SkipIfRunning}
	if f.Submit {
		t := s.Def.Template
		sub := Submission{Task: t.Task, Target: t.Target, Timeout: time.Duration(t.TimeoutMS) * time.Millisecond, Cost: t.Cost}
		if len(t.Params) > 0 {
			sub.Params = json.RawMessage(t.Params)
		}
		u, err := c.unitFor(sub, now)
		if err == nil {
			err = c.checkCosts(ctx, []*store.Unit{u})
		}
		switch {
		case errors.Is(err, ErrInvalid) || errors.Is(err, ErrCostTooLarge):
			// The template no longer makes a valid unit (an Estimate that
			// fails, a cost a changed meter refuses): refused as the
			// store refuses a unit, and the loop skips the period.
			return store.Result{Err: err}, nil
		case err != nil:
			return store.Result{}, err // a read failed: the loop tries again
		}
		u.Retry = t.Retry
		u.IdempotencyKey = recur.UnitKey(s.Name, f.Period.Key)
		op.Unit = u
	}
	type out struct {
		res store.Result
		err error
	}
	ch := make(chan out, 1)
	req := &writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
		if err != nil {
			ch <- out{err: err}
			return
		}
		r := res[0]
		if r.Err == nil && op.Unit != nil && len(r.Units) > 0 {
			// The engine hears of the unit as of a Submit's; the schedule's
			// own event is not a unit's end.
			ir := r
			ir.Events = nil
			for _, ev := range r.Events {
				if !strings.HasPrefix(ev.Type, "schedule_") {
					ir.Events = append(ir.Events, ev)
				}
			}
			c.inserted([]*store.Unit{op.Unit}, ir)
		}
		ch <- out{res: r}
	}}
	if err := c.w.Submit(req); err != nil {
		return store.Result{}, err
	}
	select {
	case o := <-ch:
		return o.res, o.err
	case <-ctx.Done():
		// The loop is ending (its owner stopped): if a transaction holds
		// the record it may still commit, and the next owner reads it.
		return store.Result{}, c.w.Withdraw(req, ctx.Err())
	}
}
