// Command mkschema9 wrote testdata/schema9.db: a database of schema
// version 9 (an index of events by unit) with units in every state of
// that schema, a durable subscription, and queued units holding inputs
// that later versions refuse at submit: a target of 20 KiB, one with NUL,
// one and an ID and an idempotency key that are not UTF-8, an idempotency
// key of 2 KiB, and a keyed instance paused under a name that is not
// UTF-8. It must run against the runcue of schema 9 (commit afdf7ee):
//
//	git worktree add /tmp/s9 afdf7ee
//	cd /tmp/s9 && go run ./store/sqlite/testdata/mkschema9 schema9.db
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/runcue/runcue"
)

func main() {
	path := os.Args[1]
	ctx := context.Background()
	c, err := runcue.Open(path, runcue.Config{})
	must(err)
	must(c.Service("api", runcue.Service{MaxConcurrent: 2}))
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
		// Inputs a later version refuses.
		{ID: "long-target", Task: "b", Target: strings.Repeat("t", 20<<10)},
		{ID: "nul-target", Task: "b", Target: "a\x00b"},
		{ID: "latin1-target", Task: "b", Target: "caf\xe9"},
		{ID: "id-\xff", Task: "b", Target: "ok"},
		{ID: "long-key", Task: "b", IdempotencyKey: strings.Repeat("k", 2<<10)},
		{ID: "latin1-key", Task: "b", IdempotencyKey: "k\xe9"},
	} {
		_, err := c.Submit(ctx, s)
		must(err)
	}
	must(c.Cancel(ctx, "cancelled-1", runcue.CancelOptions{}))
	must(c.PauseService(ctx, "api:slow"))
	must(c.PauseService(ctx, "api:caf\xe9"))
	must(c.PauseTask(ctx, "b"))
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
