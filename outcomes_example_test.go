package runcue_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
)

// A crawler skips pages that have not changed; the dependent parse runs
// anyway (its task could set FailOnSkippedDependency to fail instead).
func ExampleSkip() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()
	_ = cue.Task("fetch", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		return nil, runcue.Skip("304 Not Modified")
	}})
	_ = cue.Task("parse", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		return "parsed the stored copy", nil
	}})
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = cue.SubmitBatch(ctx, []runcue.Submission{
		{Task: "fetch", ID: "page"},
		{Task: "parse", ID: "parse", DependsOn: []string{"page"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"page", "parse"} {
		wi, err := cue.Wait(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(id, wi.State, wi.Error)
	}
	// Output:
	// page skipped 304 Not Modified
	// parse completed
}

// A continuous run against a provider's daily quota of 3 requests, Pacific
// time: Drain returns once the day's budget is spent, the rest waiting for
// midnight in Los Angeles.
func ExampleBudget() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	pacific, err := time.LoadLocation("America/Los_Angeles")
	if err != nil {
		log.Fatal(err)
	}
	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{
		Logger:             slog.New(slog.DiscardHandler),
		DrainOnSpentBudget: true, // "budget exhausted: draining"
		// A fixed clock, so that the output does not depend on the hour
		// the example runs at; leave Clock unset in real code.
		Clock: clock.NewFake(time.Date(2026, 11, 23, 9, 30, 0, 0, pacific)),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()
	_ = cue.Service("llm", runcue.Service{MaxConcurrent: 2,
		Budgets: []runcue.Budget{{Requests: 3, Per: runcue.PerDay, Location: pacific}}})
	_ = cue.Task("summarize", runcue.Task{Services: []string{"llm"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		return "summary", nil
	}})
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	for range 5 {
		if _, err := cue.Submit(ctx, runcue.Submission{Task: "summarize"}); err != nil {
			log.Fatal(err)
		}
	}
	if err := cue.Drain(ctx); err != nil {
		log.Fatal(err)
	}
	st, _ := cue.ServiceStatus(ctx, "llm")
	b := st.Budgets[0]
	fmt.Printf("used %d of %d; exhausted: %v; resets %v\n",
		b.Used, b.Budget.Requests, b.Exhausted, b.Resets.In(pacific).Format("2006-01-02 15:04 MST"))
	// Output: used 3 of 3; exhausted: true; resets 2026-11-24 00:00 PST
}
