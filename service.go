package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// Service describes a rate-limited or capacity-limited external resource: an
// API, a remote host, a local pool. Every limit's zero value means unlimited
// (or, for the circuit breaker, disabled).
type Service struct {
	// MaxConcurrent caps the units using the service at once.
	MaxConcurrent int
	// RateLimit caps the dispatches that start within any interval of
	// length RateWindow. Set both or neither.
	RateLimit  int
	RateWindow time.Duration
	// CircuitThreshold is the number of consecutive failures that open the
	// service's circuit; CircuitTimeout how long it then stays open before
	// admitting one probe. Set both or neither.
	CircuitThreshold int
	CircuitTimeout   time.Duration
}

// MaxRateWindow is the longest RateWindow accepted.
const MaxRateWindow = 7 * 24 * time.Hour

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
	}
	return nil
}

// serviceDef is the persisted form of a Service.
type serviceDef struct {
	MaxConcurrent    int           `json:"max_concurrent,omitempty"`
	RateLimit        int           `json:"rate_limit,omitempty"`
	RateWindow       time.Duration `json:"rate_window,omitempty"`
	CircuitThreshold int           `json:"circuit_threshold,omitempty"`
	CircuitTimeout   time.Duration `json:"circuit_timeout,omitempty"`
}

func (s Service) def() serviceDef {
	return serviceDef(s)
}

func validName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty %s name", ErrInvalid, kind)
	case len(name) > 200:
		return fmt.Errorf("%w: %s name longer than 200 bytes", ErrInvalid, kind)
	case strings.ContainsAny(name, "\x00\n\r\t "):
		return fmt.Errorf("%w: %s name %q contains whitespace or NUL", ErrInvalid, kind, name)
	case kind == "service" && strings.Contains(name, ":"):
		return fmt.Errorf("%w: service name %q contains ':', which separates a service from its keys", ErrInvalid, name)
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
	def, _ := json.Marshal(s.def())
	if _, err := c.w.Do(context.Background(), &store.PutService{Name: name, Def: def}); err != nil {
		c.mu.Lock()
		delete(c.services, name)
		c.mu.Unlock()
		return fmt.Errorf("service %q: %w", name, wrapStoreErr(err))
	}
	c.notifyRegistry()
	return nil
}

// ServiceStatus reports a service's limits and load.
type ServiceStatus struct {
	// Name is the service; Class the service whose limits apply (Name, but
	// for a keyed instance such as "host:example.org", "host").
	Name  string `json:"name"`
	Class string `json:"class"`
	// Limits are the limits in force: the override if one is set
	// (Overridden), else the registered ones.
	Limits     Service `json:"limits"`
	Overridden bool    `json:"overridden,omitempty"`
	// Active is the number of running units holding the service.
	Active int `json:"active"`
	// Waiting is the number of groups of queued units (task types and key
	// sets) waiting for this service in particular.
	Waiting int `json:"waiting,omitempty"`
	// InWindow is the number of dispatches in the current rate window.
	InWindow int `json:"in_window,omitempty"`
	// Circuit is the circuit breaker state; CircuitOpenUntil when an open
	// circuit admits its probe.
	Circuit          CircuitState `json:"circuit"`
	CircuitOpenUntil time.Time    `json:"circuit_open_until,omitzero"`
	// Paused reports PauseService.
	Paused bool `json:"paused,omitempty"`
	// BlockedUntil is set while a Retry-After holds the service.
	BlockedUntil time.Time `json:"blocked_until,omitzero"`
	// NextCapacity is when the service may next admit a dispatch: now if it
	// may, zero if only an event (a run ending, a resume) can free it.
	NextCapacity time.Time `json:"next_capacity,omitzero"`
	// Keys counts a class's live keyed instances; OpenKeys and BlockedKeys
	// those with an open circuit or held by a Retry-After. Their load is
	// included in Active, Waiting and InWindow.
	Keys        int `json:"keys,omitempty"`
	OpenKeys    int `json:"open_keys,omitempty"`
	BlockedKeys int `json:"blocked_keys,omitempty"`
}

// SetService overrides a registered service's limits at run time. The
// override is stored and applies at once in the owning Cue (within its
// PollInterval when set from another process), and after restarts, until
// ResetService clears it.
func (c *Cue) SetService(ctx context.Context, name string, s Service) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("service %q: %w", name, err)
	}
	def, _ := json.Marshal(s.def())
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
	if d := c.disp.Load(); d != nil {
		d.in.Push(msgServiceChanged{service: name})
	}
	return nil
}

