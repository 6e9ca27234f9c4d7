package runcue_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runcue/runcue"
)

// An executor that submits follow-up work: its process registers the
// tasks as the scheduler does (here both share one function) on a Cue it
// never starts, and makes the executor from it. The handlers get that Cue
// as Work.Cue: a follow-up is costed by its task's Estimate, and a
// handler reads its dependencies' results.
func ExampleCue_Executor() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	path := filepath.Join(dir, "work.db")
	quiet := runcue.Config{Logger: slog.New(slog.DiscardHandler), PollInterval: 10 * time.Millisecond}
	register := func(c *runcue.Cue) {
		c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 10_000, Window: time.Minute}}})
		c.Task("fetch", runcue.Task{Remote: true})
		c.Task("shout", runcue.Task{Remote: true, Services: []string{"llm"},
			Estimate: func(s runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 250} }})
	}

	// The scheduler.
	sched, err := runcue.Open(path, quiet)
	if err != nil {
		log.Fatal(err)
	}
	defer sched.Close()
	register(sched)
	if err := sched.Start(ctx); err != nil {
		log.Fatal(err)
	}

	// The executor's process (here the same one).
	c, err := runcue.Open(path, quiet)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	register(c)
	x, err := c.Executor(runcue.ExecutorConfig{PollInterval: 10 * time.Millisecond}, map[string]runcue.Handler{
		"fetch": func(ctx context.Context, w *runcue.Work) (any, error) {
			_, err := w.Cue().Submit(ctx, runcue.Submission{ID: "shout-" + w.ID, Task: "shout", DependsOn: []string{w.ID}})
			return "the page at " + w.Target, err
		},
		"shout": func(ctx context.Context, w *runcue.Work) (any, error) {
			deps, err := w.Cue().DependencyResults(ctx, w.ID)
			if err != nil {
				return nil, err
			}
			return strings.ToUpper(string(deps[strings.TrimPrefix(w.ID, "shout-")])), nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	xctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- x.Run(xctx) }()

	if _, err := sched.Submit(ctx, runcue.Submission{ID: "f1", Task: "fetch", Target: "example.org"}); err != nil {
		log.Fatal(err)
	}
	if _, err := sched.Wait(ctx, "f1"); err != nil { // it submitted shout-f1
		log.Fatal(err)
	}
	info, err := sched.Wait(ctx, "shout-f1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.State, info.Cost, string(info.Result))
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// completed tokens 250 "\"THE PAGE AT EXAMPLE.ORG\""
}
