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

	"github.com/runcue/runcue/internal/vocab"
	"github.com/runcue/runcue/store"
)

func validateAdaptive(a *Adaptive) error {
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

func validateService(s Service) error {
	switch {
	case s.MaxConcurrent < 0, s.RateLimit < 0, s.RateWindow < 0, s.CircuitThreshold < 0, s.CircuitTimeout < 0:
		return fmt.Errorf("%w: service limits must not be negative", ErrInvalid)
	case s.RateLimit > 0 && s.RateWindow == 0:
		return fmt.Errorf("%w: RateLimit %d needs a RateWindow", ErrInvalid, s.RateLimit)
	case s.RateFromProvider && s.RateLimit == 0:
		return fmt.Errorf("%w: RateFromProvider needs a starting RateLimit and its RateWindow", ErrInvalid)
	case s.MaxRate < 0 || (s.MaxRate > 0 && (!s.RateFromProvider || s.MaxRate < s.RateLimit)):
		return fmt.Errorf("%w: MaxRate %d caps a RateLimit read from the provider (RateFromProvider), at least RateLimit %d", ErrInvalid, s.MaxRate, s.RateLimit)
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
	if err := validateAdaptive(s.Adaptive); err != nil {
		return err
	}
	if err := validateMeters(s.Meters); err != nil {
		return err
	}
	for _, b := range s.Budgets {
		if err := validateBudget(b); err != nil {
			return err
		}
	}
	return nil
}

// decodeService reads a stored definition or override; ok is false for
// an empty or unreadable one.
func decodeService(raw []byte) (s Service, ok bool) {
	def, ok := store.DecodeServiceDef(raw)
	if !ok {
		return Service{}, false
	}
	return vocab.ServiceOf(def), true
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
	if err := validateService(s); err != nil {
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
	def := vocab.ServiceDef(s).Encode()
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
	if err := validateService(s); err != nil {
		return fmt.Errorf("service %q: %w", name, err)
	}
	def := vocab.ServiceDef(s).Encode()
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
