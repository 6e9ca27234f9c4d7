package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"

	"github.com/runcue/runcue"
)

// Tenant is one of the workload's tenants: its share of the submissions
// (Load, a fraction of the services' capacity) and its Weight in the
// tenant class's fair shares (default 1).
type Tenant struct {
	Name   string  `yaml:"name" json:"name"`
	Load   float64 `yaml:"load" json:"load"`
	Weight float64 `yaml:"weight,omitempty" json:"weight,omitempty"`
}

// tenantClass is the keyed service every unit of a workload with tenants
// uses: "tenant:<name>".
const tenantClass = "tenant"

// tenantOf returns the tenant of unit id: drawn from its ID and the seed,
// in proportion to the tenants' loads ("" without tenants).
func (w *Workload) tenantOf(seed uint64, id string) string {
	if len(w.Tenants) == 0 {
		return ""
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "tenant/%d/%s", seed, id)
	var sum float64
	for _, t := range w.Tenants {
		sum += t.Load
	}
	x := float64(h.Sum64()>>11) / (1 << 53) * sum
	for _, t := range w.Tenants {
		if x < t.Load {
			return t.Name
		}
		x -= t.Load
	}
	return w.Tenants[len(w.Tenants)-1].Name
}

// registerTenants registers the tenant class, sharing by TenantShare, and
// each tenant's weight (an override of its key).
func (e *engine) registerTenants(c *runcue.Cue) error {
	w := e.cfg.Workload
	if len(w.Tenants) == 0 {
		return nil
	}
	if err := c.Service(tenantClass, runcue.Service{Share: w.TenantShare}); err != nil {
		return err
	}
	for _, t := range w.Tenants {
		if t.Weight > 0 && t.Weight != 1 {
			if err := c.SetService(context.Background(), tenantClass+":"+t.Name, runcue.Service{Weight: t.Weight}); err != nil {
				return err
			}
		}
	}
	return nil
}

// serviceKeys returns the task option that puts each unit under its
// tenant's key; nil without tenants.
func (e *engine) serviceKeys() func(*runcue.Work) []string {
	if len(e.cfg.Workload.Tenants) == 0 {
		return nil
	}
	return func(w *runcue.Work) []string {
		return []string{tenantClass + ":" + e.cfg.Workload.tenantOf(e.cfg.Seed, w.ID)}
	}
}

// TenantShare is what a tenant got of the services its units used, as the
// mocks counted arrivals from a quarter of the submissions' span to their
// end (all tenants have work waiting then, in a scenario that offers each
// more than its share): Amount (tokens, or calls), its Share of the
// total, and the share its weight gives it (Expected).
type TenantShare struct {
	Amount   int64   `json:"amount"`
	Share    float64 `json:"share"`
	Expected float64 `json:"expected"`
}

// tenantShares measures each tenant's share at the first mock the units
// use (tokens when it meters them, unless the class shares requests).
func (e *engine) tenantShares() map[string]TenantShare {
	w := e.cfg.Workload
	if len(w.Tenants) == 0 || len(w.TaskTypes) == 0 {
		return nil
	}
	ms := e.taskMocks(w.TaskTypes[0])
	if len(ms) == 0 {
		return nil
	}
	m := ms[0]
	from, to := e.epoch.Add(m.until/4), e.epoch.Add(m.until)
	amount := map[string]int64{}
	var total int64
	for _, c := range m.sortedCalls() {
		if !c.start.After(from) || c.start.After(to) || c.refused {
			continue
		}
		n := int64(1)
		if w.TenantShare != "requests" && m.cfg.Tokens != nil {
			n = c.tokens
		}
		amount[w.tenantOf(e.cfg.Seed, c.unit)] += n
		total += n
	}
	var weights float64
	for _, t := range w.Tenants {
		weights += tenantWeight(t)
	}
	out := map[string]TenantShare{}
	for _, t := range w.Tenants {
		ts := TenantShare{Amount: amount[t.Name], Expected: round4(tenantWeight(t) / weights)}
		if total > 0 {
			ts.Share = round4(float64(ts.Amount) / float64(total))
		}
		out[t.Name] = ts
	}
	return out
}

func tenantWeight(t Tenant) float64 {
	if t.Weight > 0 && !math.IsInf(t.Weight, 0) {
		return t.Weight
	}
	return 1
}

// tenantChecks adds the check that every tenant's share is within 10% of
// what its weight gives it.
func tenantChecks(r *Report, expect func(name string, pass bool, format string, args ...any)) {
	for _, name := range slices.Sorted(maps.Keys(r.Tenants)) {
		ts := r.Tenants[name]
		expect("tenant_share:"+name, math.Abs(ts.Share/ts.Expected-1) <= 0.1, "%.1f%% of what the tenants used (%d), its weight's share %.1f%% (bound: within 10%% of it)",
			100*ts.Share, ts.Amount, 100*ts.Expected)
	}
}
