package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/runcue/runcue/store"
)

// Costs are a unit's costs by amount: how many tokens, input tokens,
// bytes or requests one run of it charges the meters that count them
// (Service.Meters; "requests" is what RateLimit and Budgets count, one by
// default). They are fixed at submit (Submission.Cost, else the task's
// Estimate) and stored with the unit, so that a submitter in another
// process, the owner and every later owner charge the same amounts.
type Costs map[string]int64

// MaxCost is the largest cost of one amount a submission may state.
const MaxCost = 1 << 50

// Requests is the amount RateLimit and Budgets count: one per run unless a
// unit's Costs say otherwise.
const Requests = store.MeterRequests

// Meter limits an amount other than requests that a service counts:
// tokens, input or output tokens, bytes, or any name. At most Limit of it
// start within any interval of length Window plus the service's Margin,
// each run counted at its handler's start (Work.Started) at the unit's
// cost of Name, exactly as RateLimit counts requests: logged with the
// claim, rebuilt from the service log by a new owner. A dispatch must fit
// all of its units' costs in every meter of every service it uses, or it
// waits; a unit whose cost is above a meter's Limit can never run and is
// refused at submit (ErrCostTooLarge), or fails with ErrorKind
// cost_too_large when the limit that refuses it (a keyed instance's, or
// one lowered since) was not known then.
//
// A cost is an estimate made before the run. When the handler reports
// what the run used (Work.Used), the start's charge becomes what Charge
// says; a charge lower than the estimate frees the difference at once. The
// limit holds, counted where the service counts, only while every
// estimate is at least the amount the service charges: reserve the most a
// request can use (its max_tokens and its input), not the likely amount.
type Meter struct {
	// Name is the amount counted: a unit's Costs[Name]. Not "requests"
	// (RateLimit counts those) nor "circuit".
	Name string
	// Limit is the most of Name that may start within any Window.
	Limit int64
	// Window is the sliding window's length, from 1 ms to MaxRateWindow.
	Window time.Duration
	// Charge is what a start's charge becomes once its run reports what
	// it used (Work.Used): ChargeActual by default.
	Charge Charge
	// Bucket counts as a continuously refilling bucket instead of a
	// sliding window, for a provider that documents one (Anthropic): it
	// holds Limit and refills Limit per Window, so a full bucket lets a
	// whole Limit start at once and then Limit per Window, where a window
	// lets at most Limit start in any Window. (A window of the same Limit
	// and Window never exceeds such a bucket: it is the safe choice when
	// the provider's shape is unknown.) The margin counts as its refill:
	// the bucket admits as if it held Limit less Margin's refill. A new
	// owner takes the bucket to have been empty a Window and Margin before
	// it took over, and counts what started since.
	Bucket bool
}

// Charge says what a start's charge in a Meter becomes once its handler
// reports the amount the run actually used (Work.Used). A run that
// reports nothing keeps its estimate.
type Charge uint8

const (
	// ChargeActual replaces the estimate with the actual amount: for a
	// provider that charges what was used (output tokens reserved from
	// max_tokens and corrected when the response ends).
	ChargeActual Charge = iota
	// ChargeLarger keeps the larger of the estimate and the actual amount.
	ChargeLarger
	// ChargeEstimate keeps the estimate whatever was used: for a provider
	// that charges at admission (max(max_tokens, estimated input)).
	ChargeEstimate
)

var chargeNames = [...]string{ChargeActual: "actual", ChargeLarger: "larger", ChargeEstimate: "estimate"}

// String returns the policy's name: actual, larger or estimate.
func (c Charge) String() string {
	if int(c) < len(chargeNames) {
		return chargeNames[c]
	}
	return fmt.Sprintf("Charge(%d)", uint8(c))
}

// MarshalText writes the policy's name.
func (c Charge) MarshalText() ([]byte, error) {
	if int(c) >= len(chargeNames) {
		return nil, fmt.Errorf("%w: charge policy %d", ErrInvalid, uint8(c))
	}
	return []byte(c.String()), nil
}

// UnmarshalText reads a policy's name; empty is ChargeActual.
func (c *Charge) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*c = ChargeActual
		return nil
	}
	for i, n := range chargeNames {
		if n == string(b) {
			*c = Charge(i)
			return nil
		}
	}
	return fmt.Errorf("%w: charge policy %q (actual, larger or estimate)", ErrInvalid, b)
}

func (m Meter) validate() error {
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
	case int(m.Charge) >= len(chargeNames):
		return fmt.Errorf("%w: meter %q: unknown Charge %d", ErrInvalid, m.Name, uint8(m.Charge))
	}
	return nil
}

// validateMeters checks each meter and that no amount is metered twice.
func validateMeters(ms []Meter) error {
	for i, m := range ms {
		if err := m.validate(); err != nil {
			return err
		}
		for _, o := range ms[:i] {
			if o.Name == m.Name {
				return fmt.Errorf("%w: two meters of %q", ErrInvalid, m.Name)
			}
		}
	}
	return nil
}

func (m Meter) def() store.MeterDef {
	def := store.MeterDef{Name: m.Name, Limit: m.Limit, Window: m.Window, Bucket: m.Bucket}
	if m.Charge != ChargeActual {
		def.Charge = m.Charge.String()
	}
	return def
}

func meterFrom(def store.MeterDef) Meter {
	m := Meter{Name: def.Name, Limit: def.Limit, Window: def.Window, Bucket: def.Bucket}
	_ = m.Charge.UnmarshalText([]byte(def.Charge)) // an unknown stored policy reads as actual, as the engine reads it
	return m
}

// meterJSON is Meter's JSON form.
type meterJSON struct {
	Name     string `json:"name"`
	Limit    int64  `json:"limit"`
	WindowMS int64  `json:"window_ms"`
	Charge   Charge `json:"charge"`
	Bucket   bool   `json:"bucket,omitempty"`
}

// MarshalJSON writes m in runcue's JSON convention (the window in
// milliseconds).
func (m Meter) MarshalJSON() ([]byte, error) {
	return json.Marshal(meterJSON{m.Name, m.Limit, m.Window.Milliseconds(), m.Charge, m.Bucket})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (m *Meter) UnmarshalJSON(b []byte) error {
	var j meterJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*m = Meter{Name: j.Name, Limit: j.Limit, Window: time.Duration(j.WindowMS) * time.Millisecond, Charge: j.Charge, Bucket: j.Bucket}
	return nil
}

// Observation is what a service said of its limits in one response (see
// Work.Observe).
type Observation struct {
	// Limits are the limits the response named.
	Limits []ObservedLimit
	// Services names the services of the run the response came from;
	// empty: every service of the run with a meter of a named amount
	// (a rate window for "requests").
	Services []string
}

// ObservedLimit is one limit as a response reported it.
type ObservedLimit struct {
	// Name is the amount, as meters name it: "requests" (the rate
	// window), "tokens", "input_tokens", "output_tokens", ...
	Name string
	// Remaining is what the service has left of it; -1 if not reported.
	Remaining int64
	// Reset is how long after the response the limit is whole again; 0
	// if not reported.
	Reset time.Duration
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
