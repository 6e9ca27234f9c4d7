package runcue

import (
	"context"
	"encoding/json"
	"fmt"
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
	EventWorkQueued EventType = store.TypeWorkQueued
	// EventWorkStarted: a run began.
	EventWorkStarted EventType = store.TypeWorkStarted
	// EventWorkCompleted: a run succeeded; Result holds its result.
	EventWorkCompleted EventType = store.TypeWorkCompleted
	// EventWorkSkipped: a handler ended its unit with Skip; Reason holds
	// the reason it gave.
	EventWorkSkipped EventType = store.TypeWorkSkipped
	// EventWorkFailed: a run failed; WillRetry says whether another follows.
	EventWorkFailed EventType = store.TypeWorkFailed
	// EventWorkRetrying: a unit will run again at NextAttempt.
	EventWorkRetrying EventType = store.TypeWorkRetrying
	// EventWorkCancelled: a unit was cancelled.
	EventWorkCancelled EventType = store.TypeWorkCancelled
	// EventWorkCancelRequested: a process that does not own the database
	// asked to cancel a running unit; the owner acts on it.
	EventWorkCancelRequested EventType = store.EventWorkCancelRequested
	// EventWorkRecovered: a unit left running by an owner that died was
	// requeued.
	EventWorkRecovered EventType = store.TypeWorkRecovered
	// EventWorkRequeued: a run interrupted by shutdown was requeued without
	// spending retry budget.
	EventWorkRequeued EventType = store.TypeWorkRequeued
	// EventStoreFailed: the store failed for good (a fatal error, see
	// docs/resilience.md), or this Cue lost ownership (ErrorKind
	// "not_owner"); the Cue stopped dispatching. Not durable (it could not
	// be stored); Seq is 0.
	EventStoreFailed EventType = store.TypeStoreFailed
	// EventStoreUnavailable: the store's writes began to fail with
	// transient errors (a lost connection, a restarting server, a lock
	// held elsewhere); the Cue retries them. Error holds the first error.
	// EventStoreRecovered: a write succeeded again. One of each per
	// outage, not per retry. Not durable; Seq is 0.
	EventStoreUnavailable EventType = store.TypeStoreUnavailable
	EventStoreRecovered   EventType = store.TypeStoreRecovered
	// EventOwnershipTaken: this Cue took ownership and dispatches (at
	// Start, as a standby, or again after losing it). EventOwnershipLost:
	// it lost ownership (its lease was not renewed in time, another Cue
	// took over, or its store failed): it stopped dispatching and
	// cancelled its handlers, and competes for ownership again unless its
	// store failed. Reason holds the owner's lease name; Error why it was
	// lost. Not durable; Seq is 0.
	EventOwnershipTaken EventType = store.TypeOwnershipTaken
	EventOwnershipLost  EventType = store.TypeOwnershipLost
	// EventServiceStatus: a service's health or load changed: its circuit,
	// a pause, a Retry-After, or it became saturated or free (coalesced to
	// at most one a second per service). Service holds its status. Not
	// durable; Seq is 0.
	EventServiceStatus EventType = store.TypeServiceStatus
	// EventWorkProgress: a handler reported progress (Work.Progress);
	// Progress holds the latest value. At most one a second per unit. Not
	// durable; Seq is 0.
	EventWorkProgress EventType = store.TypeWorkProgress
	// EventQueueStatus: the periodic summary of the queue
	// (Config.QueueStatusInterval); Queue holds it. Not durable; Seq is 0.
	EventQueueStatus EventType = store.TypeQueueStatus
	// EventGap: delivered first to a subscriber that resumed after events
	// that retention (Config.EventRetention) has since deleted;
	// MissedFrom..MissedTo is the range of sequence numbers it cannot
	// receive. Seq is 0.
	EventGap EventType = store.TypeGap
	// EventBackpressureActive: the queue reached HighWater of
	// Config.MaxQueued; EventBackpressureCleared: it fell back to LowWater.
	// Reported by the owning Cue; Queued and MaxQueued say how full it is.
	EventBackpressureActive  EventType = store.TypeBackpressureActive
	EventBackpressureCleared EventType = store.TypeBackpressureCleared
	// EventBudgetExhausted: a calendar budget of a service was spent: the
	// last request of its period was granted. Once per period and budget,
	// stored with that request's claim: WorkID, Task and Target are its
	// unit's. Service names the service (or keyed instance), Budget the
	// budget and when it resets.
	EventBudgetExhausted EventType = store.TypeBudgetExhausted
	// EventLimitAdapted: an adaptive limit (Service.Adaptive) changed:
	// Reason "lowered" by an overload signal (every cut is announced), or
	// "raised" (each rise of 5% of its configured value, and its return
	// to it). Stored with the Finish of the run whose end made the
	// change: WorkID, Task and Target are its unit's. Service names the
	// service (or keyed instance), with Adaptive set.
	EventLimitAdapted EventType = store.TypeLimitAdapted
	// EventLimitStated: a meter whose limit its provider states
	// (Meter.FromProvider) took a new limit from a response. Service
	// names the service (or keyed instance), with Meters holding the
	// meter and its limit now (Stated); Reason is "stated". Stored.
	EventLimitStated EventType = store.TypeLimitStated
	// EventTaskChanged: a task type was paused or resumed (PauseTask,
	// ResumeTask); Task names it, Reason is "paused" or "resumed".
	EventTaskChanged EventType = store.TypeTaskChanged
	// EventQueueChanged: the queue was paused or resumed (PauseQueue,
	// ResumeQueue); Reason is "paused" or "resumed".
	EventQueueChanged EventType = store.TypeQueueChanged
	// EventOwnerAsked and EventOwnerAnswered are in logs written by
	// runcue 0.1.0: a process that did not own the database asked the owner
	// about its live state (Explain, Services, Stats) through the log, and
	// the owner answered there. Reason holds the question's JSON ({"nonce",
	// "kind", "id"}, and "answer" in the answer). runcue no longer appends
	// them: questions travel outside the log. UIs may ignore both.
	EventOwnerAsked    EventType = store.TypeOwnerAsked
	EventOwnerAnswered EventType = store.TypeOwnerAnswered
	// EventServiceChanged: a service's override or pause was changed
	// (SetService, ResetService, PauseService, ResumeService). Service.Name
	// names it and Reason says what changed.
	EventServiceChanged EventType = store.TypeServiceChanged
	// EventScheduleSubmitted: a schedule submitted its period's unit
	// (WorkID). Schedule and Period name them. Reason "missed": the period
	// fell due while no owner ran the schedule (or while it was paused);
	// Skipped then counts the missed periods skipped before it (from
	// FirstSkipped).
	EventScheduleSubmitted EventType = store.TypeScheduleSubmitted
	// EventScheduleSkipped: a schedule skipped periods: Skipped of them,
	// from FirstSkipped to Period, for Reason "missed" (they fell due while
	// no owner ran it or while it was paused), "overlap" (the previous
	// unit was still queued or running; Schedule.SkipIfRunning) or
	// "refused: " and why the period's unit was refused (an Estimate that
	// failed, say).
	EventScheduleSkipped EventType = store.TypeScheduleSkipped
	// EventScheduleChanged: a schedule was registered with a new
	// definition, retimed, paused, resumed or deleted (Reason says which).
	EventScheduleChanged EventType = store.TypeScheduleChanged
)

