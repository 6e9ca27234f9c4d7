// Command mkschema2 wrote testdata/schema2.sql: a database of schema
// version 2 (executors, before the assignments' HOT updates) in the schema
// named by its URL's search_path, holding an executor with a run assigned
// and pending, one started and one ended (its report not yet read), a
// completed unit and a queued one, the owner that assigned them dead (its
// lease in 2026), dumped with
//
//	pg_dump --inserts --no-owner --no-privileges --schema=fixture
//
// with pg_dump's \restrict and \unrestrict lines and its CREATE SCHEMA
// dropped and the schema's name replaced by {{schema}}, for the test of
// the migration to schema 3. It must run against the runcue of schema 2
// (commit 0896ad5):
//
//	git worktree add /tmp/s2 0896ad5
//	cd /tmp/s2/store/postgres && go run ./testdata/mkschema2 'postgres://.../postgres?search_path=fixture'
package main

import (
	"context"
	"os"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

func main() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Args[1], postgres.Options{})
	must(err)
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	own, err := st.Acquire(ctx, store.Holder{Owner: "old-owner", PID: 1, Host: "h1", Since: at})
	must(err)
	ep := own.Epoch()
	apply(st, &store.RegisterExecutor{Executor: store.ExecutorRecord{ID: "ex-1", Host: "h2", PID: 2, Tasks: []string{"a"}, Capacity: 4,
		Poll: 50 * time.Millisecond, TTL: time.Minute}})
	var units []*store.Unit
	for _, id := range []string{"done-1", "queued-1", "pending-1", "started-1", "ended-1"} {
		units = append(units, &store.Unit{ID: id, Task: "a", Target: "t-" + id, Params: []byte(`{"p":1}`), State: store.Queued, CreatedAt: at})
	}
	apply(st, &store.Insert{At: at, Units: units})
	for _, id := range []string{"done-1", "pending-1", "started-1", "ended-1"} {
		apply(st, &store.Claim{Epoch: ep, ID: id, Task: "a", Owner: "old-owner", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)})
		apply(st, &store.Assign{Epoch: ep, ID: id, Task: "a", Owner: "old-owner", Run: 1, Executor: "ex-1", StartBy: at.Add(time.Second),
			Timeout: time.Minute})
	}
	for _, id := range []string{"done-1", "started-1", "ended-1"} {
		apply(st, &store.ReportStart{Executor: "ex-1", ID: id, Run: 1, At: at.Add(100 * time.Millisecond)})
	}
	for _, id := range []string{"done-1", "ended-1"} {
		apply(st, &store.ReportEnd{Executor: "ex-1", ID: id, Run: 1, Ending: []byte(`{"result":"ok"}`)})
	}
	apply(st, &store.Finish{Epoch: ep, ID: "done-1", Task: "a", Owner: "old-owner", Run: 1, At: at.Add(time.Second), State: store.Completed,
		Result: []byte(`"ok"`), Attempt: store.Attempt{Run: 1, Start: at, End: at.Add(time.Second), Outcome: "completed"}})
	apply(st, &store.Unassign{Epoch: ep, ID: "done-1", Run: 1})
	must(own.Release())
	st.Close()
}

func apply(st *postgres.Store, op store.Op) {
	b, err := st.Apply(context.Background(), []store.Op{op})
	must(err)
	must(b.Results[0].Err)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
