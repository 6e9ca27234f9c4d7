package runcue

import (
	"context"
	"encoding/json"
	"time"

	"github.com/runcue/runcue/internal/hub"
	"github.com/runcue/runcue/store"
)

// EventType names an event. The strings are stable: UIs and logs key on
// them.
type EventType string

// Event types.
const (
	// EventWorkQueued: a unit was submitted, or requeued by Retry.
	EventWorkQueued EventType = "work_queued"
	// EventWorkStarted: a run began.
	EventWorkStarted EventType = "work_started"
	// EventWorkCompleted: a run succeeded; Result holds its result.
	EventWorkCompleted EventType = "work_completed"
	// EventWorkFailed: a run failed; WillRetry says whether another follows.
	EventWorkFailed EventType = "work_failed"
	// EventWorkRetrying: a unit will run again at NextAttempt.
	EventWorkRetrying EventType = "work_retrying"
	// EventWorkCancelled: a unit was cancelled.
	EventWorkCancelled EventType = "work_cancelled"
	// EventWorkCancelRequested: a process that does not own the database
	// asked to cancel a running unit; the owner acts on it.
	EventWorkCancelRequested EventType = store.EventWorkCancelRequested
	// EventWorkRecovered: a unit left running by an owner that died was
	// requeued.
	EventWorkRecovered EventType = "work_recovered"
	// EventWorkRequeued: a run interrupted by shutdown was requeued without
	// spending retry budget.
	EventWorkRequeued EventType = "work_requeued"
	// EventStoreFailed: the store failed; the Cue stopped dispatching. Not
	// durable (it could not be stored); Seq is 0.
	EventStoreFailed EventType = "store_failed"
	// EventServiceStatus: a service's health or load changed: its circuit,
	// a pause, a Retry-After, or it became saturated or free (coalesced to
	// at most one a second per service). Service holds its status. Not
	// durable; Seq is 0.
	EventServiceStatus EventType = "service_status"
	// EventBackpressureActive: the queue reached HighWater of
	// Config.MaxQueued; EventBackpressureCleared: it fell back to LowWater.
	// Reported by the owning Cue; Queued and MaxQueued say how full it is.
	EventBackpressureActive  EventType = "backpressure_active"
	EventBackpressureCleared EventType = "backpressure_cleared"
	// EventServiceChanged: a service's override or pause was changed
	// (SetService, ResetService, PauseService, ResumeService). Service.Name
	// names it and Reason says what changed.
	EventServiceChanged EventType = "service_changed"
)

// Event reports a change. Events of a Cue are delivered in commit order.
// Durable events have a Seq that increases strictly across the database's
// life; the events that are not stored (EventStoreFailed) have Seq 0.
type Event struct {
	Seq  int64
	Type EventType
	Time time.Time
	// WorkID and Task identify the unit, for work events.
	WorkID string
	Task   string
	// Attempt is the run number the event concerns, from 1; 0 before the
	// first run.
	Attempt int
	// Result is a completed unit's result (EventWorkCompleted).
	Result json.RawMessage
	// Error and ErrorKind describe a failure (EventWorkFailed,
	// EventStoreFailed). ErrorKind is one of error, timeout, panic,
	// prerequisite_failed, prerequisite_cancelled, dependency_timeout.
	Error     string
	ErrorKind string
	// WillRetry reports, for EventWorkFailed, that the unit will run again.
	WillRetry bool
	// NextAttempt is when a retrying unit becomes eligible.
	NextAttempt time.Time
	// Reason qualifies the event (for example "shutdown" or "retry").
	Reason string
	// Service is the service's status, for EventServiceStatus, or just its
	// Name, for EventServiceChanged.
	Service *ServiceStatus
	// Queued and MaxQueued are the queue's size and bound, for
	// EventBackpressureActive and EventBackpressureCleared.
	Queued    int
	MaxQueued int
}

// eventData is the JSON payload of a stored event.
type eventData struct {
	Error        string `json:"error,omitempty"`
	ErrorKind    string `json:"error_kind,omitempty"`
	WillRetry    bool   `json:"will_retry,omitempty"`
	NextAttempt  int64  `json:"next_attempt,omitempty"`
	Reason       string `json:"reason,omitempty"`
	Prerequisite string `json:"prerequisite,omitempty"`
}

func (d eventData) encode() []byte {
	if d == (eventData{}) {
		return nil
	}
	b, _ := json.Marshal(d)
	return b
}

func eventFrom(se *store.Event) Event {
	ev := Event{Seq: se.Seq, Type: EventType(se.Type), Time: se.Time, WorkID: se.WorkID, Task: se.Task,
		Attempt: se.Attempt, Result: se.Result}
	switch ev.Type {
	case EventServiceStatus:
		var st ServiceStatus
		if json.Unmarshal(se.Data, &st) == nil {
			ev.Service = &st
		}
		return ev
	case EventBackpressureActive, EventBackpressureCleared:
		var data backpressureData
		if json.Unmarshal(se.Data, &data) == nil {
			ev.Queued, ev.MaxQueued = data.Queued, data.MaxQueued
		}
		return ev
	case EventServiceChanged:
		var data struct {
			Service string `json:"service"`
			Change  string `json:"change"`
		}
		if json.Unmarshal(se.Data, &data) == nil {
			ev.Service, ev.Reason = &ServiceStatus{Name: data.Service, Class: data.Service}, data.Change
		}
		return ev
	}
	if len(se.Data) > 0 {
		var d eventData
		if json.Unmarshal(se.Data, &d) == nil {
			ev.Error, ev.ErrorKind, ev.WillRetry, ev.Reason = d.Error, d.ErrorKind, d.WillRetry, d.Reason
			if d.NextAttempt != 0 {
				ev.NextAttempt = time.Unix(0, d.NextAttempt)
			}
		}
	}
	return ev
}

// Events delivers the events committed from now on, in order, until ctx
// ends or the Cue closes; then the channel closes. A subscriber that reads
// slowly never slows the Cue: events it has not read yet are kept in a
// bounded buffer and, beyond it, read back from the database.
func (c *Cue) Events(ctx context.Context) <-chan Event {
	return hub.Subscribe(ctx, c.hub, hub.Options{After: -1, Buffer: 64}, eventFrom)
}
