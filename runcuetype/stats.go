package runcuetype

import (
	"encoding/json"
	"time"

	"github.com/runcue/runcue/store"
)

// Stats is a summary of a database's work and services. Taking it never
// scans the units: counts are kept as units change, throughput and queue
// wait per minute as they happen, and the oldest queued unit is read by
// index. It is correct in a process that does not own the database; there
// the services' figures are read from the database (see Services).
type Stats struct {
	// At is when the snapshot was taken.
	At time.Time `json:"at"`
	// Live reports that the service figures are the owner's live ones (in
	// this process, or asked of the owner in another; see Services).
	Live bool `json:"live"`
	// States counts the units by state; Tasks by task type and state.
	States map[store.State]int            `json:"states"`
	Tasks  map[string]map[store.State]int `json:"tasks"`
	// OldestQueued is when the queued unit submitted first was submitted;
	// zero if none is queued.
	OldestQueued time.Time `json:"oldest_queued,omitzero"`
	// QueuePaused and PausedTasks report PauseQueue and PauseTask.
	QueuePaused bool     `json:"queue_paused,omitempty"`
	PausedTasks []string `json:"paused_tasks,omitempty"`
	// Backpressure is the state of the queue's bound (Config.MaxQueued).
	Backpressure BackpressureStats `json:"backpressure"`
	// QueueWait summarizes, over the last StatsWindow, how long dispatched
	// units waited from becoming eligible to their dispatch.
	QueueWait QueueWaitStats `json:"queue_wait"`
	// Minutes are the last StatsWindow's minutes, oldest first, the
	// current one last (partial).
	Minutes []MinuteStats `json:"minutes"`
	// Services are the registered services (see Services), each with its
	// Retry-After answers over the window and its busiest keyed instances.
	Services []ServiceStats `json:"services"`
	// Schedules are the stored schedules, each with its next period.
	Schedules []ScheduleStatus `json:"schedules,omitempty"`
	// Patterns counts what debounce keys and sequences hold now, and the
	// batches run.
	Patterns PatternStats `json:"patterns"`
}

// PatternStats counts what the patterns hold now. Debouncing is the
// debounce keys (Task.Debounce) whose burst is settling: a queued unit
// that never started holds them. Sequences, SequenceWaiting and
// SequencesHeld are the owner's (Live): the sequence keys (Task.Sequence)
// with units waiting for their turn or held by a failure, the units
// waiting, and the keys a failed unit holds (HoldOnFailure). Batches and
// Batched are the owner's process's too: the batches of more than one
// unit it dispatched (Task.Batch) and the units in them, since it
// started; BatchesWaiting the batches waiting now for more units to join
// them (Batch.Wait).
type PatternStats struct {
	Debouncing      int   `json:"debouncing"`
	Sequences       int   `json:"sequences"`
	SequenceWaiting int   `json:"sequence_waiting"`
	SequencesHeld   int   `json:"sequences_held"`
	Batches         int64 `json:"batches"`
	Batched         int64 `json:"batched"`
	BatchesWaiting  int   `json:"batches_waiting"`
	Live            bool  `json:"live"`
}

// QueueWaitStats summarizes queue waits. Percentiles are read from a
// histogram: each is the upper bound of the bucket that holds it (1ms,
// 5ms, 10ms, 50ms, 100ms, 250ms, 500ms, 1s, 2.5s, 5s, 10s, 30s, 1m, 5m,
// 15m, 1h), or, past the last, that bound. They are not exact: a P95 of
// 5m means between 1m and 5m (Bounds says so).
type QueueWaitStats struct {
	Count int64
	P50   time.Duration
	P90   time.Duration
	P95   time.Duration
	P99   time.Duration
}

