package sqlite

import (
	"context"

	"github.com/runcue/runcue/store"
)

// convertChunk is the most events one transaction of the conversion to
// blocks moves. (A variable for the tests.)
var convertChunk = 16384

// convertHalt, when set (by the tests), is called after each chunk the
// conversion commits, with their count; an error stops the conversion
// there, as a kill would.
var convertHalt func(chunks int) error

// convertEvents moves the events of a schema 11 log (one row per event)
// into blocks, oldest first, a chunk per transaction, appending each unit's
// events to its record; it drops the events table once empty. Killed
// midway, it resumes at the next Open where it stopped: each chunk deletes
// the rows it moved in the transaction that stores their blocks.
func (s *Store) convertEvents(ctx context.Context) error {
	for chunks := 1; ; chunks++ {
		done, err := s.convertChunk(ctx)
		if err != nil || done {
			return err
		}
		if convertHalt != nil {
			if err := convertHalt(chunks); err != nil {
				return err
			}
		}
	}
}

func (s *Store) convertChunk(ctx context.Context) (done bool, err error) {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var exists int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'events'`).Scan(&exists); err != nil {
		return false, err
	}
	if exists == 0 {
		return true, nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT seq, type, at, coalesce(work_id, ''), coalesce(task, ''), coalesce(target, ''), attempt, data
		FROM events ORDER BY seq LIMIT ?`, convertChunk)
	if err != nil {
		return false, err
	}
	var evs []store.Event
	for rows.Next() {
		var e store.Event
		var at int64
		if err := rows.Scan(&e.Seq, &e.Type, &at, &e.WorkID, &e.Task, &e.Target, &e.Attempt, &e.Data); err != nil {
			rows.Close()
			return false, err
		}
		e.Time = tm(at)
		evs = append(evs, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	if len(evs) == 0 {
		if _, err := tx.ExecContext(ctx, `DROP TABLE events`); err != nil {
			return false, err
		}
		return true, tx.Commit()
	}
	var enc store.BlockEncoder
	for start := 0; start < len(evs); start += store.MaxBlockEvents {
		enc.Reset()
		for i := start; i < min(start+store.MaxBlockEvents, len(evs)); i++ {
			enc.Add(&evs[i])
		}
		b := enc.Block(false)
		if _, err := tx.ExecContext(ctx, `INSERT INTO event_blocks(last, first, min_at, max_at, data) VALUES(?,?,?,?,?)`,
			b.Last, b.First, b.MinAt, b.MaxAt, b.Data); err != nil {
			return false, err
		}
	}
	recs := map[string][]byte{}
	var order []string
	for _, e := range evs {
		if e.WorkID == "" {
			continue
		}
		if _, ok := recs[e.WorkID]; !ok {
			order = append(order, e.WorkID)
		}
		recs[e.WorkID] = store.AppendUnitRecord(recs[e.WorkID], e.Seq, false)
	}
	up, err := tx.PrepareContext(ctx, recordUpdates[1]) // (UPDATE ... FROM one row)
	if err != nil {
		return false, err
	}
	defer up.Close()
	for _, id := range order {
		if _, err := up.ExecContext(ctx, id, recs[id]); err != nil {
			return false, err
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE seq <= ?`, evs[len(evs)-1].Seq); err != nil {
		return false, err
	}
	return false, tx.Commit()
}
