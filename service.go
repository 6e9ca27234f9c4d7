package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/runcue/runcue/store"
)

// Service describes a rate-limited or capacity-limited external resource: an
// API, a remote host, a local pool. Every limit's zero value means unlimited
// (or, for the circuit breaker, disabled).
//
// Its JSON follows runcue's convention: max_concurrent, rate_limit,
// rate_window_ms, circuit_threshold, circuit_timeout_ms, budgets, margin_ms,
// pace, meters, adaptive, share, weight, min_concurrent.
type Service struct {
	// MaxConcurrent caps the units using the service at once.
	MaxConcurrent int
	// RateLimit caps the dispatches that start within any interval of
	// length RateWindow plus Margin, so that the service, counting
	// arrivals, sees at most RateLimit in any RateWindow. Set both or
	// neither.
	RateLimit  int
	RateWindow time.Duration
	// CircuitThreshold is the number of consecutive failures that open the
	// service's circuit; CircuitTimeout how long it then stays open before
	// admitting one probe. Set both or neither.
	CircuitThreshold int
	CircuitTimeout   time.Duration
	// Budgets are calendar budgets: requests per day or month of a time
	// zone (see Budget), besides the rolling window.
	Budgets []Budget
	// Margin is the spread, from a handler's start to its request's
	// arrival at the service, that the limits must tolerate: connection
	// set-up included, the difference between the fastest and the slowest
	// request's way there. The service counts a request when it arrives;
	// runcue counts it when the handler starts (Work.Started). So a start
	// holds its place in the rate window for RateWindow plus Margin, and
	// counts in every budget period that its arrival can fall in. With a
	// Margin at least the wire's jitter, the service's own sliding window
	// holds even when a whole window's worth of a backlog starts at once.
	// Zero means DefaultMargin; a negative Margin means none (a resource
	// that counts at the start itself, such as a local pool). At most
	// MaxMargin.
	Margin time.Duration
	// Pace spaces the dispatches of a rate-limited service at least
	// RateWindow/RateLimit apart, for services that dislike bursts: a
	// backlog then leaves at an even rate instead of a window's worth at
	// once. Off by default.
	Pace bool
	// Meters limit amounts other than requests (tokens, bytes) per
	// sliding window, each run charged its unit's Costs (see Meter). A
	// unit of a task using the service must state a cost of every
	// metered amount.
	Meters []Meter
	// Adaptive, when set, makes the service's limits (MaxConcurrent,
	// RateLimit, each meter's Limit) ceilings under which runcue finds
	// the limit the service really grants, from its overload signals
	// (see Adaptive).
	Adaptive *Adaptive
	// Share, on a service used with keys (Task.ServiceKeys: "tenant:a",
	// "tenant:b"), divides among its keys what they share (another
	// service they all use, a meter of it, the Cue's MaxConcurrent) in
	// proportion to their Weights, counted in the amount it names:
	// "requests" counts each dispatch as one, a meter's amount ("tokens")
	// counts each unit's cost of it. Empty: the keys' units go in
	// submission order, so the key with the longest backlog takes most.
	// See Weight and MinConcurrent; MaxConcurrent, set on the service or
	// a key's override, is a key's burst maximum. With a Priority
	// function, shares divide among units scored alike, approximately
	// while scoring lags behind a burst of submissions.
	Share string
	// Weight is a key's share relative to the others' (zero means one).
	// Set on the class it applies to every key; a key's own override
	// (SetServiceLimits("tenant:a", ...)) gives it its own.
	Weight float64
	// MinConcurrent is a key's guaranteed minimum: while fewer of its
	// units run, its next unit goes before any other key's. At most
	// MaxConcurrent when that is set.
	MinConcurrent int
}

