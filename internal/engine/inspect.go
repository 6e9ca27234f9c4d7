package engine

import (
	"context"
	"fmt"
	"slices"
)

// What tests see of the engine: its internals' counts, and a check of its
// bookkeeping (Hooks.CheckInvariants).

// State is a snapshot of the engine's internals, for tests.
type State struct {
	Live, Inflight, Claims, Keyed, Lanes, Units int
	// Drains is the number of Drain calls waiting for a reply.
	Drains int
	// Reads is the number of store reads not yet answered.
	Reads int
	// NoParams is the length of the list of units indexed without params;
	// WithoutParams the number of such units still indexed.
	NoParams, WithoutParams int
}

// Inspect returns a snapshot taken on the dispatcher goroutine, or ctx's
// error (or ErrShutdown once the dispatcher has exited).
func (d *Engine) Inspect(ctx context.Context) (State, error) {
	st, ok, err := ask(ctx, d, func(d *Engine) State {
		return State{Live: d.live, Inflight: d.inflight, Claims: d.claims, Keyed: len(d.keyed), Lanes: len(d.lanes),
			Units: len(d.units), Drains: len(d.drains), Reads: d.pending, NoParams: d.noParams.len(), WithoutParams: d.withoutParams}
	})
	if !ok && err == nil {
		err = ErrShutdown
	}
	return st, err
}

// verify checks that every resource's count matches the runs holding it:
// a running unit holds all of its resources and a waiting one holds none.
func (d *Engine) verify() error {
	if d.inflight > d.cfg.MaxConcurrent {
		return fmt.Errorf("inflight %d > MaxConcurrent %d", d.inflight, d.cfg.MaxConcurrent)
	}
	holders := map[*resource]int{}
	for _, r := range d.runs {
		if r.over() {
			return fmt.Errorf("run of %s in the run table in state %d", r.pub.ID, r.state)
		}
		if r.leader != nil {
			continue // its batch's leader holds the batch's slots
		}
		for _, res := range r.lane.resources {
			holders[res]++
		}
	}
	for r := range d.held {
		if r.state != runHolding || !r.lane.task.spec.HoldSlotsUntilReturn {
			return fmt.Errorf("run of %s in the held set but not holding", r.pub.ID)
		}
		for _, res := range r.lane.resources {
			holders[res]++
		}
	}
	for _, g := range d.ghosts {
		if g.lane != nil {
			for _, res := range g.lane.resources {
				holders[res]++
			}
		}
	}
	check := func(res *resource) error {
		if res.Active != holders[res] {
			return fmt.Errorf("%s: active %d, but %d running or holding units hold it", res.name, res.Active, holders[res])
		}
		if res.Limit > 0 && res.Active > res.Limit {
			return fmt.Errorf("%s: active %d > limit %d", res.name, res.Active, res.Limit)
		}
		if res.Window != nil && res.Window.Used(d.now()) > res.Window.Limit() {
			return fmt.Errorf("%s: window over its limit", res.name)
		}
		return nil
	}
	for _, t := range d.tasks {
		if err := check(t.cap); err != nil {
			return err
		}
	}
	for _, name := range sortedNames(d.services) {
		if err := check(d.services[name]); err != nil {
			return err
		}
	}
	for _, res := range d.keyed {
		if err := check(res); err != nil {
			return err
		}
	}
	for _, l := range d.lanes {
		if l.inReady && l.parkedOn != nil {
			return fmt.Errorf("lane %q both ready and parked", l.key)
		}
		if l.parkedOn != nil && !slices.Contains(l.resources, l.parkedOn) {
			return fmt.Errorf("lane %q parked on a resource it does not use", l.key)
		}
	}
	return nil
}
