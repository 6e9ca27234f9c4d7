package runcuetype

import (
	"encoding/json"
	"time"
)

// The resource broker, as a user sees it.
//
// Everything a unit needs capacity of before it may start is a resource: a
// task's own cap (Task.MaxConcurrent), a registered service, or a keyed
// instance of a service ("host:example.org" of service "host", created on
// first use and forgotten when idle). A resource admits a dispatch when it
// is not paused, not held by a Retry-After, its circuit lets the dispatch
// through, it has a free concurrency slot and room in its rate window. A
// unit takes all of its resources at once or none. Services and
// MeterStatus is an amount meter of a service now (Service.Meters): Used
// of Limit in the last Window (plus the margin), the dispatches decided
// and not started yet included; Frees is when the oldest start it counts
// leaves the window (zero when it counts none).
type MeterStatus struct {
	Name   string        `json:"name"`
	Used   int64         `json:"used"`
	Limit  int64         `json:"limit"`
	Window time.Duration `json:"-"`
	Frees  time.Time     `json:"frees,omitzero"`
	// Stated: Limit is what the provider stated (Meter.FromProvider),
	// capped by MaxLimit; false while the starting Limit applies.
	Stated bool `json:"stated,omitempty"`
	// Elsewhere is the room, counted in Used, kept for the use of the
	// limit from elsewhere (another program sharing the key, or a limit
	// lower than the meter's) that the service's headers showed:
	// FromElsewhere in the last window, and a tenth more. A bucket also
	// leaves ElsewhereShare of its refill to that use.
	Elsewhere      int64   `json:"elsewhere,omitempty"`
	FromElsewhere  int64   `json:"from_elsewhere,omitempty"`
	ElsewhereShare float64 `json:"elsewhere_share,omitempty"`
}

// MarshalJSON writes the window in milliseconds (window_ms).
func (m MeterStatus) MarshalJSON() ([]byte, error) {
	type plain MeterStatus
	return json.Marshal(struct {
		plain
		WindowMS int64 `json:"window_ms"`
	}{plain(m), m.Window.Milliseconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (m *MeterStatus) UnmarshalJSON(b []byte) error {
	type plain MeterStatus
	var j struct {
		plain
		WindowMS int64 `json:"window_ms"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*m = MeterStatus(j.plain)
	m.Window = time.Duration(j.WindowMS) * time.Millisecond
	return nil
}

// ServiceStatus reports a service's limits and load.
type ServiceStatus struct {
	// Name is the service; Class the service whose limits apply (Name, but
	// for a keyed instance such as "host:example.org", "host").
	Name  string `json:"name"`
	Class string `json:"class"`
	// Limits are the limits in force: the override if one is set
	// (Overridden), else the registered ones, with the limits the provider
	// stated (Meter.FromProvider, Service.RateFromProvider) in place of
	// their starting values (RateStated; MeterStatus.Stated).
	Limits     Service `json:"limits"`
	Overridden bool    `json:"overridden,omitempty"`
	RateStated bool    `json:"rate_stated,omitempty"`
	// Active is the number of running units holding the service.
	Active int `json:"active"`
	// Waiting is the number of groups of queued units waiting for this
	// service in particular (the units of one task type with one set of
	// keyed services are one group: they wait in submission and priority
	// order, and the group's first is what the service refuses);
	// WaitingUnits the units in them.
	Waiting      int `json:"waiting,omitempty"`
	WaitingUnits int `json:"waiting_units,omitempty"`
	// InWindow is the number of handler starts in the current rate window,
	// plus the dispatches decided whose handlers have not started yet.
	InWindow int `json:"in_window,omitempty"`
	// Circuit is the circuit breaker state; CircuitOpenUntil when an open
	// circuit admits its probe.
	Circuit          CircuitState `json:"circuit"`
	CircuitOpenUntil time.Time    `json:"circuit_open_until,omitzero"`
	// Paused reports PauseService.
	Paused bool `json:"paused,omitempty"`
	// Budgets report the calendar budgets (Limits.Budgets) in their
	// current periods. A class's keyed instances each have their own; they
	// are not folded in here.
	Budgets []BudgetStatus `json:"budgets,omitempty"`
	// Meters report the amount meters (Limits.Meters) now, in the owner.
	Meters []MeterStatus `json:"meters,omitempty"`
	// Unmatched lists, in the owner, the amounts its runs reported
	// (Work.Used, Work.Observe, httplimit.Report) that no meter of the
	// service counts by name or alias (Meter.Aliases), so that runcue
	// ignored them: a meter named "llm_tokens" does not take a report of
	// "tokens" unless it lists the alias. "requests" is listed when the
	// service has no RateLimit to take a reading of requests.
	Unmatched []string `json:"unmatched,omitempty"`
	// Adaptive reports the adaptive limits (Limits.Adaptive): each in
	// force beside its configured value, and the overloads behind them.
	// Limits and Meters state the configured limits; a meter's Limit in
	// Meters is the one in force.
	Adaptive *AdaptiveStatus `json:"adaptive,omitempty"`
	// BlockedUntil is set while a Retry-After holds the service.
	BlockedUntil time.Time `json:"blocked_until,omitzero"`
	// NextCapacity is when the service may next admit a dispatch: now if it
	// may, zero if only an event (a run ending, a resume) can free it.
	NextCapacity time.Time `json:"next_capacity,omitzero"`
	// Keys counts a class's keyed instances: in the owner those in memory,
	// elsewhere those with starts in the window or a stored state.
	// KeysActive and KeysWaiting are the units running on them and the
	// groups waiting for them (the owner's figures). Each instance has the
	// class's limits of its own, so these are not measured against Limits:
	// Active, Waiting and InWindow are the class's own (units that list
	// the service in Task.Services), and ServiceStatus of an instance
	// ("host:example.org") reports its own. OpenKeys and BlockedKeys count
	// the instances with an open circuit or held by a Retry-After.
	Keys        int `json:"keys,omitempty"`
	KeysActive  int `json:"keys_active,omitempty"`
	KeysWaiting int `json:"keys_waiting,omitempty"`
	OpenKeys    int `json:"open_keys,omitempty"`
	BlockedKeys int `json:"blocked_keys,omitempty"`
	// PausedKeys counts a class's keyed instances paused on their own
	// (PauseService("host:example.org")), live ones in the owner, stored
	// ones elsewhere.
	PausedKeys int `json:"paused_keys,omitempty"`
}

// Concurrency is the concurrency cap in force: an adaptive service's
// effective one (Adaptive), else Limits.MaxConcurrent; 0 for none.
func (s ServiceStatus) Concurrency() int {
	return int(s.inForce("concurrency", int64(s.Limits.MaxConcurrent)))
}

// Rate is the rate limit in force per Limits.RateWindow: an adaptive
// service's effective one (Adaptive), else Limits.RateLimit; 0 for none.
func (s ServiceStatus) Rate() int {
	return int(s.inForce(Requests, int64(s.Limits.RateLimit)))
}

func (s ServiceStatus) inForce(limit string, configured int64) int64 {
	if s.Adaptive != nil && configured > 0 {
		for _, l := range s.Adaptive.Limits {
			if l.Limit == limit {
				return l.Effective
			}
		}
	}
	return configured
}

// CircuitShown is the circuit's state as an operator reads it: "off"
// for a service without a breaker (no CircuitThreshold), else its state.
func (s ServiceStatus) CircuitShown() string {
	if s.Limits.CircuitThreshold == 0 {
		return "off"
	}
	return string(s.Circuit)
}