// Adaptive configures adaptive limits (AIMD: additive increase,
// multiplicative decrease). Every limit the service configures is a
// ceiling: an overload signal from a run of the service cuts each
// effective limit to Decrease of itself (one cut per burst: signals from
// runs started before the last cut do not cut again), and successes raise
// each by Increase of its ceiling per window's worth (as many requests as
// the limit, or as many tokens), never above the ceiling nor below Floor
// of it. Each key of a keyed service adapts on its own.
//
// The overload signals: a Retry-After (RetryAfter, or httplimit.Report
// for a 429 or a 503), an error made with Overloaded (a 503 without
// Retry-After), and a run cut off by its timeout. The effective limits
// are persisted (a new owner goes on from them), shown in ServiceStatus
// (Adaptive), Explain, the command line and the dashboard, announced by
// an EventLimitAdapted event and exported as the metric
// runcue.service.limit_effective.
//
// Zero fields take the defaults: Floor 0.1, Decrease 0.8, Increase 0.02.
// A gentler Decrease than the classic 0.5 keeps more throughput against
// a limit that is steady, at the cost of more cuts to reach it: against
// a hidden limit at 60% of the configured one, 0.8 keeps about 94% of it
// with under 1% of requests refused, 0.5 about 79%.
type Adaptive struct {
	Floor    float64 `json:"floor,omitempty"`
	Decrease float64 `json:"decrease,omitempty"`
	Increase float64 `json:"increase,omitempty"`
}

func (a *Adaptive) validate() error {
	if a == nil {
		return nil
	}
	switch {
	case a.Floor < 0 || a.Floor > 1 || math.IsNaN(a.Floor):
		return fmt.Errorf("%w: Adaptive.Floor %v is not within [0, 1]", ErrInvalid, a.Floor)
	case a.Decrease < 0 || a.Decrease >= 1 || math.IsNaN(a.Decrease):
		return fmt.Errorf("%w: Adaptive.Decrease %v is not within (0, 1)", ErrInvalid, a.Decrease)
	case a.Increase < 0 || a.Increase > 1 || math.IsNaN(a.Increase):
		return fmt.Errorf("%w: Adaptive.Increase %v is not within (0, 1]", ErrInvalid, a.Increase)
	}
	return nil
}

func (a *Adaptive) def() *store.AdaptDef {
	if a == nil {
		return nil
	}
	return &store.AdaptDef{Floor: a.Floor, Decrease: a.Decrease, Increase: a.Increase}
}

func adaptiveFrom(d *store.AdaptDef) *Adaptive {
	if d == nil {
		return nil
	}
	return &Adaptive{Floor: d.Floor, Decrease: d.Decrease, Increase: d.Increase}
}

// MaxRateWindow is the longest RateWindow accepted.
const MaxRateWindow = 7 * 24 * time.Hour

// DefaultMargin is a service's Margin when it sets none: 10 ms, more than
// the 1-4 ms from start to arrival measured against local mock servers,
// and little against windows of a second or more (a limit of 4 per second
// becomes 4 per 1.01 s).
const DefaultMargin = store.DefaultMargin

// MaxMargin is the largest Margin accepted.
const MaxMargin = time.Minute

// margin returns the margin in force: DefaultMargin for zero, none for a
// negative one.
func (s Service) margin() time.Duration { return store.ServiceDef{Margin: s.Margin}.MarginInForce() }

// hold is how long a start holds its place in s's rate window.
func (s Service) hold() time.Duration {
	return store.ServiceDef{RateLimit: s.RateLimit, RateWindow: s.RateWindow, Margin: s.Margin}.Hold()
}