// knownService checks that name is registered here or in the database.
func (c *Cue) knownService(ctx context.Context, name string) error {
	c.mu.Lock()
	_, ok := c.services[name]
	c.mu.Unlock()
	if ok {
		return nil
	}
	recs, err := c.st.Services(ctx)
	if err != nil {
		return c.readErr(err)
	}
	for _, r := range recs {
		if r.Name == name && len(r.Def) > 0 {
			return nil
		}
	}
	return fmt.Errorf("%w: %q", ErrUnknownService, name)
}

// Services reports every registered service, keyed instances folded into
// their class. In the owning Cue the figures are live; in another process
// they are read from the database (Active from running units, InWindow from
// the service log).
func (c *Cue) Services(ctx context.Context) ([]ServiceStatus, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	if d := c.disp.Load(); d != nil {
		ch := make(chan []ServiceStatus, 1)
		d.in.Push(msgCall{f: func(d *dispatcher) { ch <- d.statusAll() }})
		select {
		case st := <-ch:
			return st, nil
		case <-d.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return c.storedStatus(ctx)
}

// ServiceStatus reports one service (see Services).
func (c *Cue) ServiceStatus(ctx context.Context, name string) (ServiceStatus, error) {
	all, err := c.Services(ctx)
	if err != nil {
		return ServiceStatus{}, err
	}
	for _, st := range all {
		if st.Name == name {
			return st, nil
		}
	}
	return ServiceStatus{}, fmt.Errorf("%w: %q", ErrUnknownService, name)
}

// storedStatus computes service status from the database, for a Cue that
// does not own it.
func (c *Cue) storedStatus(ctx context.Context) ([]ServiceStatus, error) {
	recs, err := c.st.Services(ctx)
	if err != nil {
		return nil, c.readErr(err)
	}
	tasks, err := c.st.Tasks(ctx)
	if err != nil {
		return nil, c.readErr(err)
	}
	running, err := c.st.ListUnits(ctx, store.ListFilter{States: []store.State{store.Running}, Limit: 100000})
	if err != nil {
		return nil, c.readErr(err)
	}
	usedBy := map[string][]string{} // task -> services
	for name, def := range tasks {
		var td taskDef
		if json.Unmarshal(def, &td) == nil {
			usedBy[name] = td.Services
		}
	}
	active := map[string]int{}
	for _, u := range running {
		for _, s := range usedBy[u.Task] {
			active[s]++
		}
	}
	now := c.clock.Now()
	byName := map[string]store.ServiceRecord{}
	for _, r := range recs {
		byName[r.Name] = r
	}
	var out []ServiceStatus
	for _, r := range recs {
		if len(r.Def) == 0 {
			continue // a keyed instance's circuit row
		}
		var def serviceDef
		_ = json.Unmarshal(r.Def, &def)
		st := ServiceStatus{Name: r.Name, Class: r.Name, Limits: Service(def), Paused: r.Paused, Active: active[r.Name], Circuit: CircuitClosed}
		if len(r.Override) > 0 {
			var ov serviceDef
			if json.Unmarshal(r.Override, &ov) == nil {
				st.Limits, st.Overridden = Service(ov), true
			}
		}
		if st.Limits.RateLimit > 0 {
			log, err := c.st.ServiceLog(ctx, r.Name, now.Add(-st.Limits.RateWindow).Add(1))
			if err != nil {
				return nil, c.readErr(err)
			}
			st.InWindow = len(log)
		}
		var cr circuitRecord
		if len(r.Circuit) > 0 && json.Unmarshal(r.Circuit, &cr) == nil {
			if cr.State != "" {
				st.Circuit = CircuitState(cr.State)
				if cr.Until != 0 {
					st.CircuitOpenUntil = time.Unix(0, cr.Until)
				}
			}
			if bu := time.Unix(0, cr.BlockedUntil); cr.BlockedUntil != 0 && bu.After(now) {
				st.BlockedUntil = bu
			}
		}
		for _, k := range recs {
			if strings.HasPrefix(k.Name, r.Name+":") && len(k.Circuit) > 0 {
				var kc circuitRecord
				if json.Unmarshal(k.Circuit, &kc) == nil && kc.State != "" && kc.State != "closed" {
					st.OpenKeys++
				}
			}
		}
		out = append(out, st)
	}
	return out, nil
}
