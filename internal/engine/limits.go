package engine

import (
	"sync"
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Limits as stored (store.ServiceDef) and what the dispatcher derives
// from them.

// DefaultMargin is a service's Margin when it sets none (runcue's
// DefaultMargin).
const DefaultMargin = 10 * time.Millisecond

// margin returns the margin in force: DefaultMargin for zero, none for a
// negative one.
func margin(s store.ServiceDef) time.Duration {
	switch {
	case s.Margin == 0:
		return DefaultMargin
	case s.Margin < 0:
		return 0
	}
	return s.Margin
}

// hold is how long a start holds its place in s's rate window: the window
// and the margin (zero without a window).
func hold(s store.ServiceDef) time.Duration {
	if s.RateLimit == 0 {
		return 0
	}
	return s.RateWindow + margin(s)
}

// period returns a stored budget's period.
func period(b store.BudgetDef) broker.Period {
	if b.Per == "month" {
		return broker.Month
	}
	return broker.Day
}

// locations caches the time zones of budgets by name.
var locations sync.Map // string -> *time.Location

// location returns a stored budget's time zone (UTC when it cannot be
// loaded: runcue refuses such a budget when it is registered).
func location(b store.BudgetDef) *time.Location {
	if b.Location == "" || b.Location == "UTC" {
		return time.UTC
	}
	if l, ok := locations.Load(b.Location); ok {
		return l.(*time.Location)
	}
	l, err := time.LoadLocation(b.Location)
	if err != nil {
		l = time.UTC
	}
	locations.Store(b.Location, l)
	return l
}
