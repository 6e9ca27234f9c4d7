package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/runcue/runcue/internal/vocab"
	"github.com/runcue/runcue/store"
)

// ServiceStatus report all of that; Explain says which refuses a unit and
// until when. The machinery is in resources.go (admission), keys.go
// (keyed services), status.go (service_status events) and circuit.go.

// Services reports every registered service, keyed instances folded into
// their class. The figures are the owner's live ones: in the owning Cue at
// once, in another process asked of the owner (a question stored for it,
// outside the event log: no subscription sees it). With no owner to answer, they are read from the
// database (Active from running units, InWindow from the service log;
// keyed instances' load is not stored).
func (c *Cue) Services(ctx context.Context) ([]ServiceStatus, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	if d := c.disp.Load(); d != nil {
		st, ok, err := d.services(ctx)
		if err != nil {
			return nil, err
		}
		if ok {
			return st, nil
		}
	} else {
		var live []ServiceStats
		if c.askOwner(ctx, store.OwnerQuestion{Kind: "services"}, &live) {
			out := make([]ServiceStatus, len(live))
			for i, s := range live {
				out[i] = s.ServiceStatus
			}
			return out, nil
		}
	}
	return c.storedStatus(ctx)
}

// ServiceStatus reports one service (see Services), or one keyed instance
// ("host:example.org"): its own limits (its override, else its class's),
// load and state, whether or not the owner holds it in memory now. An
// instance not in memory reports what is stored: its pause, its circuit,
// the starts of its window and budgets in the service log.
func (c *Cue) ServiceStatus(ctx context.Context, name string) (ServiceStatus, error) {
	if strings.Contains(name, ":") {
		return c.keyStatus(ctx, name)
	}
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

// keyStatus is ServiceStatus of a keyed instance: the owner's live state
// if it holds the instance, else the stored one.
func (c *Cue) keyStatus(ctx context.Context, name string) (ServiceStatus, error) {
	if err := c.checkOpen(); err != nil {
		return ServiceStatus{}, err
	}
	if err := c.knownService(ctx, name); err != nil {
		return ServiceStatus{}, err
	}
	if d := c.disp.Load(); d != nil {
		st, _, err := d.keyStatus(ctx, name)
		if err != nil {
			return ServiceStatus{}, err
		}
		if st != nil {
			return *st, nil
		}
	} else {
		var st ServiceStatus
		if c.askOwner(ctx, store.OwnerQuestion{Kind: "service", Service: name}, &st) {
			return st, nil
		}
	}
	return c.storedKeyStatus(ctx, name)
}

// storedKeyStatus reports keyed instance name from the database: its
// limits, pause and circuit, and the starts the service log holds in its
// window and budgets. Active is not stored per instance: it is zero.
func (c *Cue) storedKeyStatus(ctx context.Context, name string) (ServiceStatus, error) {
	class, _, _ := strings.Cut(name, ":")
	recs, err := c.st.Services(ctx)
	if err != nil {
		return ServiceStatus{}, c.readErr(err)
	}
	var classRec, keyRec store.ServiceRecord
	for _, r := range recs {
		switch r.Name {
		case class:
			classRec = r
		case name:
			keyRec = r
		}
	}
	st := ServiceStatus{Name: name, Class: class, Circuit: CircuitClosed, Paused: classRec.Paused || keyRec.Paused}
	c.mu.Lock()
	st.Limits = c.services[class]
	c.mu.Unlock()
	if def, ok := decodeService(classRec.Def); ok {
		st.Limits = def
	}
	if ov, ok := decodeService(classRec.Override); ok {
		st.Limits, st.Overridden = ov, true
	}
	if ov, ok := decodeService(keyRec.Override); ok {
		st.Limits, st.Overridden = ov, true
	}
	now := c.clock.Now()
	if st.Limits.RateLimit > 0 {
		log, err := c.requestLog(ctx, name, now.Add(-vocab.Hold(st.Limits)).Add(1))
		if err != nil {
			return ServiceStatus{}, c.readErr(err)
		}
		st.InWindow = len(log)
		if len(log) >= st.Limits.RateLimit {
			st.NextCapacity = log[len(log)-st.Limits.RateLimit].Add(vocab.Hold(st.Limits))
		}
	}
	if st.Budgets, err = c.storedBudgets(ctx, name, st.Limits); err != nil {
		return ServiceStatus{}, c.readErr(err)
	}
	if st.Meters, err = c.storedMeters(ctx, name, st.Limits, now); err != nil {
		return ServiceStatus{}, c.readErr(err)
	}
	storedCircuit(keyRec.Meters[store.MeterCircuit], now, &st)
	st.Adaptive = storedAdaptive(keyRec.Meters[store.MeterAdapt], st.Limits)
	return st, nil
}

// storedMeters reports the amount meters of service name (of limits l) as
// the service log holds them at now: the amounts logged within each
// meter's window and margin (reservations of dispatches not started are
// the owner's alone).
func (c *Cue) storedMeters(ctx context.Context, name string, l Service, now time.Time) ([]MeterStatus, error) {
	if len(l.Meters) == 0 {
		return nil, nil
	}
	var longest time.Duration
	for _, m := range l.Meters {
		longest = max(longest, m.Window)
	}
	logged, err := c.st.ServiceLog(ctx, name, now.Add(-longest-vocab.Margin(l)).Add(1))
	if err != nil {
		return nil, err
	}
	out := make([]MeterStatus, 0, len(l.Meters))
	for _, m := range l.Meters {
		ms := MeterStatus{Name: m.Name, Limit: m.Limit, Window: m.Window}
		hold := m.Window + vocab.Margin(l)
		for _, e := range logged {
			if e.Meter != m.Name || !e.At.After(now.Add(-hold)) {
				continue
			}
			if ms.Frees.IsZero() {
				ms.Frees = e.At.Add(hold) // the log is oldest first
			}
			ms.Used += e.Amount
		}
		out = append(out, ms)
	}
	return out, nil
}

// requestLog returns the request starts of service logged at or after
// since, oldest first.
func (c *Cue) requestLog(ctx context.Context, service string, since time.Time) ([]time.Time, error) {
	logged, err := c.st.ServiceLog(ctx, service, since)
	if err != nil {
		return nil, err
	}
	return requestTimes(logged), nil
}

// requestTimes returns the request starts of a service log, one per
// request.
func requestTimes(logged []store.Logged) []time.Time {
	var out []time.Time
	for _, l := range logged {
		if l.Meter != store.MeterRequests {
			continue
		}
		for range max(l.Amount, 1) {
			out = append(out, l.At)
		}
	}
	return out
}

// storedCircuit sets st's circuit and Retry-After hold from a stored
// circuit record, as of now.
func storedCircuit(raw []byte, now time.Time, st *ServiceStatus) {
	cr, ok := store.DecodeCircuitRecord(raw)
	if !ok {
		return
	}
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
		def, _ := decodeService(r.Def)
		st := ServiceStatus{Name: r.Name, Class: r.Name, Limits: def, Paused: r.Paused, Active: active[r.Name], Circuit: CircuitClosed}
		if ov, ok := decodeService(r.Override); ok {
			st.Limits, st.Overridden = ov, true
		}
		if st.Limits.RateLimit > 0 {
			log, err := c.requestLog(ctx, r.Name, now.Add(-vocab.Hold(st.Limits)).Add(1))
			if err != nil {
				return nil, c.readErr(err)
			}
			st.InWindow = len(log)
		}
		if st.Budgets, err = c.storedBudgets(ctx, r.Name, st.Limits); err != nil {
			return nil, c.readErr(err)
		}
		if st.Meters, err = c.storedMeters(ctx, r.Name, st.Limits, now); err != nil {
			return nil, c.readErr(err)
		}
		storedCircuit(r.Meters[store.MeterCircuit], now, &st)
		st.Adaptive = storedAdaptive(r.Meters[store.MeterAdapt], st.Limits)
		// The instances: those that started in the window (a minute
		// without one) and those with a stored state.
		window := time.Minute
		if st.Limits.RateLimit > 0 {
			window = vocab.Hold(st.Limits)
		}
		logs, err := c.st.ServiceLogPrefix(ctx, r.Name+":", now.Add(-window))
		if err != nil {
			return nil, c.readErr(err)
		}
		st.Keys = len(logs)
		for _, k := range recs {
			if !strings.HasPrefix(k.Name, r.Name+":") {
				continue
			}
			circuit := k.Meters[store.MeterCircuit]
			if _, logged := logs[k.Name]; !logged && (k.Paused || len(circuit) > 0 || len(k.Override) > 0) {
				st.Keys++
			}
			if k.Paused && !st.Paused {
				st.PausedKeys++
			}
			if len(circuit) > 0 {
				if kc, ok := store.DecodeCircuitRecord(circuit); ok && kc.State != "" && kc.State != string(CircuitClosed) {
					st.OpenKeys++
				}
			}
		}
		out = append(out, st)
	}
	return out, nil
}
