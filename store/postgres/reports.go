package postgres

import (
	"context"
	"strings"

	"github.com/runcue/runcue/store"
)

// An executor's batch of reports (lockFree: ReportStart and ReportEnd ops
// only) is written by one statement, in a round trip, as its own
// transaction: it appends no event and takes no turn on the log's lock, and
// its notification is part of the statement. A start and an end of one run
// in the same batch (a handler that returned before its start was written)
// become one write of the row.

// report is one run's reports in a batch.
type report struct {
	k          int // its place in the statement's arrays
	start, end int // the ops' indexes, -1 for none
}

// applyReports writes the batch ops, all reports; ok is false when it
// cannot (two runs of one unit in the batch: Apply's transaction then
// writes them one statement per kind, in order).
func (s *Store) applyReports(ctx context.Context, ops []store.Op) (b store.Batch, ok bool, err error) {
	byID := make(map[string]*report, len(ops))
	var ids, execs []string
	var runs []int32
	var ats []int64
	var endings [][]byte
	var ended []bool
	var order []*report
	for i, op := range ops {
		var id, exec string
		var run int
		switch op := op.(type) {
		case *store.ReportStart:
			id, exec, run = op.ID, op.Executor, op.Run
		case *store.ReportEnd:
			id, exec, run = op.ID, op.Executor, op.Run
		}
		r := byID[id]
		if r == nil {
			r = &report{k: len(order), start: -1, end: -1}
			byID[id] = r
			order = append(order, r)
			ids, execs, runs = append(ids, id), append(execs, exec), append(runs, int32(run))
			ats, endings, ended = append(ats, 0), append(endings, nil), append(ended, false)
		}
		k := r.k
		if runs[k] != int32(run) || execs[k] != exec {
			return b, false, nil
		}
		switch op := op.(type) {
		case *store.ReportStart:
			if r.start >= 0 {
				return b, false, nil
			}
			r.start = i
			if r.end < 0 { // a start after its run's end is not applied
				ats[k] = ns(op.At)
			}
		case *store.ReportEnd:
			if r.end >= 0 {
				return b, false, nil
			}
			r.end, endings[k], ended[k] = i, orNil(op.Ending), true
		}
	}
	// The start of a run whose end is in the batch is written with it (its
	// started_at is then the reported one exactly when the start applied:
	// an executor reports each run's start once). The notification is
	// sent once, if a report applied.
	rows, err := s.pool.Query(ctx, reportsQuery(ended), ids, runs, execs, ats, endings, ended, s.execChannel, reportsPayload)
	if err != nil {
		return b, true, err
	}
	b.Results = make([]store.Result, len(ops))
	for rows.Next() {
		var id string
		var started, end bool
		var void *string
		if err := rows.Scan(&id, &started, &end, &void); err != nil {
			rows.Close()
			return store.Batch{}, true, err
		}
		r := byID[id]
		if r.start >= 0 && started {
			b.Results[r.start].Applied = true
		}
		if r.end >= 0 && end {
			b.Results[r.end].Applied = true
		}
	}
	if rows.Close(); rows.Err() != nil {
		return store.Batch{}, true, rows.Err()
	}
	// A report that did not apply is refused (ErrStaleRun) unless its run
	// is still assigned to its executor (a report repeated, or a start
	// after the end).
	for _, r := range order {
		k := r.k
		for _, i := range []int{r.start, r.end} {
			if i < 0 || b.Results[i].Applied {
				continue
			}
			var one int
			err := s.pool.QueryRow(ctx, `SELECT count(*) FROM assignments WHERE work_id=$1 AND run=$2 AND executor=$3`,
				ids[k], runs[k], execs[k]).Scan(&one)
			if err != nil {
				return store.Batch{}, true, err
			}
			if one == 0 {
				b.Results[i].Err = store.ErrStaleRun
			}
		}
	}
	return b, true, nil
}

// reportsQuery is applyReports' statement for a batch whose runs ended as
// ended says: it updates only the kinds the batch holds (starts alone, ends
// with or without their starts), each a scan of the table less.
func reportsQuery(ended []bool) string {
	var starts, ends bool
	for _, e := range ended {
		starts, ends = starts || !e, ends || e
	}
	var q strings.Builder
	var parts []string
	q.WriteString(`WITH v AS (
		SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::bytea[], $6::bool[]) AS v(id, run, executor, at, ending, ended))`)
	if starts {
		q.WriteString(`, s AS (UPDATE assignments a SET state = 1, started_at = v.at FROM v
			WHERE NOT v.ended AND a.work_id = v.id AND (a.run = v.run AND a.executor = v.executor AND a.state = 0) IS TRUE
			RETURNING a.work_id, true AS started)`)
		parts = append(parts, `SELECT work_id, started, false AS ended FROM s`)
	}
	if ends {
		q.WriteString(`, e AS (UPDATE assignments a SET state = 2, ending = v.ending,
				started_at = CASE WHEN a.state = 0 AND v.at <> 0 THEN v.at ELSE a.started_at END FROM v
			WHERE v.ended AND a.work_id = v.id AND (a.run = v.run AND a.executor = v.executor AND a.state < 2) IS TRUE
			RETURNING a.work_id, v.at <> 0 AND a.started_at = v.at AS started)`)
		parts = append(parts, `SELECT work_id, started, true AS ended FROM e`)
	}
	q.WriteString(`, r AS (` + strings.Join(parts, ` UNION ALL `) + `)
		SELECT work_id, started, ended, (SELECT pg_notify($7, $8)::text) FROM r`)
	return q.String()
}
