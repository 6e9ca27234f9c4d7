// Command mkschema1 wrote testdata/schema1.sql: a database of schema
// version 1 (before executors) in the schema named by its URL's
// search_path, holding a completed unit, a queued one and one left running
// by an owner that died (its lease in 2026), dumped with
//
//	pg_dump --inserts --no-owner --no-privileges --schema=fixture
//
// with pg_dump's \restrict and \unrestrict lines dropped and the schema's
// name replaced by {{schema}}, for the test of the migration to executors.
// It must run against the runcue of schema 1 (commit 51edd78):
//
//	git worktree add /tmp/s12 51edd78
//	cd /tmp/s12/store/postgres && go run ./testdata/mkschema1 'postgres://.../postgres?search_path=fixture'
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
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	own, err := st.Acquire(ctx, store.Holder{Owner: "old-owner", PID: 1, Host: "fixture", Since: at})
	must(err)
	ep := own.Epoch()
	apply(st, &store.Insert{At: at, Units: []*store.Unit{
		{ID: "done-1", Task: "a", Target: "x", State: store.Queued, CreatedAt: at},
		{ID: "queued-1", Task: "a", Target: "y", State: store.Queued, CreatedAt: at},
		{ID: "running-1", Task: "a", Target: "z", State: store.Queued, CreatedAt: at},
	}})
	apply(st, &store.Claim{Epoch: ep, ID: "done-1", Task: "a", Owner: "old-owner", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)})
	apply(st, &store.Finish{Epoch: ep, ID: "done-1", Task: "a", Owner: "old-owner", Run: 1, At: at.Add(time.Second), State: store.Completed,
		Result: []byte(`"ok"`), Attempt: store.Attempt{Run: 1, Start: at, End: at.Add(time.Second), Outcome: "completed"}})
	apply(st, &store.Claim{Epoch: ep, ID: "running-1", Task: "a", Owner: "old-owner", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)})
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
