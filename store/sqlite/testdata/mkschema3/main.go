// Command mkschema3 wrote testdata/schema3.db: a database of schema
// version 3 with units in every state of that schema (completed, failed, a
// dependent failed with it, queued with dependencies, cancelled). It must
// run against the runcue of schema 3 (commit ab53f93):
//
//	git worktree add /tmp/s3 ab53f93
//	cd /tmp/s3 && go run ./store/sqlite/testdata/mkschema3 schema3.db
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
	must(c.Service("api", runcue.Service{MaxConcurrent: 2}))
	must(c.Task("a", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Target == "bad" {
				return nil, errors.New("boom")
			}
			return map[string]string{"t": w.Target}, nil
		}}))
	must(c.Start(ctx))
	ids := map[string]string{}
	for _, s := range []runcue.Submission{
		{ID: "done-1", Task: "a", Target: "ok"},
		{ID: "failed-1", Task: "a", Target: "bad"},
		{ID: "dep-of-failed", Task: "a", Target: "ok", DependsOn: []string{"failed-1"}},
	} {
		r, err := c.Submit(ctx, s)
		must(err)
		ids[s.ID] = r.ID
	}
	for _, id := range []string{"done-1", "failed-1", "dep-of-failed"} {
		_, err := c.Wait(ctx, id)
		must(err)
	}
	must(c.Stop(ctx))
	must(c.Close())
	// Queued and cancelled units, written by a Cue that does not dispatch.
	c, err = runcue.Open(path, runcue.Config{})
	must(err)
	for _, s := range []runcue.Submission{
		{ID: "queued-1", Task: "a", Target: "ok"},
		{ID: "queued-2", Task: "a", Target: "ok", DependsOn: []string{"queued-1", "done-1"}},
		{ID: "cancelled-1", Task: "a", Target: "ok"},
	} {
		_, err := c.Submit(ctx, s)
		must(err)
	}
	must(c.Cancel(ctx, "cancelled-1", runcue.CancelOptions{}))
	must(c.Close())
	fmt.Println("wrote", path)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
