package runcue_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
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

// Texts are embedded 50 at a time: one request for each batch, at most
// 2,000 tokens per batch, a meter charged with each batch's summed
// tokens; each text keeps its own outcome.
func ExampleBatch() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()
	_ = cue.Service("embeddings", runcue.Service{RateLimit: 100, RateWindow: time.Minute,
		Meters: []runcue.Meter{{Name: "tokens", Limit: 100_000, Window: time.Minute}}})
	var calls atomic.Int32
	_ = cue.Task("embed", runcue.Task{Services: []string{"embeddings"},
		Batch: &runcue.Batch{Max: 50, MaxCost: runcue.Costs{"tokens": 2000}, Wait: 100 * time.Millisecond,
			Handler: func(ctx context.Context, batch []*runcue.Work) ([]runcue.Outcome, error) {
				calls.Add(1) // one request for the batch, here
				out := make([]runcue.Outcome, len(batch))
				for i, w := range batch {
					if w.Target == "" {
						out[i].Err = runcue.Permanent(fmt.Errorf("empty text"))
						continue
					}
					out[i].Result = len(w.Target) // the vector, in real code
				}
				return out, nil
			}}})
	var subs []runcue.Submission
	for i := range 120 {
		text := fmt.Sprintf("text number %d", i)
		if i == 7 {
			text = ""
		}
		subs = append(subs, runcue.Submission{Task: "embed", ID: fmt.Sprint(i), Target: text,
			Cost: runcue.Costs{"tokens": 40}})
	}
	if _, err := cue.SubmitBatch(ctx, subs); err != nil {
		log.Fatal(err)
	}
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if err := cue.Drain(ctx); err != nil {
		log.Fatal(err)
	}
	st, _ := cue.Stats(ctx)
	fmt.Println(calls.Load(), "calls;", st.States[runcue.StateCompleted], "completed,", st.States[runcue.StateFailed], "failed")
	// Output: 3 calls; 119 completed, 1 failed
}
