// Command mkschema10 wrote testdata/schema10.db: a database of schema
// version 10 (subscription filters) whose owner died mid-run. It holds a
// rate-limited service with a budget and starts in its service log, a
// keyed instance with a stored circuit, finished and queued units, and one
// unit left running (with its lease) by an owner that exited without
// stopping. It must run against the runcue of schema 10 (commit 6013595):
//
//	git worktree add /tmp/s10 6013595
//	cd /tmp/s10 && go run ./store/sqlite/testdata/mkschema10 schema10.db
//
// The program runs itself twice: the child leaves the unit running and
// exits without closing; the parent then opens the file without taking
// ownership and closes it, which folds the write-ahead log into it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/sqlite"
)

func main() {
	path := os.Args[1]
	if len(os.Args) > 2 && os.Args[2] == "child" {
		child(path)
		return
	}
	cmd := exec.Command(os.Args[0], path, "child")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	must(cmd.Run())
	st, err := sqlite.Open(path, sqlite.Options{})
	must(err)
	must(st.Close())
	fmt.Println("wrote", path)
}

func child(path string) {
	ctx := context.Background()
	c, err := runcue.Open(path, runcue.Config{})
	must(err)
	must(c.Service("api", runcue.Service{MaxConcurrent: 4, RateLimit: 10, RateWindow: time.Hour,
		Budgets: []runcue.Budget{{Requests: 100, Per: runcue.PerDay}}}))
	must(c.Service("host", runcue.Service{CircuitThreshold: 1, CircuitTimeout: time.Hour}))
	started := make(chan struct{})
	must(c.Task("a", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			switch w.Target {
			case "bad":
				return nil, errors.New("boom")
			case "hang":
				close(started)
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return map[string]string{"t": w.Target}, nil
		}}))
	must(c.Task("k", runcue.Task{ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} },
		Retry:   runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) { return nil, errors.New("down") }}))
	must(c.Task("b", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) { return nil, nil }}))
	must(c.PauseTask(ctx, "b"))
	must(c.Start(ctx))
	for _, s := range []runcue.Submission{
		{ID: "done-1", Task: "a", Target: "ok"},
		{ID: "done-2", Task: "a", Target: "ok"},
		{ID: "failed-1", Task: "a", Target: "bad"},
		{ID: "keyed-1", Task: "k", Target: "example.org"},
	} {
		_, err := c.Submit(ctx, s)
		must(err)
	}
	for _, id := range []string{"done-1", "done-2", "failed-1", "keyed-1"} {
		_, err := c.Wait(ctx, id)
		must(err)
	}
	_, err = c.Submit(ctx, runcue.Submission{ID: "running-1", Task: "a", Target: "hang"})
	must(err)
	<-started
	_, err = c.Submit(ctx, runcue.Submission{ID: "queued-1", Task: "b", Target: "later"})
	must(err)
	_, err = c.Settle(ctx)
	must(err)
	os.Exit(0) // the owner dies with running-1 running
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