// MarshalJSON writes the durations as integer milliseconds.
func (q QueueWaitStats) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Count int64 `json:"count"`
		P50   int64 `json:"p50_ms"`
		P90   int64 `json:"p90_ms"`
		P95   int64 `json:"p95_ms"`
		P99   int64 `json:"p99_ms"`
	}{q.Count, q.P50.Milliseconds(), q.P90.Milliseconds(), q.P95.Milliseconds(), q.P99.Milliseconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (q *QueueWaitStats) UnmarshalJSON(b []byte) error {
	var j struct {
		Count int64 `json:"count"`
		P50   int64 `json:"p50_ms"`
		P90   int64 `json:"p90_ms"`
		P95   int64 `json:"p95_ms"`
		P99   int64 `json:"p99_ms"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*q = QueueWaitStats{Count: j.Count, P50: time.Duration(j.P50) * time.Millisecond,
		P90: time.Duration(j.P90) * time.Millisecond, P95: time.Duration(j.P95) * time.Millisecond, P99: time.Duration(j.P99) * time.Millisecond}
	return nil
}

// MinuteStats counts one minute's events: units started, completed,
// failed for good, failed and retried, skipped, cancelled, and runs
// deferred by a Retry-After (429, 503).
type MinuteStats struct {
	Minute    time.Time `json:"minute"`
	Started   int       `json:"started"`
	Completed int       `json:"completed"`
	Failed    int       `json:"failed"`
	Retried   int       `json:"retried"`
	Skipped   int       `json:"skipped"`
	Cancelled int       `json:"cancelled"`
	Deferred  int       `json:"deferred"`
}

// ServiceStats is a service in Stats.
type ServiceStats struct {
	ServiceStatus
	// Deferred counts the runs deferred by a Retry-After that held the
	// service over the window (a keyed instance's count toward its class).
	// A Retry-After that names services holds those; one that names none
	// holds all of the unit's, and counts for each.
	Deferred int `json:"deferred"`
	// Keys are the busiest keyed instances of the class, at most
	// StatsKeys: in the owner by units running, then waiting, then starts
	// in the window; elsewhere by logged starts in the window, with their
	// stored pause and circuit.
	Keys []ServiceStatus `json:"keys,omitempty"`
}

// StatsKeys is the most keyed instances Stats lists per class.
const StatsKeys = 10

// BackpressureStats is the state of backpressure: whether the queue reached
// HighWater of Config.MaxQueued and has not yet fallen back to LowWater.
//
// In the owning Cue it is the dispatcher's own state. Elsewhere it is the
// last backpressure event the owner recorded (EventBackpressureActive or
// EventBackpressureCleared), with the queue's size and bound at that
// moment; MaxQueued is zero when no such event is retained.
type BackpressureStats struct {
	// Active reports that backpressure is active: with OverflowReject,
	// submissions fail with ErrBackpressure.
	Active bool `json:"active"`
	// MaxQueued is the bound; zero if unbounded or unknown.
	MaxQueued int `json:"max_queued,omitempty"`
	// Queued is the number of queued units the owner counted (now in the
	// owner; when the event was recorded elsewhere).
	Queued int `json:"queued,omitempty"`
	// Since is when the state began (the event's time); zero if unknown.
	Since time.Time `json:"since,omitzero"`
}

// QueueStatus summarizes the owner's queue.
type QueueStatus struct {
	// Queued units are ready to run, waiting only for capacity or their turn.
	Queued int `json:"queued"`
	// Waiting units wait for a time: RunAt, retry backoff, Retry-After.
	Waiting int `json:"waiting"`
	// Blocked units wait for dependencies.
	Blocked int `json:"blocked"`
	// Running units are running.
	Running int `json:"running"`
	// Orphaned units have a task type not registered in the owner.
	Orphaned int `json:"orphaned,omitempty"`
	// Unloaded units are queued in the database but not yet loaded by the
	// owner, which loads a deep queue as dispatch makes room
	// (Config.LoadAhead). Stored submissions and cancellations made by
	// other processes since the owner started count once it loads.
	Unloaded int `json:"unloaded,omitempty"`
	// Backpressure reports that backpressure is active.
	Backpressure bool `json:"backpressure,omitempty"`
	// Paused reports that the queue is paused (PauseQueue).
	Paused bool `json:"paused,omitempty"`
}

// Bounds says which bucket of the histogram a percentile p of q falls
// in, as an operator should read it: "under 1ms", "1m0s-5m0s", "over
// 15m0s" (the last bucket's bound is also what a wait past it reads as);
// "-" when nothing was dispatched.
func (q QueueWaitStats) Bounds(p time.Duration) string {
	if q.Count == 0 {
		return "-"
	}
	bounds := store.QueueWaitBounds
	for i, b := range bounds {
		if p > b {
			continue
		}
		switch {
		case i == 0:
			return "under " + b.String()
		case i == len(bounds)-1:
			return "over " + bounds[i-1].String()
		default:
			return bounds[i-1].String() + "-" + b.String()
		}
	}
	return "over " + bounds[len(bounds)-1].String()
}
