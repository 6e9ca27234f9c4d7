// Command mkschema12 wrote testdata/schema12.db: a database of schema
// version 12 (before executors) holding a completed unit, a queued one and
// one left running by an owner that died (its lease in 2026), for the test
// of the migration to executors. It must run against the runcue of schema
// 12 (commit 51edd78):
//
//	git worktree add /tmp/s12 51edd78
//	cd /tmp/s12 && go run ./store/sqlite/testdata/mkschema12 schema12.db
package main

import (
	"context"
	"os"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

func main() {
	ctx := context.Background()
	st, err := sqlite.Open(os.Args[1], sqlite.Options{})
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
	must(st.Close())
}

func apply(st *sqlite.Store, op store.Op) {
	b, err := st.Apply(context.Background(), []store.Op{op})
	must(err)
	must(b.Results[0].Err)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
