package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Calendar budgets: a service's quota per day or month of a time zone,
// the one limit that follows the wall clock.

// Period is the calendar period of a Budget.
type Period uint8

// The periods.
const (
	// PerDay: from one local midnight to the next (23 or 25 hours across a
	// daylight-saving change; where the change skips midnight, the day
	// begins at the change).
	PerDay Period = iota + 1
	// PerMonth: from the first instant of the 1st to that of the next 1st.
	PerMonth
)

// String returns "day" or "month".
func (p Period) String() string { return broker.Period(p).String() }

// Bounds returns the period of kind p that holds wall, in loc: its start
// and its end, the first instants of their days. That is local midnight,
// or, where a daylight-saving change skips midnight (the clocks go from
// 23:59:59 to 01:00), the instant of the change.
func (p Period) Bounds(loc *time.Location, wall time.Time) (start, end time.Time) {
	return broker.Period(p).Bounds(loc, wall)
}

// def is b's stored form.
func (b Budget) def() store.BudgetDef {
	return store.BudgetDef{Requests: b.Requests, Per: b.Per.String(), Location: b.loc().String()}
}

// budgetFrom reads a stored budget (a location that no longer loads reads
// as UTC).
func budgetFrom(d store.BudgetDef) Budget {
	b := Budget{Requests: d.Requests, Per: PerDay}
	if d.Per == "month" {
		b.Per = PerMonth
	}
	if d.Location != "" && d.Location != "UTC" {
		b.Location = d.Loc()
	}
	return b
}

// Budget caps the requests to a service per calendar period of a time
// zone: "10,000 requests per day, Pacific time". A request is a handler
// start, counted at its wall-clock instant (Work.Started). The count
// starts again when the wall clock enters the next period in Location:
// this is the one place where runcue lets the wall clock, not the
// monotonic clock, decide, because a provider resets its quota at midnight
// on its own clock. If the system's clock is set back into a period
// already over, that period is not reopened: the budget waits for the
// next.
//
// A spent budget refuses the service (Explain: budget_exhausted, until the
// period ends) and emits a budget_exhausted event once per period. A
// service may have several budgets (a day and a month); a rolling window
// (RateLimit, RateWindow) may sit beside them. Budgets of a service with
// ServiceKeys instances apply to each instance. Counted starts are logged
// in the database, so that a restart in the middle of a period counts the
// starts before it (the ones logged since the budget was set).
type Budget struct {
	// Requests is the number of handler starts allowed per period.
	Requests int
	// Per is the period: PerDay or PerMonth.
	Per Period
	// Location is the time zone whose calendar delimits the periods, as
	// time.LoadLocation returns it (it is stored by name). Default UTC.
	Location *time.Location
}

func (b Budget) loc() *time.Location {
	if b.Location == nil {
		return time.UTC
	}
	return b.Location
}

func (b Budget) validate() error {
	switch {
	case b.Requests <= 0:
		return fmt.Errorf("%w: a budget needs a positive number of Requests", ErrInvalid)
	case b.Per != PerDay && b.Per != PerMonth:
		return fmt.Errorf("%w: a budget's period must be PerDay or PerMonth", ErrInvalid)
	}
	if b.Location != nil {
		if _, err := time.LoadLocation(b.Location.String()); err != nil {
			return fmt.Errorf("%w: budget location %q cannot be loaded by name (use time.LoadLocation): %v", ErrInvalid, b.Location, err)
		}
	}
	return nil
}

// MarshalJSON encodes b as {"requests", "per" ("day" or "month"),
// "location" (a time zone name)}.
func (b Budget) MarshalJSON() ([]byte, error) {
	return json.Marshal(b.def())
}

// UnmarshalJSON decodes the form MarshalJSON writes.
func (b *Budget) UnmarshalJSON(data []byte) error {
	var j store.BudgetDef
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*b = Budget{Requests: j.Requests}
	switch j.Per {
	case "day":
		b.Per = PerDay
	case "month":
		b.Per = PerMonth
	default:
		return fmt.Errorf("runcue: budget period %q", j.Per)
	}
	if j.Location != "" && j.Location != "UTC" {
		loc, err := time.LoadLocation(j.Location)
		if err != nil {
			return fmt.Errorf("runcue: budget location: %w", err)
		}
		b.Location = loc
	}
	return nil
}

// BudgetStatus reports a budget in its current period.
type BudgetStatus struct {
	Budget Budget `json:"budget"`
	// Used counts the requests of the current period, including those
	// decided whose handlers have not started yet.
	Used int `json:"used"`
	// PeriodStart and Resets delimit the current period.
	PeriodStart time.Time `json:"period_start"`
	Resets      time.Time `json:"resets"`
	// Exhausted reports that no request is left until Resets.
	Exhausted bool `json:"exhausted,omitempty"`
}

// storedBudgets reports a service's budgets from the database, for a Cue
// that does not own it: the logged starts of each current period.
func (c *Cue) storedBudgets(ctx context.Context, name string, s Service) ([]BudgetStatus, error) {
	if len(s.Budgets) == 0 {
		return nil, nil
	}
	wall := c.clock.Now()
	margin := s.margin()
	var since time.Time
	for _, spec := range s.Budgets {
		start, _ := spec.Per.Bounds(spec.loc(), wall)
		if at := start.Add(-margin); since.IsZero() || at.Before(since) {
			since = at
		}
	}
	log, err := c.requestLog(ctx, name, since)
	if err != nil {
		return nil, err
	}
	out := make([]BudgetStatus, 0, len(s.Budgets))
	for _, spec := range s.Budgets {
		start, end := spec.Per.Bounds(spec.loc(), wall)
		st := BudgetStatus{Budget: spec, PeriodStart: start, Resets: end}
		for _, at := range log {
			if !at.Add(margin).Before(start) && at.Before(end) {
				st.Used++
			}
		}
		st.Exhausted = st.Used >= spec.Requests
		out = append(out, st)
	}
	return out, nil
}
