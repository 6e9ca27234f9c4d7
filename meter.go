package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/runcue/runcue/store"
)

func validateMeter(m Meter) error {
	if err := validName("meter", m.Name); err != nil {
		return err
	}
	switch {
	case m.Name == store.MeterRequests || m.Name == store.MeterCircuit || m.Name == store.MeterAdapt || m.Name == "concurrency":
		return fmt.Errorf("%w: a meter may not be named %q (requests, circuit, adapt and concurrency are runcue's own)", ErrInvalid, m.Name)
	case m.Limit <= 0 || m.Limit > MaxCost:
		return fmt.Errorf("%w: meter %q: Limit %d is not from 1 to %d", ErrInvalid, m.Name, m.Limit, int64(MaxCost))
	case m.Window < time.Millisecond || m.Window > MaxRateWindow:
		return fmt.Errorf("%w: meter %q: Window %v is not from 1ms to %v", ErrInvalid, m.Name, m.Window, MaxRateWindow)
	case m.Charge > ChargeEstimate:
		return fmt.Errorf("%w: meter %q: unknown Charge %d", ErrInvalid, m.Name, uint8(m.Charge))
	case m.MaxLimit < 0 || m.MaxLimit > MaxCost || (m.MaxLimit > 0 && m.MaxLimit < m.Limit):
		return fmt.Errorf("%w: meter %q: MaxLimit %d is not zero nor from Limit (%d) to %d", ErrInvalid, m.Name, m.MaxLimit, m.Limit, int64(MaxCost))
	case m.MaxLimit > 0 && !m.FromProvider:
		return fmt.Errorf("%w: meter %q: MaxLimit caps a limit read from the provider: set FromProvider", ErrInvalid, m.Name)
	}
	return nil
}

// validateMeters checks each meter and that no amount is metered twice,
// by name or alias.
func validateMeters(ms []Meter) error {
	seen := map[string]bool{}
	for _, m := range ms {
		if err := validateMeter(m); err != nil {
			return err
		}
		for j, name := range append([]string{m.Name}, m.Aliases...) {
			if j > 0 {
				if err := validName("meter alias", name); err != nil {
					return err
				}
				if name == store.MeterRequests || name == store.MeterCircuit || name == store.MeterAdapt || name == "concurrency" {
					return fmt.Errorf("%w: meter %q: an alias may not be %q (runcue's own)", ErrInvalid, m.Name, name)
				}
			}
			if seen[name] {
				return fmt.Errorf("%w: two meters of %q (by name or alias)", ErrInvalid, name)
			}
			seen[name] = true
		}
	}
	return nil
}

// validCosts checks a submission's costs: amounts named as meters are,
// from 0 to MaxCost.
func validCosts(cs Costs) error {
	for name, n := range cs {
		if err := validName("meter", name); err != nil {
			return fmt.Errorf("a cost's amount: %w", err)
		}
		if n < 0 || n > MaxCost {
			return fmt.Errorf("%w: Cost of %s %d is not from 0 to %d", ErrInvalid, name, n, int64(MaxCost))
		}
	}
	return nil
}

// checkCosts refuses, before anything of the batch is stored, a unit that
// lacks a cost of an amount its task's services meter, or whose cost can
// never fit one of their limits (ErrCostTooLarge). It reads the limits in
// force (a stored override included) and, for a task registered by another
// process, the services the database says it uses; it reads nothing when
// no unit states a cost and the tasks, all registered here, use no
// metered service.
func (c *Cue) checkCosts(ctx context.Context, units []*store.Unit) error {
	services := make(map[string][]string)
	read := false
	c.mu.Lock()
	for _, u := range units {
		if len(u.Costs) > 0 {
			read = true
		}
		if _, ok := services[u.Task]; ok {
			continue
		}
		t, ok := c.tasks[u.Task]
		if !ok {
			services[u.Task], read = nil, true
			continue
		}
		services[u.Task] = t.Services
		for _, s := range t.Services {
			if svc := c.services[s]; len(svc.Meters) > 0 {
				read = true
			}
		}
	}
	c.mu.Unlock()
	if !read {
		return nil
	}
	recs, err := c.st.Services(ctx)
	if err != nil {
		return c.readErr(err)
	}
	defs := make(map[string]store.ServiceDef, len(recs))
	for _, rec := range recs {
		if def, ok := store.DecodeServiceDef(rec.Override); ok {
			defs[rec.Name] = def
		} else if def, ok := store.DecodeServiceDef(rec.Def); ok {
			defs[rec.Name] = def
		}
	}
	var stored map[string][]byte
	for i, u := range units {
		svcs, ok := services[u.Task]
		if !ok || svcs == nil {
			if stored == nil {
				if stored, err = c.st.Tasks(ctx); err != nil {
					return c.readErr(err)
				}
			}
			var def taskDef
			_ = json.Unmarshal(stored[u.Task], &def)
			svcs = def.Services
			services[u.Task] = svcs
		}
		for _, s := range svcs {
			if err := fits(u, s, defs[s]); err != nil {
				if len(units) > 1 {
					err = fmt.Errorf("submission %d: %w", i, err)
				}
				return err
			}
		}
	}
	return nil
}

// fits checks unit u's costs against the limits def of service name.
func fits(u *store.Unit, name string, def store.ServiceDef) error {
	costs := Costs(u.Costs)
	reqs := int64(1)
	if n, ok := costs[Requests]; ok {
		reqs = n
	}
	if def.RateLimit > 0 && reqs > int64(def.RateLimit) {
		return fmt.Errorf("%w: a cost of %d requests is above %s's RateLimit of %d", ErrCostTooLarge, reqs, name, def.RateLimit)
	}
	for _, b := range def.Budgets {
		if reqs > int64(b.Requests) {
			return fmt.Errorf("%w: a cost of %d requests is above %s's budget of %d per %s", ErrCostTooLarge, reqs, name, b.Requests, b.Per)
		}
	}
	for _, m := range def.Meters {
		n, ok := costs[m.Name]
		limit := m.Limit
		if m.Bucket {
			// What the bucket admits against: Limit less the margin's refill.
			limit -= int64(math.Ceil(float64(m.Limit) * float64(def.MarginInForce()) / float64(m.Window)))
		}
		switch {
		case !ok:
			return fmt.Errorf("%w: task %q uses %s, which meters %s: the unit has no cost of it (Submission.Cost or Task.Estimate)",
				ErrInvalid, u.Task, name, m.Name)
		case n > limit:
			return fmt.Errorf("%w: a cost of %d %s is above %s's limit of %d per %v", ErrCostTooLarge, n, m.Name, name, m.Limit, m.Window)
		}
	}
	return nil
}