func (s Service) validate() error {
	switch {
	case s.MaxConcurrent < 0, s.RateLimit < 0, s.RateWindow < 0, s.CircuitThreshold < 0, s.CircuitTimeout < 0:
		return fmt.Errorf("%w: service limits must not be negative", ErrInvalid)
	case s.RateLimit > 0 && s.RateWindow == 0:
		return fmt.Errorf("%w: RateLimit %d needs a RateWindow", ErrInvalid, s.RateLimit)
	case s.RateWindow > 0 && s.RateLimit == 0:
		return fmt.Errorf("%w: RateWindow %v needs a RateLimit", ErrInvalid, s.RateWindow)
	case s.RateWindow > MaxRateWindow:
		return fmt.Errorf("%w: RateWindow %v is longer than %v", ErrInvalid, s.RateWindow, MaxRateWindow)
	case s.RateWindow > 0 && s.RateWindow < time.Millisecond:
		return fmt.Errorf("%w: RateWindow %v is shorter than 1ms", ErrInvalid, s.RateWindow)
	case s.CircuitThreshold > 0 && s.CircuitTimeout == 0:
		return fmt.Errorf("%w: CircuitThreshold %d needs a CircuitTimeout", ErrInvalid, s.CircuitThreshold)
	case s.CircuitTimeout > 0 && s.CircuitThreshold == 0:
		return fmt.Errorf("%w: CircuitTimeout %v needs a CircuitThreshold", ErrInvalid, s.CircuitTimeout)
	case s.Margin > MaxMargin:
		return fmt.Errorf("%w: Margin %v is longer than %v", ErrInvalid, s.Margin, MaxMargin)
	case s.Pace && s.RateLimit == 0:
		return fmt.Errorf("%w: Pace needs a RateLimit", ErrInvalid)
	case s.Weight < 0 || math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0):
		return fmt.Errorf("%w: Weight %v must be a finite positive number", ErrInvalid, s.Weight)
	case s.MinConcurrent < 0:
		return fmt.Errorf("%w: MinConcurrent must not be negative", ErrInvalid)
	case s.MaxConcurrent > 0 && s.MinConcurrent > s.MaxConcurrent:
		return fmt.Errorf("%w: MinConcurrent %d is above MaxConcurrent %d", ErrInvalid, s.MinConcurrent, s.MaxConcurrent)
	case s.Share != "" && validName("amount", s.Share) != nil:
		return fmt.Errorf("%w: Share %q is not an amount's name", ErrInvalid, s.Share)
	}
	if err := s.Adaptive.validate(); err != nil {
		return err
	}
	if err := validateMeters(s.Meters); err != nil {
		return err
	}
	for _, b := range s.Budgets {
		if err := b.validate(); err != nil {
			return err
		}
	}
	return nil
}

// def is s's stored form.
func (s Service) def() store.ServiceDef {
	def := store.ServiceDef{MaxConcurrent: s.MaxConcurrent, RateLimit: s.RateLimit, RateWindow: s.RateWindow,
		CircuitThreshold: s.CircuitThreshold, CircuitTimeout: s.CircuitTimeout, Margin: s.Margin, Pace: s.Pace,
		Adaptive: s.Adaptive.def(), Share: s.Share, Weight: s.Weight, MinConcurrent: s.MinConcurrent}
	for _, b := range s.Budgets {
		def.Budgets = append(def.Budgets, b.def())
	}
	for _, m := range s.Meters {
		def.Meters = append(def.Meters, m.def())
	}
	return def
}

// serviceFrom reads a stored definition.
func serviceFrom(def store.ServiceDef) Service {
	s := Service{MaxConcurrent: def.MaxConcurrent, RateLimit: def.RateLimit, RateWindow: def.RateWindow,
		CircuitThreshold: def.CircuitThreshold, CircuitTimeout: def.CircuitTimeout, Margin: def.Margin, Pace: def.Pace,
		Adaptive: adaptiveFrom(def.Adaptive), Share: def.Share, Weight: def.Weight, MinConcurrent: def.MinConcurrent}
	for _, b := range def.Budgets {
		s.Budgets = append(s.Budgets, budgetFrom(b))
	}
	for _, m := range def.Meters {
		s.Meters = append(s.Meters, meterFrom(m))
	}
	return s
}

// decodeService reads a stored definition or override; ok is false for
// an empty or unreadable one.
func decodeService(raw []byte) (s Service, ok bool) {
	def, ok := store.DecodeServiceDef(raw)
	if !ok {
		return Service{}, false
	}
	return serviceFrom(def), true
}

