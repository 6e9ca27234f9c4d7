package store

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// The rules of the owner's maintenance: recovery (what an earlier owner
// left running), retention (what is old enough to delete), and what a
// backend derives from the events it appends (the activity counts, the
// attempt record).

// ApplyRecover applies a Recover. A run of an earlier epoch whose owner is
// gone (op.PreviousDead) or whose lease has expired by op.At is over: its
// unit is cancelled if its cancellation was requested (with its
// dependents), requeued otherwise, with an "abandoned" attempt and an
// event. A run whose lease still holds is left running (r.Held): its owner
// may be alive (partitioned, paused) and its handler running, so it counts
// against its services until its lease ends. A run assigned to an executor
// is held while its lease holds and its executor is registered and
// heartbeating, whatever became of the earlier owner; otherwise it is over
// too, and its assignment is deleted.
func ApplyRecover(tx Tx, op *Recover, r *Result) error {
	runs, err := tx.RunningUnits(op.Only)
	if err != nil {
		return err
	}
	for _, x := range runs {
		if x.Epoch >= op.Epoch {
			continue // this owner's own run
		}
		held := !op.PreviousDead && x.LeaseExpires.After(op.At) && !slices.Contains(op.Ended, RunRef{ID: x.ID, Run: x.Runs, Epoch: x.Epoch})
		why := "owner stopped before the run finished"
		if x.Executor != "" {
			// Its lease is its executor's, whose heartbeat keeps it: the
			// earlier owner's death says nothing of it.
			held = x.LeaseExpires.After(op.At) && op.At.Before(x.ExecutorSeen.Add(x.ExecutorTTL))
			why = "executor stopped before the run finished"
		}
		if held {
			r.Held = append(r.Held, x.ID)
			continue
		}
		if x.Executor != "" {
			if err := tx.Unassign(x.ID, x.Runs); err != nil {
				return err
			}
		}
		att := Attempt{Run: x.Runs, Start: x.Started, End: op.At, Outcome: "abandoned", Error: why}
		if x.CancelRequested {
			ok, err := tx.EndRunning(x.ID, x.Runs, Cancelled, op.At, att, "cancelled", "cancelled")
			if err != nil || !ok {
				return err
			}
			ev := []Event{{Type: EventWorkCancelled, Task: x.Task, Attempt: x.Runs}}
			if err := AppendEvents(tx, r, ev, x.ID, x.Target, op.At); err != nil {
				return err
			}
			if err := Propagate(tx, x.ID, Cancelled, false, op.At, r); err != nil {
				return err
			}
			r.Applied = true
			continue
		}
		ok, err := tx.EndRunning(x.ID, x.Runs, Queued, op.At, att, "", "")
		if err != nil || !ok {
			return err
		}
		ev := []Event{{Type: EventWorkRecovered, Task: x.Task, Attempt: x.Runs}}
		if err := AppendEvents(tx, r, ev, x.ID, x.Target, op.At); err != nil {
			return err
		}
		r.IDs = append(r.IDs, x.ID)
		r.Applied = true
	}
	return nil
}

// ApplyPrune applies a Prune: finished units, events, activity counts and
// service log entries older than its times. Events go as a prefix of the
// log (they are appended in time order): those before the first event at
// or after EventsBefore and, with EventsHardBefore, no further than every
// named subscription's position (its acknowledgement, or what Passed says
// it may pass) unless older than EventsHardBefore.
func ApplyPrune(tx Tx, op *Prune, r *Result) error {
	limit := max(op.Limit, 0)
	if !op.Before.IsZero() {
		n, err := tx.PruneFinished(op.Before, limit)
		if err != nil {
			return err
		}
		r.Count = n
		r.More = limit > 0 && n == limit
	}
	if !op.EventsBefore.IsZero() {
		cut, err := tx.FirstEventAt(op.EventsBefore)
		if err != nil {
			return err
		}
		if !op.EventsHardBefore.IsZero() {
			positions, err := tx.SubscriptionPositions()
			if err != nil {
				return err
			}
			hard, err := tx.FirstEventAt(op.EventsHardBefore)
			if err != nil {
				return err
			}
			cut = max(min(cut, SubscriptionFloor(positions, op.Passed)), hard)
		}
		more, err := tx.PruneEvents(cut, limit)
		if err != nil {
			return err
		}
		r.More = r.More || more
	}
	if !op.ActivityBefore.IsZero() {
		if err := tx.PruneActivity(op.ActivityBefore); err != nil {
			return err
		}
	}
	for svc, before := range op.LogBefore {
		more, err := tx.PruneLog(svc, before, limit)
		if err != nil {
			return err
		}
		r.More = r.More || more
	}
	r.Applied = true
	return nil
}

// SubscriptionFloor returns the first event a named subscription still
// needs: the least position (its acknowledgement, or what passed says it
// may pass) plus one; 1<<62 without subscriptions.
func SubscriptionFloor(positions, passed map[string]int64) int64 {
	floor := int64(1 << 62)
	for name, pos := range positions {
		if p, ok := passed[name]; ok && p > pos {
			pos = p
		}
		floor = min(floor, pos+1)
	}
	return floor
}

// ActivityOf returns what an appended event adds to the per-minute activity
// (see ActivityCount): its kind for its task (ok false: it counts for
// nothing), and for a deferral the classes of the services it held, each
// once. It reads the event's type and typed Detail, never its Data.
func ActivityOf(ev *Event) (kind string, deferredClasses []string, ok bool) {
	switch ev.Type {
	case TypeWorkStarted, TypeWorkCompleted, TypeWorkSkipped, TypeWorkCancelled:
		return ev.Type, nil, true
	case TypeWorkFailed:
		if ev.Detail != nil && ev.Detail.WillRetry {
			return "work_failed_retry", nil, true
		}
		return ev.Type, nil, true
	case TypeWorkRetrying:
		if ev.Detail == nil || ev.Detail.Reason != "retry_after" {
			return "", nil, false
		}
		for _, s := range ev.Detail.Services {
			class, _, _ := strings.Cut(s, ":")
			seen := false
			for _, c := range deferredClasses {
				seen = seen || c == class
			}
			if !seen {
				deferredClasses = append(deferredClasses, class)
			}
		}
		return "work_deferred", deferredClasses, true
	}
	return "", nil, false
}

// AttemptJSON is an attempt's stored form, an entry of a unit's history:
// {"run":N,"start":ns,"end":ns,"outcome":"...","error":"..."}.
func AttemptJSON(a Attempt) string {
	b := make([]byte, 0, 96+len(a.Error))
	b = append(b, `{"run":`...)
	b = strconv.AppendInt(b, int64(a.Run), 10)
	b = append(b, `,"start":`...)
	b = strconv.AppendInt(b, unixNano(a.Start), 10)
	b = append(b, `,"end":`...)
	b = strconv.AppendInt(b, unixNano(a.End), 10)
	b = append(b, `,"outcome":`...)
	b = appendJSONString(b, a.Outcome)
	if a.Error != "" {
		b = append(b, `,"error":`...)
		b = appendJSONString(b, a.Error)
	}
	if len(a.Used) > 0 {
		names := make([]string, 0, len(a.Used))
		for name := range a.Used {
			names = append(names, name)
		}
		slices.Sort(names)
		b = append(b, `,"used":{`...)
		for i, name := range names {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, name)
			b = append(b, ':')
			b = strconv.AppendInt(b, a.Used[name], 10)
		}
		b = append(b, '}')
	}
	b = append(b, '}')
	return unsafe.String(unsafe.SliceData(b), len(b)) // b is not used again: no copy
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
