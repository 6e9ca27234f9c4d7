package runcue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runcue/runcue"
)

// runChild is the main of a child process (see TestMain). Modes:
//
//	journal: own the database at RUNCUE_DB and run "journal" units, each
//	  appending its ID to RUNCUE_JOURNAL and then pausing 5-25ms, until
//	  drained; then exit 0.
//	rated: own the database and run "rated" units on a service limited to
//	  50 per second, journaling each run's Work.Started, until drained.
//	hold: own the database and run "quick" units at once and "hold" units
//	  forever (until killed), printing "started <id>" for each hold run.
//
// RUNCUE_POLL, if set, is the child's PollInterval.
func runChild(mode string) int {
	path := os.Getenv("RUNCUE_DB")
	// MaxUncommitted bounds what a kill makes run again (TestCrashRecovery).
	cfg := runcue.Config{MaxConcurrent: 16, MaxUncommitted: 16, Logger: quietLogger}
	if mode == "followups" {
		cfg.DrainSubscriptions = []string{"pages"}
	}
	if poll, err := time.ParseDuration(os.Getenv("RUNCUE_POLL")); err == nil {
		cfg.PollInterval = poll
	}
	extra, isExtra := childModes[mode]
	if isExtra && extra.config != nil {
		extra.config(&cfg)
	}
	c, err := runcue.Open(path, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 2
	}
	ctx := context.Background()
	if isExtra {
		return extra.run(c)
	}
	switch mode {
	case "journal":
		j, err := os.OpenFile(os.Getenv("RUNCUE_JOURNAL"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "journal:", err)
			return 2
		}
		var first sync.Once
		must(c.Task("journal", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			// Journal first, so that every run a kill interrupts shows.
			if _, err := j.WriteString(w.ID + "\n"); err != nil {
				return nil, err
			}
			first.Do(func() { fmt.Println("running") })
			time.Sleep(5*time.Millisecond + time.Duration(rand.IntN(20_000))*time.Microsecond)
			return nil, nil
		}}))
	case "rated":
		// Own the database and run "rated" units on service api (50 per
		// second), each appending its Work.Started (Unix ns) to
		// RUNCUE_JOURNAL first, then pausing 0-20ms, until drained.
		j, err := os.OpenFile(os.Getenv("RUNCUE_JOURNAL"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "journal:", err)
			return 2
		}
		must(c.Service("api", runcue.Service{RateLimit: 50, RateWindow: time.Second}))
		must(c.Task("rated", runcue.Task{Services: []string{"api"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if _, err := j.WriteString(strconv.FormatInt(w.Started.UnixNano(), 10) + " " + w.ID + "\n"); err != nil {
				return nil, err
			}
			time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
			return nil, nil
		}}))
	case "subscriber":
		// Own the database, run "step" units, and journal the sequence number
		// of every durable event received, resuming after the last one
		// journaled (RUNCUE_SEQS). Prints "claimed" once it has seen a
		// claim of its own committed, so that the test kills it while
		// units run in the database.
		began := time.Now()
		must(c.Task("step", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			time.Sleep(2*time.Millisecond + time.Duration(rand.IntN(4000))*time.Microsecond)
			return nil, nil
		}}))
		path := os.Getenv("RUNCUE_SEQS")
		want, _ := strconv.Atoi(os.Getenv("RUNCUE_UNITS"))
		var last int64
		completed := 0
		if b, err := os.ReadFile(path); err == nil {
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				f := strings.Fields(line)
				if len(f) != 2 {
					continue // a line cut by the kill: its event comes again
				}
				last, _ = strconv.ParseInt(f[0], 10, 64)
				if f[1] == string(runcue.EventWorkCompleted) {
					completed++
				}
			}
		}
		if completed >= want {
			fmt.Println("drained") // the previous life saw the last completion, then died
			c.Close()
			return 0
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		evs, _, _ := c.Subscribe(ctx, runcue.SubscribeOptions{After: last, Types: []runcue.EventType{
			runcue.EventWorkQueued, runcue.EventWorkStarted, runcue.EventWorkCompleted, runcue.EventWorkRecovered}})
		must(c.Start(ctx))
		fmt.Println("ready")
		startedHere := false
		for ev := range evs {
			if _, err := f.WriteString(strconv.FormatInt(ev.Seq, 10) + " " + string(ev.Type) + "\n"); err != nil {
				return 2
			}
			if ev.Type == runcue.EventWorkStarted && !startedHere && ev.Time.After(began) {
				// A claim of this process committed: units are running
				// in the database now.
				startedHere = true
				fmt.Println("claimed")
			}
			if ev.Type == runcue.EventWorkCompleted {
				if completed++; completed == want {
					fmt.Println("drained")
					c.Close()
					return 0
				}
			}
		}
		return 0
	case "followups":
		// The spec's split-then-pages pattern: "split" units return how
		// many pages they found; a consumer on the durable subscription
		// "pages" submits a "page" unit per page, with idempotency keys
		// derived from the event, then acknowledges it. Drain waits for
		// the consumer (Config.DrainSubscriptions).
		sleep := func() { time.Sleep(time.Duration(500+rand.IntN(3000)) * time.Microsecond) }
		must(c.Task("split", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			sleep()
			n, _ := strconv.Atoi(strings.TrimPrefix(w.Target, "doc-"))
			return map[string]int{"pages": 2 + n%4}, nil
		}}))
		must(c.Task("page", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			sleep()
			return nil, nil
		}}))
		evs, _, err := c.Subscribe(ctx, runcue.SubscribeOptions{Name: "pages", After: 0})
		must(err)
		go func() {
			for ev := range evs {
				if ev.Type == runcue.EventWorkCompleted && ev.Task == "split" {
					var res struct{ Pages int }
					must(json.Unmarshal(ev.Result, &res))
					subs := make([]runcue.Submission, res.Pages)
					for i := range subs {
						subs[i] = runcue.Submission{Task: "page", Target: ev.WorkID,
							IdempotencyKey: fmt.Sprintf("page:%s:%d", ev.WorkID, i)}
					}
					if _, err := c.SubmitBatch(ctx, subs); err != nil {
						fmt.Fprintln(os.Stderr, "follow-ups:", err)
						os.Exit(2)
					}
				}
				if ev.Seq > 0 {
					must(c.Ack(ctx, "pages", ev.Seq))
				}
			}
		}()
	case "hold":
		must(c.Service("one", runcue.Service{MaxConcurrent: 1}))
		must(c.Task("quick", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return "quick", nil }}))
		must(c.Task("hold", runcue.Task{Services: []string{"one"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			fmt.Println("started " + w.ID)
			select {}
		}}))
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", mode)
		return 2
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "start:", err)
		return 2
	}
	fmt.Println("ready")
	if err := c.Drain(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "drain:", err)
		return 2
	}
	if err := c.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		return 2
	}
	fmt.Println("drained")
	return 0
}

// childMode is a child-process mode defined beside the tests that use it:
// config adjusts the Cue's Config, run owns the Cue from there and returns
// the exit code.
type childMode struct {
	config func(*runcue.Config)
	run    func(*runcue.Cue) int
}

// childModes are the modes defined in other files (registered by their
// init functions).
var childModes = map[string]childMode{}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}
