// Command mkschema11 wrote testdata/schema11.db and
// testdata/schema11-events.json: a database of schema version 11 (one row
// per event) and the whole event log as that schema reads it back, for the
// test of the migration to blocks. The log holds completed units with
// results, a unit with 150 runs (more events than a unit's record holds
// after the migration), a failed dependency, and a durable subscription with
// a filter; its oldest events are pruned, so that sequence numbers start
// past 1. It must run against the runcue of schema 11 (commit 5c0a697):
//
//	git worktree add /tmp/s11 5c0a697
//	cd /tmp/s11 && go run ./store/sqlite/testdata/mkschema11 schema11.db schema11-events.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

func main() {
	path, golden := os.Args[1], os.Args[2]
	ctx := context.Background()
	c, err := runcue.Open(path, runcue.Config{})
	must(err)
	must(c.Task("a", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		return map[string]string{"t": w.Target}, nil
	}}))
	must(c.Task("flaky", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 200, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Attempt < 150 {
				return nil, errors.New("not yet")
			}
			return "at last", nil
		}}))
	must(c.Task("bad", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) { return nil, errors.New("boom") }}))
	evs, stop, err := c.Subscribe(ctx, runcue.SubscribeOptions{Name: "ui", Types: []runcue.EventType{runcue.EventWorkCompleted}, Tasks: []string{"a"}})
	must(err)
	must(c.Start(ctx))
	var subs []runcue.Submission
	for i := range 60 {
		subs = append(subs, runcue.Submission{ID: fmt.Sprintf("done-%02d", i), Task: "a", Target: fmt.Sprintf("doc-%d", i)})
	}
	subs = append(subs,
		runcue.Submission{ID: "flaky-1", Task: "flaky", Target: "slow"},
		runcue.Submission{ID: "bad-1", Task: "bad", Target: "x"},
		runcue.Submission{ID: "after-bad", Task: "a", Target: "never", DependsOn: []string{"bad-1"}})
	_, err = c.SubmitBatch(ctx, subs)
	must(err)
	for _, s := range subs {
		_, err := c.Wait(ctx, s.ID)
		must(err)
	}
	acked := 0
	for ev := range evs {
		if acked++; acked == 30 {
			must(c.Ack(ctx, "ui", ev.Seq))
			break
		}
	}
	stop()
	must(c.Close())

	// Prune the oldest 40 events, as retention would.
	st, err := sqlite.Open(path, sqlite.Options{})
	must(err)
	all, err := st.EventsAfter(ctx, 0, 1<<20)
	must(err)
	_, err = st.Apply(ctx, []store.Op{&store.Prune{EventsBefore: all[40].Time.Add(time.Nanosecond)}})
	must(err)
	all, err = st.EventsAfter(ctx, 0, 1<<20)
	must(err)
	last, err := st.LastSeq(ctx)
	must(err)
	first, err := st.FirstSeq(ctx)
	must(err)
	must(st.Close())
	out, err := json.MarshalIndent(map[string]any{"first": first, "last": last, "events": all}, "", " ")
	must(err)
	must(os.WriteFile(golden, out, 0o644))
	fmt.Println("wrote", path, golden, len(all), "events")
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
