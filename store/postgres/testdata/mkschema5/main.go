// Command mkschema5 wrote testdata/schema5.sql: a database of schema
// version 5 (before debounce keys) in the schema named by its URL's
// search_path, holding a task, a completed unit, a queued one, a schedule
// and a question answered in the questions table, dumped with
//
//	pg_dump --inserts --no-owner --no-privileges --schema=fixture
//
// with pg_dump's \restrict and \unrestrict lines and its CREATE SCHEMA
// dropped and the schema's name replaced by {{schema}}, for the test of
// the migration to schema 6. It must run against the runcue of schema 5
// (commit 5e16324):
//
//	git worktree add /tmp/s5 5e16324
//	cd /tmp/s5/store/postgres && go run ./testdata/mkschema5 'postgres://.../postgres?search_path=fixture'
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
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	own, err := st.Acquire(ctx, store.Holder{Owner: "old-owner", PID: 1, Host: "h1", Since: at})
	must(err)
	ep := own.Epoch()
	apply(st, &store.PutTask{Name: "report", Def: []byte(`{}`)})
	apply(st, &store.Insert{At: at, Units: []*store.Unit{
		{ID: "done-1", Task: "report", State: store.Queued, CreatedAt: at, IdempotencyKey: "k-done"},
		{ID: "queued-1", Task: "report", State: store.Queued, CreatedAt: at, IdempotencyKey: "k-queued"},
	}})
	apply(st, &store.Claim{Epoch: ep, ID: "done-1", Task: "report", Owner: "old-owner", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)})
	apply(st, &store.Finish{Epoch: ep, ID: "done-1", Task: "report", Owner: "old-owner", Run: 1, At: at.Add(time.Second), State: store.Completed,
		Result: []byte(`"ok"`), Attempt: store.Attempt{Run: 1, Start: at, End: at.Add(time.Second), Outcome: "completed"}})
	apply(st, &store.PutSchedule{Name: "hourly", Def: []byte(`{"task":"report"}`), At: at})
	apply(st, &store.Ask{Question: store.OwnerQuestion{Nonce: "n1", Kind: "services"}, At: at})
	apply(st, &store.AnswerQuestion{Epoch: ep, ID: "n1", Answer: []byte(`[]`)})
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
