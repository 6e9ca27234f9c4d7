// Command mkschema8 wrote testdata/schema8.db: a database of schema
// version 8 (events carry their unit's target) with units in every state
// of that schema (completed, skipped, failed, queued with dependencies,
// cancelled), a budgeted service with a paused keyed instance, tasks (one
// paused), a paused queue and a durable subscription. It must run against
// the runcue of schema 8 (commit 60568b3):
//
//	git worktree add /tmp/s8 60568b3
//	cd /tmp/s8 && go run ./store/sqlite/testdata/mkschema8 schema8.db
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/runcue/runcue"
)

func main() {
	path := os.Args[1]
	ctx := context.Background()
	c, err := runcue.Open(path, runcue.Config{})
	must(err)
	must(c.Service("api", runcue.Service{MaxConcurrent: 2,
		Budgets: []runcue.Budget{{Requests: 1000, Per: runcue.PerDay}}}))
	must(c.Task("a", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			switch w.Target {
			case "bad":
				return nil, errors.New("boom")
			case "skip":
				return nil, runcue.Skip("not modified")
			}
			return map[string]string{"t": w.Target}, nil
		}}))
	must(c.Task("b", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) { return nil, nil }}))
	must(c.Start(ctx))
	for _, s := range []runcue.Submission{
		{ID: "done-1", Task: "a", Target: "ok"},
		{ID: "skipped-1", Task: "a", Target: "skip"},
		{ID: "failed-1", Task: "a", Target: "bad"},
		{ID: "dep-of-failed", Task: "b", DependsOn: []string{"failed-1"}},
	} {
		_, err := c.Submit(ctx, s)
		must(err)
	}
	for _, id := range []string{"done-1", "skipped-1", "failed-1", "dep-of-failed"} {
		_, err := c.Wait(ctx, id)
		must(err)
	}
	must(c.Stop(ctx))
	must(c.Close())
	c, err = runcue.Open(path, runcue.Config{})
	must(err)
	for _, s := range []runcue.Submission{
		{ID: "queued-1", Task: "a", Target: "ok"},
		{ID: "queued-2", Task: "b", DependsOn: []string{"queued-1", "skipped-1"}},
		{ID: "cancelled-1", Task: "a", Target: "ok"},
	} {
		_, err := c.Submit(ctx, s)
		must(err)
	}
	must(c.Cancel(ctx, "cancelled-1", runcue.CancelOptions{}))
	must(c.PauseService(ctx, "api:slow"))
	must(c.PauseTask(ctx, "b"))
	must(c.PauseQueue(ctx))
	_, stop, err := c.Subscribe(ctx, runcue.SubscribeOptions{Name: "follow"})
	must(err)
	stop()
	must(c.Ack(ctx, "follow", 5))
	must(c.Close())
	fmt.Println("wrote", path)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
