package runcue

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// Role is what a Cue is doing with its database's ownership.
type Role string

// The roles of a Cue (Status.Role).
const (
	// RoleClient: not started (or stopped): it submits and reads, and
	// dispatches nothing.
	RoleClient Role = "client"
	// RoleOwner: it owns the database and dispatches its work.
	RoleOwner Role = "owner"
	// RoleStandby: another Cue owns the database; this one takes over
	// when that one's ownership ends.
	RoleStandby Role = "standby"
	// RoleWaiting: it cannot reach the database (or lost ownership) and
	// competes for ownership again once the database answers.
	RoleWaiting Role = "waiting"
	// RoleFailed: its store failed with a fatal error; it dispatches
	// nothing more (close it and open the database again once the cause
	// is fixed).
	RoleFailed Role = "failed"
)

// Status is what a Cue is doing and what it last met, for operators and
// orchestrators (Cue.Status, Cue.HealthHandler).
type Status struct {
	Role Role `json:"role"`
	// Since is when the Cue took this role.
	Since time.Time `json:"since"`
	// Owner is the owner's lease name, while Role is RoleOwner.
	Owner string `json:"owner,omitempty"`
	// StoreUnavailableSince is when the store's writes began to fail with
	// transient errors, during an outage (zero otherwise); the Cue retries
	// them.
	StoreUnavailableSince time.Time `json:"store_unavailable_since,omitzero"`
	// LastError is the last error of the store or of ownership (the
	// outage's, a lost lease's, a fatal failure's), kept after it cleared.
	LastError string `json:"last_error,omitempty"`
	// LastErrorAt is when LastError happened.
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// Live reports whether the Cue can still do its work: its store has not
// failed for good. An outage is live: it clears by itself.
func (s Status) Live() bool { return s.Role != RoleFailed }

// Ready reports whether the Cue serves now: live, and its store answers
// (no outage), in any role but RoleWaiting.
func (s Status) Ready() bool {
	return s.Live() && s.Role != RoleWaiting && s.StoreUnavailableSince.IsZero()
}

// health is the Cue's Status as it changes (any goroutine).
type health struct {
	mu      sync.Mutex
	role    Role
	since   time.Time
	owner   string
	outage  time.Time
	lastErr string
	lastAt  time.Time
}

func (h *health) setRole(r Role, owner string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.role == RoleFailed {
		return
	}
	if h.role != r {
		h.role, h.since = r, at
	}
	h.owner = ""
	if r == RoleOwner {
		h.owner = owner
	}
}

func (h *health) setErr(err error, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastErr, h.lastAt = err.Error(), at
}

func (h *health) setOutage(since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.outage = since
}

func (h *health) status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Status{Role: h.role, Since: h.since, Owner: h.owner, StoreUnavailableSince: h.outage,
		LastError: h.lastErr, LastErrorAt: h.lastAt}
}

// Status reports what the Cue is doing: its role, since when, and the
// store's last trouble.
func (c *Cue) Status() Status { return c.health.status() }

// HealthHandler serves the Cue's Status as JSON, for orchestrators'
// probes: with the query parameter "ready" (for example /readyz?ready),
// it answers 200 when the Cue is ready (Status.Ready) and 503 otherwise;
// without it, 200 when the Cue is live (Status.Live: a store outage is
// live, it clears by itself) and 503 once its store has failed for good.
func (c *Cue) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.Status()
		ok := s.Live()
		if r.URL.Query().Has("ready") {
			ok = s.Ready()
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(s)
	})
}

// storeOutage is the writer's Outage hook: the store's writes began to
// fail with transient errors. It is logged and announced once per outage.
func (c *Cue) storeOutage(since time.Time, err error) {
	c.health.setOutage(since)
	c.health.setErr(err, since)
	c.log.Warn("runcue: the store is unavailable: writes are retried until it answers", "error", err)
	c.hub.Publish([]store.Event{{Type: store.TypeStoreUnavailable, Time: since,
		Data: store.EventData{Error: err.Error(), ErrorKind: "store"}.Encode()}})
	c.countOutage()
}

// storeRecovered is the writer's Recovered hook.
func (c *Cue) storeRecovered(since time.Time) {
	c.health.setOutage(time.Time{})
	now := c.clock.Now()
	c.log.Info("runcue: the store answers again", "unavailable_for", now.Sub(since).Round(time.Millisecond))
	c.hub.Publish([]store.Event{{Type: store.TypeStoreRecovered, Time: now}})
}

// ownershipChanged announces that this Cue took (lost false; begin set
// its role) or lost ownership under the lease name owner.
func (c *Cue) ownershipChanged(owner string, lost bool, why error) {
	now := c.clock.Now()
	typ, change := store.TypeOwnershipTaken, "taken"
	if lost {
		typ, change = store.TypeOwnershipLost, "lost"
		c.health.setRole(RoleWaiting, "", now)
		if why != nil {
			c.health.setErr(why, now)
		}
	}
	var data []byte
	if why != nil {
		data = store.EventData{Error: why.Error(), ErrorKind: "ownership", Reason: owner}.Encode()
	} else {
		data = store.EventData{Reason: owner}.Encode()
	}
	c.hub.Publish([]store.Event{{Type: typ, Time: now, Data: data}})
	c.countOwnership(change)
}

// ErrStoreUnavailable matches the error of a call given up (its context
// ended) while the store was unreachable: its writes failed with transient
// errors and were being retried. Nothing of the call was stored: it is
// safe to make again. The error also matches the context's error, and
// says since when the store has been failing and its last error.
var ErrStoreUnavailable = writer.ErrUnavailable

// ErrOutcomeUnknown matches the error of a call given up (its context
// ended) while its write was in flight: it may or may not be stored.
// Retry a Submit with the same ID or IdempotencyKey, which stores a unit
// once whatever happened.
var ErrOutcomeUnknown = writer.ErrOutcomeUnknown

// retryRead runs read, and again after a pause while it fails with a
// transient error (store.FaultOf), until ctx ends: then the error matches
// ErrStoreUnavailable and ctx's error, and says since when the store has
// been failing and its last error.
func (c *Cue) retryRead(ctx context.Context, read func() error) error {
	var since time.Time
	pause := 50 * time.Millisecond
	for {
		err := read()
		if err == nil || ctx.Err() != nil || store.FaultOf(c.st, err) == store.Fatal || c.checkOpen() != nil {
			if err != nil && ctx.Err() != nil && !since.IsZero() {
				return &writer.UnavailableError{Since: since, Last: err, Cause: ctx.Err()}
			}
			return err
		}
		if since.IsZero() {
			since = c.clock.Now()
		}
		t := c.clock.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return &writer.UnavailableError{Since: since, Last: err, Cause: ctx.Err()}
		case <-t.C():
		}
		pause = min(2*pause, 2*time.Second)
	}
}