// Event reports a change. Events of a Cue are delivered in commit order.
// Durable events have a Seq that increases strictly across the database's
// life; the events that are not stored (EventStoreFailed) have Seq 0.
type Event struct {
	Seq  int64     `json:"seq,omitempty"`
	Type EventType `json:"type"`
	Time time.Time `json:"time"`
	// WorkID and Task identify the unit, for work events.
	WorkID string `json:"work_id,omitempty"`
	Task   string `json:"task,omitempty"`
	// Target is the unit's target, for work events (none on events stored
	// by a runcue before schema 8).
	Target string `json:"target,omitempty"`
	// Attempt is the run number the event concerns, from 1; 0 before the
	// first run.
	Attempt int `json:"attempt,omitempty"`
	// Result is a completed unit's result (EventWorkCompleted).
	Result json.RawMessage `json:"result,omitempty"`
	// Error and ErrorKind describe a failure (EventWorkFailed,
	// EventStoreFailed). ErrorKind is one of error, timeout, panic,
	// prerequisite_failed, prerequisite_cancelled, prerequisite_skipped,
	// dependency_timeout.
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"error_kind,omitempty"`
	// WillRetry reports, for EventWorkFailed, that the unit will run again.
	WillRetry bool `json:"will_retry,omitempty"`
	// NextAttempt is when a retrying unit becomes eligible.
	NextAttempt time.Time `json:"next_attempt,omitzero"`
	// Reason qualifies the event (for example "shutdown" or "retry"); for
	// EventWorkSkipped it is the reason given to Skip.
	Reason string `json:"reason,omitempty"`
	// Services are the services a Retry-After held, for EventWorkRetrying
	// with Reason "retry_after" (keyed instances by their own names).
	Services []string `json:"services,omitempty"`
	// Service is the service's status, for EventServiceStatus, or just its
	// Name, for EventServiceChanged.
	Service *ServiceStatus `json:"service,omitempty"`
	// Budget is the spent budget, for EventBudgetExhausted.
	Budget *BudgetStatus `json:"budget,omitempty"`
	// Queued and MaxQueued are the queue's size and bound, for
	// EventBackpressureActive and EventBackpressureCleared.
	Queued    int `json:"queued,omitempty"`
	MaxQueued int `json:"max_queued,omitempty"`
	// Progress is the value a handler reported (EventWorkProgress).
	Progress json.RawMessage `json:"progress,omitempty"`
	// Queue is the queue summary (EventQueueStatus).
	Queue *QueueStatus `json:"queue,omitempty"`
	// MissedFrom and MissedTo bound the sequence numbers an EventGap says
	// are lost.
	MissedFrom int64 `json:"missed_from,omitempty"`
	MissedTo   int64 `json:"missed_to,omitempty"`
	// Schedule, Period, Skipped and FirstSkipped describe a schedule's
	// event (EventScheduleSubmitted, EventScheduleSkipped,
	// EventScheduleChanged).
	Schedule     string `json:"schedule,omitempty"`
	Period       string `json:"period,omitempty"`
	Skipped      int    `json:"skipped,omitempty"`
	FirstSkipped string `json:"first_skipped,omitempty"`
}

// budgetEventData is the data of a budget_exhausted event.
type budgetEventData struct {
	Service string       `json:"service"`
	Class   string       `json:"class"`
	Budget  BudgetStatus `json:"budget"`
}

// adaptEventData is the data of limit_adapted.
type adaptEventData struct {
	Service  string         `json:"service"`
	Class    string         `json:"class"`
	Adaptive AdaptiveStatus `json:"adaptive"`
	Change   string         `json:"change"`
}

// statedEventData is the data of limit_stated: the meter's limit now, and
// what the provider stated (above it when MaxLimit capped it).
type statedEventData struct {
	Service string `json:"service"`
	Class   string `json:"class"`
	Meter   string `json:"meter"`
	Limit   int64  `json:"limit"`
	Said    int64  `json:"said"`
}

// backpressureData is the data of backpressure_active and
// backpressure_cleared.
type backpressureData struct {
	Queued    int `json:"queued"`
	MaxQueued int `json:"max_queued"`
}

func eventFrom(se *store.Event) Event {
	ev := Event{Seq: se.Seq, Type: EventType(se.Type), Time: se.Time, WorkID: se.WorkID, Task: se.Task, Target: se.Target,
		Attempt: se.Attempt, Result: se.Result}
	switch ev.Type {
	case EventServiceStatus:
		var st ServiceStatus
		if json.Unmarshal(se.Data, &st) == nil {
			ev.Service = &st
		}
		return ev
	case EventWorkProgress:
		ev.Progress = json.RawMessage(se.Data)
		return ev
	case EventQueueStatus:
		var qs QueueStatus
		if json.Unmarshal(se.Data, &qs) == nil {
			ev.Queue = &qs
		}
		return ev
	case EventGap:
		var g struct{ From, To int64 }
		if json.Unmarshal(se.Data, &g) == nil {
			ev.MissedFrom, ev.MissedTo = g.From, g.To
		}
		return ev
	case EventBackpressureActive, EventBackpressureCleared:
		var data backpressureData
		if json.Unmarshal(se.Data, &data) == nil {
			ev.Queued, ev.MaxQueued = data.Queued, data.MaxQueued
		}
		return ev
	case EventBudgetExhausted:
		var data budgetEventData
		if json.Unmarshal(se.Data, &data) == nil {
			ev.Service, ev.Budget = &ServiceStatus{Name: data.Service, Class: data.Class}, &data.Budget
		}
		return ev
	case EventLimitAdapted:
		var data adaptEventData
		if json.Unmarshal(se.Data, &data) == nil {
			ev.Service = &ServiceStatus{Name: data.Service, Class: data.Class, Adaptive: &data.Adaptive}
			ev.Reason = data.Change
		}
		return ev
	case EventLimitStated:
		var data statedEventData
		if json.Unmarshal(se.Data, &data) == nil {
			ev.Service = &ServiceStatus{Name: data.Service, Class: data.Class,
				Meters: []MeterStatus{{Name: data.Meter, Limit: data.Limit, Stated: true}}}
			ev.Reason = "stated"
		}
		return ev
	case EventOwnerAsked, EventOwnerAnswered:
		ev.Reason = string(se.Data)
		return ev
	case EventScheduleSubmitted, EventScheduleSkipped, EventScheduleChanged:
		var data store.ScheduleEventData
		if json.Unmarshal(se.Data, &data) == nil {
			ev.Schedule, ev.Period, ev.Skipped, ev.FirstSkipped = data.Schedule, data.Period, data.Skipped, data.FirstSkipped
			ev.Reason = data.Reason
			if data.Change != "" {
				ev.Reason = data.Change
			}
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
		d := store.DecodeEventData(se.Data)
		ev.Error, ev.ErrorKind, ev.WillRetry, ev.Reason, ev.Services = d.Error, d.ErrorKind, d.WillRetry, d.Reason, d.Services
		if d.NextAttempt != 0 {
			ev.NextAttempt = time.Unix(0, d.NextAttempt)
		}
	}
	return ev
}

// Events delivers every event committed from now on, in order, until ctx
// ends or the Cue closes; then the channel closes. It is Subscribe with the
// default options.
//
// On a closed Cue it logs a warning and returns a closed channel; use
// Subscribe to get ErrClosed instead.
func (c *Cue) Events(ctx context.Context) <-chan Event {
	ch, _, err := c.Subscribe(ctx, SubscribeOptions{After: SeqNow})
	if err != nil {
		c.log.Warn("runcue: Events on a closed Cue: the channel is closed", "error", err)
		closed := make(chan Event)
		close(closed)
		return closed
	}
	return ch
}

// SeqNow, as SubscribeOptions.After, starts a subscription at the present.
const SeqNow int64 = -1

// SubscribeOptions select what a subscription delivers.
type SubscribeOptions struct {
	// Types, when set, delivers only these event types.
	Types []EventType
	// Tasks, when set, delivers only events of units of these task types
	// (and no event without a unit).
	Tasks []string
	// After resumes after this sequence number: every durable event with a
	// higher Seq is delivered, including those committed while the
	// subscriber was away, across restarts. Zero delivers the whole
	// retained log; SeqNow starts at the present.
	After int64
	// Buffer is the capacity of the returned channel. Default 64.
	Buffer int
	// Name makes the subscription durable: its position, the sequence
	// number of the last event its consumer acknowledged with Ack, is
	// stored in the database, and retention keeps the events after it
	// (up to Config.SubscriptionRetention). A name new to the database
	// starts at After (SeqNow: the present, recorded as the last event
	// committed); a known name resumes after its last acknowledgement,
	// whatever After says, in this process or any other, after a crash
	// or a restart. Events after the acknowledged position may be
	// delivered again after a crash: handle them idempotently (follow-up
	// work with idempotency keys derived from the event). Two
	// subscriptions with one name share the position.
	//
	// The filter (Types, Tasks) of the latest Subscribe with a name is
	// stored with it. Its consumer never receives the events the filter
	// skips, so they need no acknowledgement: once every matching event up
	// to a point is acknowledged, the subscription has passed the point,
	// for Drain (Config.DrainSubscriptions), Subscriptions (Position) and
	// retention alike.
	Name string
}

// LastSeq returns the sequence number of the last durable event committed
// to the database, by any process (0 if none). Read it before a snapshot
// (Stats, List, Get), then Subscribe with After set to it: the
// subscription delivers every event committed after the number was read,
// so no change made after the snapshot goes unseen.
func (c *Cue) LastSeq(ctx context.Context) (int64, error) {
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	seq, err := c.st.LastSeq(ctx)
	if err != nil {
		return 0, c.readErr(err)
	}
	return seq, nil
}

// Subscribe delivers events until ctx ends, cancel is called, or the Cue
// closes; then the channel closes.
//
// Durable events (all but work_progress, queue_status, service_status and
// store_failed) are delivered in order, without gaps or duplicates, also to
// a subscriber that reads slowly or resumes with After: a subscriber never
// slows the Cue; what it has not read yet stays in a bounded buffer shared
// by all subscribers and, beyond it, is read back from the database a page
// at a time. If retention has deleted events after After, an EventGap comes
// first. The other events are delivered live, and skipped for a subscriber
// too far behind.
//
// Subscribe on a closed Cue returns ErrClosed; options out of range (After
// below SeqNow, a negative Buffer) return an error matching ErrInvalid.
func (c *Cue) Subscribe(ctx context.Context, o SubscribeOptions) (<-chan Event, context.CancelFunc, error) {
	if err := c.checkOpen(); err != nil {
		return nil, func() {}, err
	}
	if o.After < SeqNow || o.Buffer < 0 {
		return nil, func() {}, fmt.Errorf("%w: SubscribeOptions After %d (want SeqNow or a sequence number) or Buffer %d", ErrInvalid, o.After, o.Buffer)
	}
	if o.Name != "" {
		after, err := c.subscriptionStart(ctx, o.Name, o.After, o.Types, o.Tasks)
		if err != nil {
			return nil, func() {}, err
		}
		o.After = after
	}
	ctx, cancel := context.WithCancel(ctx)
	buf := o.Buffer
	if buf <= 0 {
		buf = 64
	}
	after := o.After
	if after < 0 {
		after = -1
	}
	var types map[string]bool
	if len(o.Types) > 0 {
		types = make(map[string]bool, len(o.Types))
		for _, t := range o.Types {
			types[string(t)] = true
		}
	}
	var tasks map[string]bool
	if len(o.Tasks) > 0 {
		tasks = make(map[string]bool, len(o.Tasks))
		for _, t := range o.Tasks {
			tasks[t] = true
		}
	}
	accept := func(e *store.Event) bool {
		if types != nil && !types[e.Type] && e.Type != string(EventGap) {
			return false
		}
		if tasks != nil && !tasks[e.Task] {
			return false
		}
		return true
	}
	gap := func(after, first int64) store.Event {
		if o.Name != "" {
			c.mach.tel.CountGap(o.Name)
			c.log.Warn("runcue: a durable subscription resumed after events retention deleted", "subscription", o.Name,
				"missed_from", after+1, "missed_to", first-1)
		}
		data, _ := json.Marshal(struct{ From, To int64 }{after + 1, first - 1})
		return store.Event{Type: string(EventGap), Time: c.clock.Now(), Data: data}
	}
	if types == nil && tasks == nil {
		accept = nil
	}
	ho := hub.Options{After: after, Buffer: buf, Accept: accept, Gap: gap, OnClose: cancel, Tasks: o.Tasks}
	for _, t := range o.Types {
		ho.Types = append(ho.Types, string(t))
	}
	if len(ho.Types) > 0 {
		ho.Types = append(ho.Types, string(EventGap)) // delivered whatever the filter
	}
	return hub.Subscribe(ctx, c.hub, ho, eventFrom), cancel, nil
}
