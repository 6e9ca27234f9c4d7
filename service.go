package runcue

import (
	"context"
	"encoding/json"
	"fmt"
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
// pace, meters.
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
		CircuitThreshold: s.CircuitThreshold, CircuitTimeout: s.CircuitTimeout, Margin: s.Margin, Pace: s.Pace}
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
		CircuitThreshold: def.CircuitThreshold, CircuitTimeout: def.CircuitTimeout, Margin: def.Margin, Pace: def.Pace}
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
	MarginMS int64   `json:"margin_ms,omitempty"`
	Pace     bool    `json:"pace,omitempty"`
	Meters   []Meter `json:"meters,omitempty"`
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
		s.CircuitTimeout.Milliseconds(), s.Budgets, margin, s.Pace, s.Meters})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *Service) UnmarshalJSON(b []byte) error {
	var j serviceJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = Service{MaxConcurrent: j.MaxConcurrent, RateLimit: j.RateLimit, RateWindow: time.Duration(j.RateWindowMS) * time.Millisecond,
		CircuitThreshold: j.CircuitThreshold, CircuitTimeout: time.Duration(j.CircuitTimeoutMS) * time.Millisecond, Budgets: j.Budgets,
		Margin: time.Duration(j.MarginMS) * time.Millisecond, Pace: j.Pace, Meters: j.Meters}
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
