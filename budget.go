package runcue

import (
	"context"
	"fmt"
	"time"

	"github.com/runcue/runcue/internal/vocab"
)

// Calendar budgets: a service's quota per day or month of a time zone,
// the one limit that follows the wall clock.

func validateBudget(b Budget) error {
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

// storedBudgets reports a service's budgets from the database, for a Cue
// that does not own it: the logged starts of each current period.
func (c *Cue) storedBudgets(ctx context.Context, name string, s Service) ([]BudgetStatus, error) {
	if len(s.Budgets) == 0 {
		return nil, nil
	}
	wall := c.clock.Now()
	margin := vocab.Margin(s)
	var since time.Time
	for _, spec := range s.Budgets {
		start, _ := spec.Per.Bounds(vocab.Location(spec), wall)
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
		start, end := spec.Per.Bounds(vocab.Location(spec), wall)
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
