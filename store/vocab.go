package store

import (
	"encoding/json"
	"sync"
	"time"
)

// The persisted vocabulary: the event types and the shape of the JSON a
// runcue stores in an event's Data, a service's Def and Override and a
// unit's Retry. A backend keeps them as opaque strings and bytes; runcue's
// engine writes them and its public API reads them, so they are defined
// once, here.

// Event types. The strings are stable: logs, UIs and stored events key on
// them.
const (
	TypeWorkQueued          = "work_queued"
	TypeWorkStarted         = "work_started"
	TypeWorkCompleted       = "work_completed"
	TypeWorkSkipped         = "work_skipped"
	TypeWorkFailed          = "work_failed"
	TypeWorkRetrying        = "work_retrying"
	TypeWorkCancelled       = "work_cancelled"
	TypeWorkCancelRequested = "work_cancel_requested"
	TypeWorkRecovered       = "work_recovered"
	TypeWorkRequeued        = "work_requeued"
	TypeWorkProgress        = "work_progress"
	TypeStoreFailed         = "store_failed"
	TypeStoreUnavailable    = "store_unavailable"
	TypeStoreRecovered      = "store_recovered"
	TypeOwnershipTaken      = "ownership_taken"
	TypeOwnershipLost       = "ownership_lost"
	TypeServiceStatus       = "service_status"
	TypeQueueStatus         = "queue_status"
	TypeGap                 = "gap"
	TypeBackpressureActive  = "backpressure_active"
	TypeBackpressureCleared = "backpressure_cleared"
	TypeBudgetExhausted     = "budget_exhausted"
	TypeLimitAdapted        = "limit_adapted"
	TypeLimitStated         = "limit_stated"
	TypeTaskChanged         = "task_changed"
	TypeQueueChanged        = "queue_changed"
	TypeOwnerAsked          = "owner_asked"
	TypeOwnerAnswered       = "owner_answered"
	TypeServiceChanged      = "service_changed"
	TypeScheduleSubmitted   = "schedule_submitted"
	TypeScheduleSkipped     = "schedule_skipped"
	TypeScheduleChanged     = "schedule_changed"
)

// EventData is the Data of a work event: why it failed, whether it will
// run again and when, why it was skipped, cancelled or requeued. Fields
// left zero are omitted.
type EventData struct {
	Error        string `json:"error,omitempty"`
	ErrorKind    string `json:"error_kind,omitempty"`
	WillRetry    bool   `json:"will_retry,omitempty"`
	NextAttempt  int64  `json:"next_attempt,omitempty"` // Unix ns
	Reason       string `json:"reason,omitempty"`
	Prerequisite string `json:"prerequisite,omitempty"`
	// Services are the services a Retry-After held (work_retrying).
	Services []string `json:"services,omitempty"`
}

// Encode returns d's JSON, or nil when every field is zero.
func (d EventData) Encode() []byte {
	if d.Error == "" && d.ErrorKind == "" && !d.WillRetry && d.NextAttempt == 0 && d.Reason == "" && d.Prerequisite == "" &&
		len(d.Services) == 0 {
		return nil
	}
	b, _ := json.Marshal(d)
	return b
}

// ServiceDef is a service's limits as stored (ServiceRecord.Def and
// Override): durations in nanoseconds. Its zero values mean unlimited (a
// Margin of zero the default, a negative one none).
type ServiceDef struct {
	MaxConcurrent    int           `json:"max_concurrent,omitempty"`
	RateLimit        int           `json:"rate_limit,omitempty"`
	RateWindow       time.Duration `json:"rate_window,omitempty"`
	CircuitThreshold int           `json:"circuit_threshold,omitempty"`
	CircuitTimeout   time.Duration `json:"circuit_timeout,omitempty"`
	Budgets          []BudgetDef   `json:"budgets,omitempty"`
	Margin           time.Duration `json:"margin,omitempty"`
	Pace             bool          `json:"pace,omitempty"`
	Meters           []MeterDef    `json:"meters,omitempty"`
	Adaptive         *AdaptDef     `json:"adaptive,omitempty"`
	Share            string        `json:"share,omitempty"`
	Weight           float64       `json:"weight,omitempty"`
	MinConcurrent    int           `json:"min_concurrent,omitempty"`
	// RateFromProvider and MaxRate: see runcuetype.Service.
	RateFromProvider bool `json:"rate_from_provider,omitempty"`
	MaxRate          int  `json:"max_rate,omitempty"`
}

// AdaptDef makes a service's limits adaptive: each lowered to Decrease of
// itself by an overload, raised by Increase of its configured limit per
// window's worth of successes, never below Floor of it (fractions; zero
// means the default: see DefaultAdapt).
type AdaptDef struct {
	Floor    float64 `json:"floor,omitempty"`
	Decrease float64 `json:"decrease,omitempty"`
	Increase float64 `json:"increase,omitempty"`
}

// DefaultAdapt are the fractions an AdaptDef's zero fields take.
var DefaultAdapt = AdaptDef{Floor: 0.1, Decrease: 0.8, Increase: 0.02}

// InForce returns a with its zero fields defaulted.
func (a AdaptDef) InForce() AdaptDef {
	if a.Floor == 0 {
		a.Floor = DefaultAdapt.Floor
	}
	if a.Decrease == 0 {
		a.Decrease = DefaultAdapt.Decrease
	}
	if a.Increase == 0 {
		a.Increase = DefaultAdapt.Increase
	}
	return a
}

