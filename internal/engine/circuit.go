package engine

import (
	"encoding/json"
	"maps"
	"slices"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Circuit breakers, as the dispatcher runs them: judging runs, acting on
// changes of state, persisting and restoring them (the states and rules
// are in internal/broker; the vocabulary in runcue's circuit.go).

// verdict is what a run's end says about its services' health.
type verdict = broker.Verdict

const (
	verdictNone    = broker.Neutral // says nothing: cancelled, interrupted, permanent input error, Retry-After
	verdictSuccess = broker.Success // closes a half-open circuit, resets the failure count
	verdictFailure = broker.Failure // counts toward opening the circuit
)

// judge passes a run's verdict to the circuits of its services. A closed
// circuit's count of consecutive failures is persisted when it changes, so
// that a new owner opens the circuit after the same failures.
func (t *resourceTable) judge(r *run, v verdict) {
	now := t.now()
	for _, res := range r.lane.resources {
		if res.Circuit == nil {
			continue
		}
		failures := res.Circuit.Failures
		if res.Judge(now, v, slices.Contains(r.probes, res)) {
			t.noteCircuit(res)
			t.wake(res)
		} else if res.Circuit.Failures != failures && res.Circuit.State == rt.CircuitClosed {
			t.persistBroker(res)
		}
	}
}

// noteCircuit acts on a circuit's change of state, if it changed: it logs,
// persists and reports it, and arms a timer for an open circuit's end.
func (t *resourceTable) noteCircuit(r *resource) {
	from, to, changed := r.CircuitChange()
	if !changed {
		return
	}
	switch to {
	case rt.CircuitOpen:
		t.log.Warn("circuit_opened", "service", r.name, "failures", r.Circuit.Threshold, "from", string(from),
			"until", r.Circuit.Until)
		t.resourceTimer(r, r.Circuit.Until)
	default:
		t.log.Info("circuit_"+string(to), "service", r.name, "from", string(from))
	}
	t.countOpenCircuits()
	t.persistBroker(r)
	t.markStatus(r)
}

// restore applies a stored record to r. The wall clock may have been set
// since the record was written: a hold never lasts longer from now than it
// did when it was set (an open circuit its CircuitTimeout, a Retry-After
// its own length), so a clock set back does not stretch it.
func (t *resourceTable) restore(cr store.CircuitRecord, r *resource) {
	wall := t.wall()
	if r.Circuit != nil && cr.State != "" {
		r.Circuit.State, r.Circuit.Failures = rt.CircuitState(cr.State), cr.Failures
		if cr.State == string(rt.CircuitHalfOpen) {
			r.Circuit.State = rt.CircuitOpen // the probe died with the old owner: probe again
		}
		if cr.Until != 0 {
			until := min(time.Unix(0, cr.Until).Sub(wall), r.Circuit.Timeout)
			r.Circuit.Until = t.now().Add(until)
		}
	}
	if cr.BlockedUntil != 0 {
		left := time.Unix(0, cr.BlockedUntil).Sub(wall)
		if cr.BlockedFor > 0 {
			left = min(left, time.Duration(cr.BlockedFor))
		}
		if left > 0 {
			r.BlockedUntil, r.BlockedFor = t.now().Add(left), time.Duration(cr.BlockedFor)
		}
	}
}

// persistBroker stores r's circuit and Retry-After hold (the circuit
// meter's state, store.MeterCircuit).
func (t *resourceTable) persistBroker(r *resource) {
	var cr store.CircuitRecord
	switch {
	case r.Circuit == nil:
	case r.Circuit.State != rt.CircuitClosed:
		cr.State, cr.Failures, cr.Until = string(r.Circuit.State), r.Circuit.Failures, ns(t.toWall(r.Circuit.Until))
	case r.Circuit.Failures > 0:
		cr.State, cr.Failures = string(rt.CircuitClosed), r.Circuit.Failures
	}
	if r.BlockedUntil.After(t.now()) {
		cr.BlockedUntil, cr.BlockedFor = t.toWall(r.BlockedUntil).UnixNano(), int64(r.BlockedFor)
	}
	blob := []byte{} // empty: delete the row
	if cr != (store.CircuitRecord{}) {
		blob, _ = json.Marshal(cr)
	}
	t.putMeterState(r.name, store.MeterCircuit, blob)
}

// putMeterState records meter's state of service as stored (for a
// reload of the service's record, and Quiet) and persists it.
func (t *resourceTable) putMeterState(service, meter string, blob []byte) {
	rec := t.stored[service]
	rec.Name = service
	rec.Meters = maps.Clone(rec.Meters)
	if rec.Meters == nil {
		rec.Meters = make(map[string][]byte, 1)
	}
	rec.Meters[meter] = blob
	t.stored[service] = rec
	t.persist(&store.PutMeterState{Epoch: t.epoch, Service: service, Meter: meter, State: blob})
}
