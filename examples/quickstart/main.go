// Command quickstart shows runcue's core loop: a capacity-limited service,
// a task that uses it, a batch of work, and the live event stream.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/runcue/runcue"
)

type article struct {
	Title string `json:"title"`
	Words int    `json:"words"`
}

type summary struct {
	Title   string `json:"title"`
	Summary string `json:"summary"`
}

func main() {
	dbPath := flag.String("db", "", "database file (default: a new temporary file)")
	units := flag.Int("n", 12, "articles to summarize")
	flag.Parse()
	if *dbPath == "" {
		dir, err := os.MkdirTemp("", "runcue-quickstart")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		*dbPath = filepath.Join(dir, "quickstart.db")
	}
	ctx := context.Background()

	cue, err := runcue.Open(*dbPath, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()

	// A pretend LLM API that takes 3 requests at a time.
	if err := cue.Service("llm", runcue.Service{MaxConcurrent: 3}); err != nil {
		log.Fatal(err)
	}
	err = cue.Task("summarize", runcue.Task{
		Services: []string{"llm"},
		Timeout:  10 * time.Second,
		Retry:    runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: 100 * time.Millisecond},
		Handler:  runcue.Handle(summarize),
	})
	if err != nil {
		log.Fatal(err)
	}

	events := cue.Events(ctx)
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	subs := make([]runcue.Submission, *units)
	for i := range subs {
		subs[i] = runcue.Submission{Task: "summarize", Target: fmt.Sprintf("article-%02d", i+1),
			Params: article{Title: fmt.Sprintf("Article %d", i+1), Words: 300 + 100*i}}
	}
	if _, err := cue.SubmitBatch(ctx, subs); err != nil {
		log.Fatal(err)
	}

	start := time.Now()
	finished := 0
	for ev := range events {
		elapsed := time.Since(start).Truncate(time.Millisecond)
		switch ev.Type {
		case runcue.EventWorkStarted:
			fmt.Printf("%8v  started    %s (attempt %d)\n", elapsed, ev.WorkID[len(ev.WorkID)-6:], ev.Attempt)
		case runcue.EventWorkCompleted:
			finished++
			fmt.Printf("%8v  completed  %s %s\n", elapsed, ev.WorkID[len(ev.WorkID)-6:], ev.Result)
		case runcue.EventWorkFailed:
			if !ev.WillRetry {
				finished++
			}
			fmt.Printf("%8v  failed     %s: %s (will retry: %v)\n", elapsed, ev.WorkID[len(ev.WorkID)-6:], ev.Error, ev.WillRetry)
		}
		if finished == *units {
			break
		}
	}
	if err := cue.Stop(ctx); err != nil {
		log.Fatal(err)
	}

	page, err := cue.List(ctx, runcue.ListOptions{Limit: 100})
	if err != nil {
		log.Fatal(err)
	}
	counts := map[runcue.State]int{}
	runs := 0
	for _, u := range page.Units {
		counts[u.State]++
		runs += u.Runs
	}
	fmt.Printf("\n%d units: %d completed, %d failed, %d runs in %v (at most 3 at a time)\n",
		len(page.Units), counts[runcue.StateCompleted], counts[runcue.StateFailed], runs, time.Since(start).Truncate(time.Millisecond))
}

// summarize stands in for an LLM call: it takes a while and sometimes fails.
func summarize(ctx context.Context, w *runcue.Work, a article) (summary, error) {
	select {
	case <-time.After(time.Duration(50+rand.IntN(150)) * time.Millisecond):
	case <-ctx.Done():
		return summary{}, context.Cause(ctx)
	}
	if rand.IntN(5) == 0 {
		return summary{}, errors.New("503 from the model API")
	}
	return summary{Title: a.Title, Summary: fmt.Sprintf("%d words, in brief", a.Words)}, nil
}
