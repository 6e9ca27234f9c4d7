package store

import "time"

// A Journal records what one transaction changes in the counts a backend
// keeps (Counts, QueuedCount, Activity, QueueWaits), so that the backend
// writes them once, at commit, in a statement or two, instead of a write
// per unit. A backend rolling an op back truncates it to its length before
// the op.
type Journal struct {
	// Counted are the changes of the unit counts, in order; Queued their
	// sum for the queued state (for the queue bound, Tx.QueuedCount).
	Counted []CountDelta
	Queued  int
	// Activity are the activity counts and (Bucket > 0) queue-wait
	// counts to add, one entry per event or dispatch.
	Activity []ActivityKey
}

// CountDelta is a change of the count of units of Task in State.
type CountDelta struct {
	Task  string
	State State
	D     int
}

// ActivityKey is one count to add: of the activity of Kind for Task in
// Minute (minutes since the Unix epoch) or, when Bucket > 0, of the
// queue-wait histogram's bucket Bucket-1 in Minute.
type ActivityKey struct {
	Minute int64
	Task   string
	Kind   string
	Bucket int
}

// Moved records that a unit of task went from state from to state to (""
// for a unit inserted or deleted).
func (j *Journal) Moved(task string, from, to State) {
	if from == to {
		return
	}
	if from != "" {
		j.Counted = append(j.Counted, CountDelta{task, from, -1})
		if from == Queued {
			j.Queued--
		}
	}
	if to != "" {
		j.Counted = append(j.Counted, CountDelta{task, to, 1})
		if to == Queued {
			j.Queued++
		}
	}
}

// NoteActivity counts ev in the activity (ActivityOf).
func (j *Journal) NoteActivity(ev *Event) {
	kind, classes, ok := ActivityOf(ev)
	if !ok {
		return
	}
	minute := ev.Time.UnixNano() / int64(time.Minute)
	for _, class := range classes {
		j.Activity = append(j.Activity, ActivityKey{Minute: minute, Task: class, Kind: ActivityServiceDeferred})
	}
	j.Activity = append(j.Activity, ActivityKey{Minute: minute, Task: ev.Task, Kind: kind})
}

// NoteWait counts a dispatch's queue wait.
func (j *Journal) NoteWait(at time.Time, wait time.Duration) {
	j.Activity = append(j.Activity, ActivityKey{Minute: at.UnixNano() / int64(time.Minute), Bucket: WaitBucket(wait) + 1})
}

// A JournalMark is a journal's length at a point (Mark).
type JournalMark struct{ queued, counted, activity int }

// Mark returns the journal's length now, to roll back to (Rollback).
func (j *Journal) Mark() JournalMark {
	return JournalMark{j.Queued, len(j.Counted), len(j.Activity)}
}

// Rollback truncates the journal to mark: what an op rolled back noted.
func (j *Journal) Rollback(m JournalMark) {
	j.Queued, j.Counted, j.Activity = m.queued, j.Counted[:m.counted], j.Activity[:m.activity]
}
