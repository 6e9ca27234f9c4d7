// Package vocab turns runcue's vocabulary (package runcuetype) into the
// stored definitions of package store and back. The root and the engine
// both use it, so that a definition is read one way.
package vocab

import (
	"slices"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
)

// BudgetDef is b's stored form.
func BudgetDef(b rt.Budget) store.BudgetDef {
	return store.BudgetDef{Requests: b.Requests, Per: b.Per.String(), Location: Location(b).String()}
}

// BudgetOf reads a stored budget (a location that no longer loads reads
// as UTC).
func BudgetOf(d store.BudgetDef) rt.Budget {
	b := rt.Budget{Requests: d.Requests, Per: rt.PerDay}
	if d.Per == "month" {
		b.Per = rt.PerMonth
	}
	if d.Location != "" && d.Location != "UTC" {
		b.Location = d.Loc()
	}
	return b
}

// Location is b's time zone: UTC when it names none.
func Location(b rt.Budget) *time.Location {
	if b.Location == nil {
		return time.UTC
	}
	return b.Location
}

// MeterDef is m's stored form.
func MeterDef(m rt.Meter) store.MeterDef {
	def := store.MeterDef{Name: m.Name, Aliases: slices.Clone(m.Aliases), Limit: m.Limit, Window: m.Window, Bucket: m.Bucket,
		FromProvider: m.FromProvider, MaxLimit: m.MaxLimit}
	if m.Charge != rt.ChargeActual {
		def.Charge = m.Charge.String()
	}
	return def
}

// MeterOf reads a stored meter (an unknown charge policy reads as
// actual).
func MeterOf(def store.MeterDef) rt.Meter {
	m := rt.Meter{Name: def.Name, Aliases: slices.Clone(def.Aliases), Limit: def.Limit, Window: def.Window, Bucket: def.Bucket,
		FromProvider: def.FromProvider, MaxLimit: def.MaxLimit}
	_ = m.Charge.UnmarshalText([]byte(def.Charge)) // an unknown stored policy reads as actual, as the engine reads it
	return m
}

// AdaptDef is a's stored form (nil for nil).
func AdaptDef(a *rt.Adaptive) *store.AdaptDef {
	if a == nil {
		return nil
	}
	return &store.AdaptDef{Floor: a.Floor, Decrease: a.Decrease, Increase: a.Increase}
}

// AdaptiveOf reads a stored adaptive configuration (nil for nil).
func AdaptiveOf(d *store.AdaptDef) *rt.Adaptive {
	if d == nil {
		return nil
	}
	return &rt.Adaptive{Floor: d.Floor, Decrease: d.Decrease, Increase: d.Increase}
}

// Margin returns s's margin in force: DefaultMargin for zero, none for a
// negative one.
func Margin(s rt.Service) time.Duration { return store.ServiceDef{Margin: s.Margin}.MarginInForce() }

// Hold is how long a start holds its place in s's rate window.
func Hold(s rt.Service) time.Duration {
	return store.ServiceDef{RateLimit: s.RateLimit, RateWindow: s.RateWindow, Margin: s.Margin}.Hold()
}

// ServiceDef is s's stored form.
func ServiceDef(s rt.Service) store.ServiceDef {
	def := store.ServiceDef{MaxConcurrent: s.MaxConcurrent, RateLimit: s.RateLimit, RateWindow: s.RateWindow,
		CircuitThreshold: s.CircuitThreshold, CircuitTimeout: s.CircuitTimeout, Margin: s.Margin, Pace: s.Pace,
		Adaptive: AdaptDef(s.Adaptive), Share: s.Share, Weight: s.Weight, MinConcurrent: s.MinConcurrent,
		RateFromProvider: s.RateFromProvider, MaxRate: s.MaxRate}
	for _, b := range s.Budgets {
		def.Budgets = append(def.Budgets, BudgetDef(b))
	}
	for _, m := range s.Meters {
		def.Meters = append(def.Meters, MeterDef(m))
	}
	return def
}

// ServiceOf reads a stored definition.
func ServiceOf(def store.ServiceDef) rt.Service {
	s := rt.Service{MaxConcurrent: def.MaxConcurrent, RateLimit: def.RateLimit, RateWindow: def.RateWindow,
		CircuitThreshold: def.CircuitThreshold, CircuitTimeout: def.CircuitTimeout, Margin: def.Margin, Pace: def.Pace,
		Adaptive: AdaptiveOf(def.Adaptive), Share: def.Share, Weight: def.Weight, MinConcurrent: def.MinConcurrent,
		RateFromProvider: def.RateFromProvider, MaxRate: def.MaxRate}
	for _, b := range def.Budgets {
		s.Budgets = append(s.Budgets, BudgetOf(b))
	}
	for _, m := range def.Meters {
		s.Meters = append(s.Meters, MeterOf(m))
	}
	return s
}
