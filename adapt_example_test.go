package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/runcue/runcue"
)

// An API whose real limit is unknown: its configured limits are ceilings,
// and its overload signals (here a 503) lower what runcue lets through.
func ExampleAdaptive() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()

	err = cue.Service("api", runcue.Service{RateLimit: 60, RateWindow: time.Minute, Adaptive: &runcue.Adaptive{}})
	if err != nil {
		log.Fatal(err)
	}
	err = cue.Task("call", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			// What an HTTP client would make of a 503 without Retry-After
			// (httplimit.Report returns the same).
			return nil, runcue.Overloaded(errors.New("503 Service Unavailable"))
		}})
	if err != nil {
		log.Fatal(err)
	}
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	s, err := cue.Submit(ctx, runcue.Submission{Task: "call"})
	if err != nil {
		log.Fatal(err)
	}
	info, err := cue.Wait(ctx, s.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.State, info.Error)
	st, err := cue.ServiceStatus(ctx, "api")
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range st.Adaptive.Describe(st.Limits) {
		fmt.Println(line)
	}
	// Output:
	// failed 503 Service Unavailable
	// effective limit 48/min (configured 60), lowered after 1 503
}