// serviceJSON is Service's JSON form.
type serviceJSON struct {
	MaxConcurrent    int      `json:"max_concurrent,omitempty"`
	RateLimit        int      `json:"rate_limit,omitempty"`
	RateWindowMS     int64    `json:"rate_window_ms,omitempty"`
	CircuitThreshold int      `json:"circuit_threshold,omitempty"`
	CircuitTimeoutMS int64    `json:"circuit_timeout_ms,omitempty"`
	Budgets          []Budget `json:"budgets,omitempty"`
	// MarginMS is the margin in milliseconds, rounded up; -1 for none,
	// omitted for the default.
	MarginMS      int64     `json:"margin_ms,omitempty"`
	Pace          bool      `json:"pace,omitempty"`
	Meters        []Meter   `json:"meters,omitempty"`
	Adaptive      *Adaptive `json:"adaptive,omitempty"`
	Share         string    `json:"share,omitempty"`
	Weight        float64   `json:"weight,omitempty"`
	MinConcurrent int       `json:"min_concurrent,omitempty"`
}

// MarshalJSON writes s in runcue's JSON convention (durations in
// milliseconds; a Margin is rounded up to one, and a negative one is -1).
func (s Service) MarshalJSON() ([]byte, error) {
	var margin int64
	switch {
	case s.Margin < 0:
		margin = -1
	case s.Margin > 0:
		margin = int64((s.Margin + time.Millisecond - 1) / time.Millisecond)
	}
	return json.Marshal(serviceJSON{s.MaxConcurrent, s.RateLimit, s.RateWindow.Milliseconds(), s.CircuitThreshold,
		s.CircuitTimeout.Milliseconds(), s.Budgets, margin, s.Pace, s.Meters, s.Adaptive, s.Share, s.Weight, s.MinConcurrent})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *Service) UnmarshalJSON(b []byte) error {
	var j serviceJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = Service{MaxConcurrent: j.MaxConcurrent, RateLimit: j.RateLimit, RateWindow: time.Duration(j.RateWindowMS) * time.Millisecond,
		CircuitThreshold: j.CircuitThreshold, CircuitTimeout: time.Duration(j.CircuitTimeoutMS) * time.Millisecond, Budgets: j.Budgets,
		Margin: time.Duration(j.MarginMS) * time.Millisecond, Pace: j.Pace, Meters: j.Meters, Adaptive: j.Adaptive,
		Share: j.Share, Weight: j.Weight, MinConcurrent: j.MinConcurrent}
	if j.MarginMS < 0 {
		s.Margin = -1
	}
	return nil
}

// MaxName is the longest name of a task, service or subscription, and
// MaxKeyedName the longest keyed instance ("class:key"), in bytes.
const (
	MaxName      = 200
	MaxKeyedName = 512
)

// validName checks the name of a task, service or subscription: 1 to
// MaxName bytes of UTF-8, without whitespace or control characters.
func validName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty %s name", ErrInvalid, kind)
	case len(name) > MaxName:
		return fmt.Errorf("%w: %s name longer than %d bytes", ErrInvalid, kind, MaxName)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s name %q is not valid UTF-8", ErrInvalid, kind, name)
	case strings.ContainsFunc(name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Errorf("%w: %s name %q contains whitespace or a control character", ErrInvalid, kind, name)
	case kind == "service" && strings.Contains(name, ":"):
		return fmt.Errorf("%w: service name %q contains ':', which separates a service from its keys", ErrInvalid, name)
	}
	return nil
}

// validKey checks a keyed instance's key (after "class:"): the instance's
// name at most MaxKeyedName bytes of UTF-8, without whitespace or control
// characters.
func validKey(name, key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: %q has an empty key", ErrInvalid, name)
	case len(name) > MaxKeyedName:
		return fmt.Errorf("%w: keyed instance %.40q... is longer than %d bytes", ErrInvalid, name, MaxKeyedName)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: keyed instance %q is not valid UTF-8", ErrInvalid, name)
	case strings.ContainsFunc(key, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Errorf("%w: keyed instance %q contains whitespace or a control character", ErrInvalid, name)
	}
	return nil
}

