package engine

import (
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Limits as stored (store.ServiceDef) and what the dispatcher derives
// from them.

// margin is the stored definition's (store.ServiceDef).
func margin(s store.ServiceDef) time.Duration { return s.MarginInForce() }

// chargeOf reads a stored charge policy (store.MeterDef.Charge).
func chargeOf(s string) broker.Charge {
	switch s {
	case "larger":
		return broker.ChargeLarger
	case "estimate":
		return broker.ChargeEstimate
	}
	return broker.ChargeActual
}

// period returns a stored budget's period.
func period(b store.BudgetDef) broker.Period {
	if b.Per == "month" {
		return broker.Month
	}
	return broker.Day
}

// location returns a stored budget's time zone.
func location(b store.BudgetDef) *time.Location { return b.Loc() }
