package postgres

import (
	"context"

	"github.com/runcue/runcue/store"
)

// Starts logged ahead (store.StartLogger): a batch of LogStart ops alone
// is one statement, in a round trip, outside the writers' turns (it
// appends no event, so it takes no lock on the log). The statement
// share-locks the lease row, as an owner's transaction does, and writes
// the entries of the ops whose epoch is the stored one: no takeover
// commits between that check and the entries' commit. An entry already
// logged (the same unit, service, meter and instant) is not logged again,
// so a statement whose outcome was lost (its connection cut after it was
// sent) is repeated safely.

var _ store.StartLogger = (*Store)(nil)

// LogsStartsAside implements store.StartLogger.
func (s *Store) LogsStartsAside() {}

// startsOnly reports whether ops are all LogStart ops.
func startsOnly(ops []store.Op) bool {
	for _, op := range ops {
		if _, ok := op.(*store.LogStart); !ok {
			return false
		}
	}
	return len(ops) > 0
}

// applyStarts writes ops, all LogStart ops (see startsOnly).
func (s *Store) applyStarts(ctx context.Context, ops []store.Op) (store.Batch, error) {
	var services, meters, ids []string
	var amounts, ats, epochs []int64
	for _, op := range ops {
		o := op.(*store.LogStart)
		for _, e := range o.Log {
			services, meters, ids = append(services, e.Service), append(meters, e.Meter), append(ids, o.WorkID)
			amounts, ats, epochs = append(amounts, e.Amount), append(ats, ns(o.At)), append(epochs, o.Epoch)
		}
	}
	var stored int64
	err := s.pool.QueryRow(ctx, `WITH e AS (`+epochQuery+`),
		v AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[])
			WITH ORDINALITY AS v(s, m, a, t, w, ep, i)),
		ins AS (INSERT INTO service_log(service, meter, amount, started_at, work_id)
			SELECT v.s, v.m, v.a, v.t, v.w FROM v, e WHERE (v.ep = 0 OR v.ep = e.epoch)
				AND NOT EXISTS (SELECT FROM service_log l WHERE l.service = v.s AND l.started_at = v.t AND l.meter = v.m AND l.work_id = v.w)
			ORDER BY v.i)
		SELECT epoch FROM e`, services, meters, amounts, ats, ids, epochs).Scan(&stored)
	if err != nil {
		return store.Batch{}, err
	}
	b := store.Batch{Results: make([]store.Result, len(ops))}
	for i, op := range ops {
		if e := op.(*store.LogStart).Epoch; e != 0 && e != stored {
			b.Results[i].Err = store.ErrNotOwner
			continue
		}
		b.Results[i].Applied = true
	}
	return b, nil
}
