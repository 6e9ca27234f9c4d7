package postgres

import (
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// A run's ops: Claim and Finish.

func (t *txn) claim(op *store.Claim, r *store.Result) error {
	ok, err := t.changed(`UPDATE work_units SET state='running', runs=$1, started_at=$2, leased_by=$3, lease_expires_at=$4,
			heartbeat_at=0, epoch=$5
		WHERE id=$6 AND state='queued' AND cancel_requested=0`,
		op.Run, ns(op.At), op.Owner, ns(op.LeaseExpires), op.Epoch, op.ID)
	if err != nil || !ok {
		return err
	}
	task := op.Task
	if task == "" {
		if _, err := t.one(`SELECT task FROM work_units WHERE id=$1`, []any{op.ID}, &task); err != nil {
			return err
		}
	}
	t.Moved(task, store.Queued, store.Running)
	r.Applied = true
	t.NoteWait(op.At, op.Wait)
	if n := len(op.Log); n > 0 {
		services, meters, amounts := make([]string, n), make([]string, n), make([]int64, n)
		for i, e := range op.Log {
			services[i], meters[i], amounts[i] = e.Service, e.Meter, e.Amount
		}
		if _, err := t.exec(`INSERT INTO service_log(service, meter, amount, started_at, work_id)
			SELECT s, m, a, $4, $5 FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS v(s, m, a, i) ORDER BY i`,
			services, meters, amounts, ns(op.At), op.ID); err != nil {
			return err
		}
	}
	return store.AppendEvents(t, r, op.Events, op.ID, "", op.At)
}

func (t *txn) finish(op *store.Finish, r *store.Result) error {
	var finished, runAt int64
	if op.State.Terminal() {
		finished = ns(op.At)
	}
	runAt = ns(op.RunAt)
	var result any
	if op.State == store.Completed {
		result = nullBytes(op.Result)
	}
	spend, defer_ := 0, 0
	if op.SpendBudget {
		spend = 1
	}
	if op.Deferral {
		defer_ = 1
	}
	var task string
	ok, err := t.one(`UPDATE work_units SET state=$1, finished_at=$2, result=$3, error=$4, error_kind=$5, run_at=$6,
			failures=failures+$7, deferrals=deferrals+$8, leased_by=NULL, lease_expires_at=0, cancel_requested=0,
			attempts=`+appendAttempt(9)+`
		WHERE id=$10 AND state='running' AND leased_by=$11 AND runs=$12 RETURNING task`,
		[]any{string(op.State), finished, result, nullStr(op.Error), nullStr(op.ErrorKind), runAt, spend, defer_,
			store.AttemptJSON(op.Attempt), op.ID, op.Owner, op.Run}, &task)
	if err != nil || !ok {
		return err
	}
	return sqlcommon.Finished(t, task, op, r)
}
