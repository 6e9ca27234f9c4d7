package engine

import (
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Limits as stored (store.ServiceDef) and what the dispatcher derives
// from them.

// margin and hold are the stored definition's (store.ServiceDef).
func margin(s store.ServiceDef) time.Duration { return s.MarginInForce() }
func hold(s store.ServiceDef) time.Duration   { return s.Hold() }

// period returns a stored budget's period.
func period(b store.BudgetDef) broker.Period {
	if b.Per == "month" {
		return broker.Month
	}
	return broker.Day
}

// location returns a stored budget's time zone.
func location(b store.BudgetDef) *time.Location { return b.Loc() }
