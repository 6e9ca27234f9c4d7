package engine

import (
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// Limits as stored (store.ServiceDef) and what the dispatcher derives
// from them.

// margin is the stored definition's (store.ServiceDef).
func margin(s store.ServiceDef) time.Duration { return s.MarginInForce() }

// chargeOf reads a stored charge policy (store.MeterDef.Charge).
func chargeOf(s string) rt.Charge {
	switch s {
	case "larger":
		return rt.ChargeLarger
	case "estimate":
		return rt.ChargeEstimate
	}
	return rt.ChargeActual
}

// period returns a stored budget's period.
func period(b store.BudgetDef) rt.Period {
	if b.Per == "month" {
		return rt.PerMonth
	}
	return rt.PerDay
}

// location returns a stored budget's time zone.
func location(b store.BudgetDef) *time.Location { return b.Loc() }
