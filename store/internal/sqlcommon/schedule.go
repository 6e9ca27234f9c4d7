package sqlcommon

import (
	"context"
	"encoding/json"
	"time"

	"github.com/runcue/runcue/store"
)

// PutSchedule applies a store.PutSchedule.
func PutSchedule(t Applier, op *store.PutSchedule, r *store.Result) error {
	data := store.ScheduleEventData{Schedule: op.Name}
	var changed bool
	var err error
	switch {
	case op.Delete:
		data.Change = "deleted"
		changed, err = t.Changed(`DELETE FROM schedules WHERE name=?`, op.Name)
		if err == nil && !changed {
			return &store.OpError{Err: store.ErrUnknownSchedule}
		}
	case op.Def != nil:
		data.Change = "registered"
		// A definition that changed resets the run-time timing and pause,
		// and starts from the change (no period of the new timing before
		// it is due); the same one changes nothing (no row counted).
		changed, err = t.Changed(`INSERT INTO schedules(name, def, created_at, last_at) VALUES(?, ?, ?, ?)
			ON CONFLICT(name) DO UPDATE SET def=excluded.def, timing=NULL, paused=false,
				last_at=CASE WHEN schedules.last_at < excluded.last_at THEN excluded.last_at ELSE schedules.last_at END,
				last_key=CASE WHEN schedules.last_at < excluded.last_at THEN '' ELSE schedules.last_key END
			WHERE schedules.def <> excluded.def`, op.Name, op.Def, Nanos(op.At), Nanos(op.At))
	default:
		if op.Timing != nil {
			data.Change = "retimed"
			// A new timing starts from the change, as a new definition.
			at := Nanos(op.At)
			changed, err = t.Changed(`UPDATE schedules SET timing=?,
				last_at=CASE WHEN last_at < ? THEN ? ELSE last_at END, last_key=CASE WHEN last_at < ? THEN '' ELSE last_key END
				WHERE name=?`, NullBytes(*op.Timing), at, at, at, op.Name)
		}
		if err == nil && op.Paused != nil {
			data.Change = map[bool]string{true: "paused", false: "resumed"}[*op.Paused]
			changed, err = t.Changed(`UPDATE schedules SET paused=? WHERE name=?`, *op.Paused, op.Name)
		}
		if err == nil && !changed {
			return &store.OpError{Err: store.ErrUnknownSchedule}
		}
	}
	if err != nil || !changed {
		return err
	}
	r.Applied = true
	return scheduleEvent(t, r, store.TypeScheduleChanged, "", "", data, op.At)
}

// Fire applies a store.Fire; insert applies the Insert of its unit as the
// backend does.
func Fire(t Applier, op *store.Fire, r *store.Result, insert func(*store.Insert, *store.Result) error) error {
	data := store.ScheduleEventData{Schedule: op.Schedule, Period: op.Key, Reason: op.Reason, Skipped: op.Skipped,
		FirstSkipped: op.FirstSkipped}
	unit := op.Unit
	if unit != nil && op.SkipIfRunning && op.Prev != "" {
		st, found, err := t.UnitState(op.Prev)
		if err != nil {
			return err
		}
		if found && (st == store.Queued || st == store.Running) {
			unit = nil
			data.Reason = "overlap"
			if data.Skipped == 0 {
				data.FirstSkipped = op.Key
			}
			data.Skipped++
		}
	}
	var id, task string
	if unit != nil {
		var ir store.Result
		if err := insert(&store.Insert{Units: []*store.Unit{unit}, At: op.At}, &ir); err != nil {
			return err
		}
		if ir.Err != nil {
			return &store.OpError{Err: ir.Err}
		}
		if iu := ir.Units[0]; iu.Refused != nil {
			return &store.OpError{Err: iu.Refused}
		}
		id, task = ir.Units[0].ID, unit.Task
		r.Units, r.Events = ir.Units, ir.Events
	} else if data.Skipped == 0 {
		data.Skipped, data.FirstSkipped = 1, op.Key
	}
	moved, err := t.Changed(`UPDATE schedules SET last_at=?, last_key=?, last_unit=CASE WHEN ?='' THEN last_unit ELSE ? END
		WHERE name=? AND (last_at < ? OR (last_at = ? AND last_key < ?))`,
		Nanos(op.Nominal), op.Key, id, id, op.Schedule, Nanos(op.Nominal), Nanos(op.Nominal), op.Key)
	if err != nil {
		return err
	}
	if !moved {
		return &store.OpError{Err: store.ErrScheduleMoved}
	}
	r.Applied = true
	typ := store.TypeScheduleSubmitted
	if unit == nil {
		typ = store.TypeScheduleSkipped
	}
	return scheduleEvent(t, r, typ, id, task, data, op.At)
}

func scheduleEvent(t Applier, r *store.Result, typ, id, task string, data store.ScheduleEventData, at time.Time) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	ev := store.Event{Type: typ, Time: at, WorkID: id, Task: task, Data: b}
	if err := t.Event(&ev, at); err != nil {
		return err
	}
	r.Events = append(r.Events, ev)
	return nil
}

// Schedules reads the stored schedules (name, def, timing, paused,
// created_at, last_at, last_key, last_unit).
func Schedules(ctx context.Context, q Query, sql string) ([]store.ScheduleRecord, error) {
	var out []store.ScheduleRecord
	err := collect(ctx, q, sql, nil, func(r Rows) error {
		var rec store.ScheduleRecord
		var created, last int64
		if err := r.Scan(&rec.Name, &rec.Def, &rec.Timing, &rec.Paused, &created, &last, &rec.LastKey, &rec.LastUnit); err != nil {
			return err
		}
		rec.Created, rec.LastAt = Time(created), Time(last)
		out = append(out, rec)
		return nil
	})
	return out, err
}
