package runcue_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/runcue/runcue"
)

// The quickstart: one rate-limited service, one task, a few units, and the
// event stream.
func Example() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()

	// An external API that allows 2 calls at once.
	if err := cue.Service("uppercase-api", runcue.Service{MaxConcurrent: 2}); err != nil {
		log.Fatal(err)
	}
	type params struct{ Text string }
	err = cue.Task("shout", runcue.Task{
		Services: []string{"uppercase-api"},
		Handler: runcue.Handle(func(ctx context.Context, w *runcue.Work, p params) (string, error) {
			return strings.ToUpper(p.Text), nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}

	events := cue.Events(ctx)
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	s, err := cue.Submit(ctx, runcue.Submission{Task: "shout", Params: params{Text: "hello, runcue"}})
	if err != nil {
		log.Fatal(err)
	}
	for ev := range events {
		fmt.Println(ev.Type)
		if ev.Type == runcue.EventWorkCompleted && ev.WorkID == s.ID {
			fmt.Println(string(ev.Result))
			break
		}
	}
	if err := cue.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// work_queued
	// work_started
	// work_completed
	// "HELLO, RUNCUE"
}

// A process that only submits and watches (a web server next to the worker)
// opens the same database without Start.
func ExampleCue_Wait() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	path := filepath.Join(dir, "work.db")
	quiet := runcue.Config{Logger: slog.New(slog.DiscardHandler)}

	worker, _ := runcue.Open(path, quiet)
	defer worker.Close()
	worker.Task("add", runcue.Task{Handler: runcue.Handle(func(ctx context.Context, w *runcue.Work, xs []int) (int, error) {
		sum := 0
		for _, x := range xs {
			sum += x
		}
		return sum, nil
	})})
	worker.Start(ctx)

	web, _ := runcue.Open(path, quiet) // no handlers, no Start
	defer web.Close()
	s, err := web.Submit(ctx, runcue.Submission{Task: "add", Params: []int{1, 2, 3}})
	if err != nil {
		log.Fatal(err)
	}
	info, err := web.Wait(ctx, s.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.State, string(info.Result))
	// Output: completed 6
}

func ExampleRetryPolicy_Delay() {
	p := runcue.RetryPolicy{Jitter: runcue.JitterNone} // defaults otherwise
	for failures := 1; failures <= 10; failures++ {
		fmt.Print(p.Delay(failures, 0), " ")
	}
	fmt.Println()
	// Output: 1s 2s 4s 8s 16s 32s 1m4s 2m8s 4m16s 5m0s
}
