package runcuetype

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/runcue/runcue/store"
)

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
func (p Period) String() string {
	switch p {
	case PerDay:
		return "day"
	case PerMonth:
		return "month"
	}
	return "Period(?)"
}

// Bounds returns the period of kind p that holds wall, in loc: its start
// and its end, the first instants of their days. That is local midnight,
// or, where a daylight-saving change skips midnight (the clocks go from
// 23:59:59 to 01:00), the instant of the change.
func (p Period) Bounds(loc *time.Location, wall time.Time) (start, end time.Time) {
	t := wall.In(loc)
	y, m, d := t.Date()
	if p == PerMonth {
		return dayStart(y, m, 1, loc), dayStart(y, m+1, 1, loc)
	}
	return dayStart(y, m, d, loc), dayStart(y, m, d+1, loc)
}

// dayStart returns the first instant of day y-m-d in loc (the date is
// normalized as time.Date does).
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if _, _, day := t.Date(); day != time.Date(y, m, d, 12, 0, 0, 0, loc).Day() {
		// Midnight does not exist that day: time.Date gave an instant of
		// the day before, in the zone that ends when the day begins.
		_, t = t.ZoneBounds()
	}
	return t
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

// MarshalJSON encodes b as {"requests", "per" ("day" or "month"),
// "location" (a time zone name)}.
func (b Budget) MarshalJSON() ([]byte, error) {
	loc := b.Location
	if loc == nil {
		loc = time.UTC
	}
	return json.Marshal(store.BudgetDef{Requests: b.Requests, Per: b.Per.String(), Location: loc.String()})
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