// Service registers a service under name. Its definition is stored in the
// database. Registering a name twice is an error.
//
// The limits registered in code are the service's defaults. SetService
// overrides them at run time from any process; the override is stored, so
// it outlives restarts (and a change of the registered defaults) until
// ResetService clears it.
func (c *Cue) Service(name string, s Service) error {
	if err := validName("service", name); err != nil {
		return err
	}
	if err := s.validate(); err != nil {
		return fmt.Errorf("service %q: %w", name, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if _, dup := c.services[name]; dup {
		c.mu.Unlock()
		return fmt.Errorf("%w: service %q is already registered", ErrInvalid, name)
	}
	c.services[name] = s
	c.mu.Unlock()
	def := s.def().Encode()
	if _, err := c.w.Do(context.Background(), &store.PutService{Name: name, Def: def}); err != nil {
		c.mu.Lock()
		delete(c.services, name)
		c.mu.Unlock()
		return fmt.Errorf("service %q: %w", name, wrapStoreErr(err))
	}
	c.notifyRegistry()
	return nil
}

// SetService overrides a registered service's limits at run time. The
// override is stored and applies at once in the owning Cue (within its
// PollInterval when set from another process), and after restarts, until
// ResetService clears it.
//
// name may be a keyed instance ("host:example.org"): its override applies
// to it alone, over the class's, whether or not the instance is in memory
// now; it is kept while the instance is forgotten and made again. The same
// holds for ResetService, PauseService and ResumeService. A class's pause
// holds all of its instances; an instance's pause holds only it.
func (c *Cue) SetService(ctx context.Context, name string, s Service) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("service %q: %w", name, err)
	}
	def := s.def().Encode()
	return c.changeService(ctx, name, &store.PutService{Name: name, Override: def}, "override")
}

// ResetService clears a service's override: its registered limits apply
// again.
func (c *Cue) ResetService(ctx context.Context, name string) error {
	return c.changeService(ctx, name, &store.PutService{Name: name, Override: []byte{}}, "reset")
}

// PauseService stops dispatching to a service until ResumeService. Running
// units continue. The pause is stored: it outlives restarts.
func (c *Cue) PauseService(ctx context.Context, name string) error {
	yes := true
	return c.changeService(ctx, name, &store.PutService{Name: name, Paused: &yes}, "paused")
}

// ResumeService lets a paused service be dispatched to again.
func (c *Cue) ResumeService(ctx context.Context, name string) error {
	no := false
	return c.changeService(ctx, name, &store.PutService{Name: name, Paused: &no}, "resumed")
}

func (c *Cue) changeService(ctx context.Context, name string, op *store.PutService, what string) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	if err := c.knownService(ctx, name); err != nil {
		return err
	}
	data, _ := json.Marshal(map[string]string{"service": name, "change": what})
	ev := &store.AppendEvent{Event: store.Event{Type: string(EventServiceChanged), Time: c.clock.Now(), Data: data}}
	if _, err := c.w.Do(ctx, op, ev); err != nil {
		return wrapStoreErr(err)
	}
	// The owner applies the change before this returns, so that a status
	// read next shows it. (It is stored: if ctx ends first, the owner
	// still applies it.)
	if d := c.disp.Load(); d != nil {
		d.serviceChanged(ctx, name)
	}
	return nil
}

// knownService checks that name is registered here or in the database, or
// is a keyed instance ("class:key") of such a service.
func (c *Cue) knownService(ctx context.Context, name string) error {
	var keyErr error
	full := name
	if i := strings.IndexByte(name, ':'); i >= 0 {
		if i == 0 {
			return fmt.Errorf("%w: %q is not a service or a keyed instance (class:key)", ErrInvalid, name)
		}
		keyErr = validKey(name, name[i+1:])
		name = name[:i]
	}
	c.mu.Lock()
	_, ok := c.services[name]
	c.mu.Unlock()
	if ok && keyErr == nil {
		return nil
	}
	recs, err := c.st.Services(ctx)
	if err != nil {
		return c.readErr(err)
	}
	if keyErr != nil {
		// An instance stored before keys were bounded may still be
		// controlled by its exact name.
		if !slices.ContainsFunc(recs, func(r store.ServiceRecord) bool { return r.Name == full }) {
			return keyErr
		}
		if ok {
			return nil
		}
	}
	for _, r := range recs {
		if r.Name == name && len(r.Def) > 0 {
			return nil
		}
	}
	return fmt.Errorf("%w: %q", ErrUnknownService, name)
}