// MeterDef is a meter of an amount other than requests as stored: at most
// Limit of Name in any Window (plus the margin), or with Bucket a bucket
// of Limit refilling Limit per Window; each start charged the unit's cost
// of Name, replaced per Charge ("" for the actual amount, "larger",
// "estimate") once the run reports what it used.
type MeterDef struct {
	Name    string        `json:"name"`
	Aliases []string      `json:"aliases,omitempty"`
	Limit   int64         `json:"limit"`
	Window  time.Duration `json:"window"`
	Charge  string        `json:"charge,omitempty"`
	Bucket  bool          `json:"bucket,omitempty"`
	// FromProvider and MaxLimit: see runcuetype.Meter.
	FromProvider bool  `json:"from_provider,omitempty"`
	MaxLimit     int64 `json:"max_limit,omitempty"`
}

// Meter returns def's meter of amount name, if it has one.
func (def ServiceDef) Meter(name string) (MeterDef, bool) {
	for _, m := range def.Meters {
		if m.Name == name {
			return m, true
		}
	}
	return MeterDef{}, false
}

// BudgetDef is a calendar budget as stored: Requests per Per ("day" or
// "month") of the time zone named Location ("" or "UTC" for UTC).
type BudgetDef struct {
	Requests int    `json:"requests"`
	Per      string `json:"per"`
	Location string `json:"location"`
}

// DefaultMargin is a service's Margin when it sets none (runcue's
// DefaultMargin).
const DefaultMargin = 10 * time.Millisecond

// MarginInForce returns the margin in force: DefaultMargin for zero, none
// for a negative one.
func (def ServiceDef) MarginInForce() time.Duration {
	switch {
	case def.Margin == 0:
		return DefaultMargin
	case def.Margin < 0:
		return 0
	}
	return def.Margin
}

// Hold is how long a start holds its place in def's rate window: the
// window and the margin (zero without a window).
func (def ServiceDef) Hold() time.Duration {
	if def.RateLimit == 0 {
		return 0
	}
	return def.RateWindow + def.MarginInForce()
}

// LogHold is how long a start logged for def counts in any of its
// windows, the rate window's or an amount meter's, margin included; zero
// if it has none.
func (def ServiceDef) LogHold() time.Duration {
	h := def.Hold()
	for _, m := range def.Meters {
		h = max(h, m.Window+def.MarginInForce())
	}
	return h
}

// locations caches the time zones of budgets by name: time.LoadLocation
// reads the zone database at every call.
var locations sync.Map // string -> *time.Location

// Loc returns the budget's time zone: UTC for "" and "UTC", and for a name
// that does not load (runcue refuses such a budget when it is registered).
func (b BudgetDef) Loc() *time.Location {
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

// DecodeServiceDef reads a stored definition or override; ok is false for
// an empty or unreadable one.
func DecodeServiceDef(raw []byte) (def ServiceDef, ok bool) {
	if len(raw) == 0 || json.Unmarshal(raw, &def) != nil {
		return ServiceDef{}, false
	}
	return def, true
}

// Encode returns def's JSON.
func (def ServiceDef) Encode() []byte {
	b, _ := json.Marshal(def)
	return b
}

// RetryDef is a unit's own retry policy as stored (Unit.Retry): Backoff
// and Jitter are the public API's enumeration values.
type RetryDef struct {
	MaxAttempts int           `json:"max_attempts,omitempty"`
	Backoff     uint8         `json:"backoff,omitempty"`
	BaseDelay   time.Duration `json:"base_delay,omitempty"`
	MaxDelay    time.Duration `json:"max_delay,omitempty"`
	Jitter      uint8         `json:"jitter,omitempty"`
}

// CircuitRecord is a service's persisted broker state
// (ServiceRecord.Circuit): its circuit, and any Retry-After hold. Times are
// wall-clock Unix nanoseconds.
type CircuitRecord struct {
	State        string `json:"state,omitempty"`
	Failures     int    `json:"failures,omitempty"`
	Until        int64  `json:"until,omitempty"`
	BlockedUntil int64  `json:"blocked_until,omitempty"`
	// BlockedFor is the Retry-After hold's length (ns) when it was set.
	BlockedFor int64 `json:"blocked_for,omitempty"`
}

// DecodeCircuitRecord reads a stored circuit record; ok is false for an
// empty or unreadable one.
func DecodeCircuitRecord(raw []byte) (cr CircuitRecord, ok bool) {
	if len(raw) == 0 || json.Unmarshal(raw, &cr) != nil {
		return CircuitRecord{}, false
	}
	return cr, true
}

// OwnerQuestion is a question another process asks the owner about its
// live state (Ask, Questioner), and (answered) the owner's answer as
// JSON; Nonce is its ID. It was the Data of owner_asked and
// owner_answered events, which runcue 0.1.0 appended to the log.
type OwnerQuestion struct {
	Nonce string `json:"nonce"`
	// Kind is "explain" (of unit ID), "services" (every service's live
	// statistics) or "service" (the keyed instance Service).
	Kind    string          `json:"kind"`
	ID      string          `json:"id,omitempty"`
	Service string          `json:"service,omitempty"`
	Answer  json.RawMessage `json:"answer,omitempty"`
}

// DecodeEventData reads a work event's Data; unreadable or empty data
// reads as zero.
func DecodeEventData(raw []byte) EventData {
	var d EventData
	if len(raw) > 0 && json.Unmarshal(raw, &d) != nil {
		return EventData{}
	}
	return d
}
