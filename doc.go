// Package runcue coordinates rate-limited and capacity-limited work from
// inside a Go service: a durable queue of work units on SQLite (one file) or
// PostgreSQL (package store/postgres), dispatched to registered handlers
// within the limits of the services they use: concurrency caps, exact rate
// windows, meters of tokens or bytes, calendar budgets and circuit breakers.
// Handlers run in the owning process or in executors on other hosts
// (Task.Remote, NewExecutor), and every change is reported on an event
// stream a UI can follow.
//
// runcue is a traffic controller, not a job executor: the work it
// coordinates mostly runs elsewhere (an LLM API, an object store, an SSH
// host). It decides which unit may start now, calls the handler registered
// for the unit's task, records the outcome, and retries, holds or fails
// the unit as the outcome says.
//
// The smallest program:
//
//	cue, err := runcue.Open("work.db", runcue.Config{})
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer cue.Close()
//	cue.Service("llm", runcue.Service{MaxConcurrent: 5, RateLimit: 60, RateWindow: time.Minute})
//	cue.Task("summarize", runcue.Task{Services: []string{"llm"}, Handler: summarize})
//	cue.Start(ctx)
//	s, err := cue.Submit(ctx, runcue.Submission{Task: "summarize", Params: doc})
//	info, err := cue.Wait(ctx, s.ID)
//
// # The types to read first
//
// Cue (Open, New, Start, Submit, Wait, Events) holds everything together.
// Service states a resource's limits: MaxConcurrent, RateLimit and
// RateWindow, Meters, Budgets, a circuit breaker, Adaptive. Task is a type
// of work: its services, Handler, RetryPolicy and Timeout. Submission is
// one unit to run, and Work is what a handler is given: its parameters,
// and Used and Observe to report what the service charged. Event is what
// the stream delivers. Config holds the Cue's settings.
//
// # Ownership
//
// Any number of Cues, in any number of processes, may open one database to
// submit and inspect work. One at a time owns it and dispatches (Start).
// On SQLite that is an operating-system lock that dies with its process. On
// PostgreSQL it is a lease with an epoch that fences a deposed owner's
// writes, and a Cue with Config.Standby takes over when the owner's lease
// ends. A Cue that loses ownership (a database outage longer than half its
// lease) takes it back by itself; Status says what it is doing.
//
// # Guarantees
//
// Submit returns only after its unit is committed. Every state change is
// one transaction, and events are published only after their change is
// committed, in commit order, each with a durable sequence number.
//
// No interval of a service's RateWindow plus its Margin holds more than
// RateLimit handler starts, and no meter's window more than its Limit: in
// one process, across owners, and across crashes, counted at the instant
// each handler starts.
//
// Execution is at least once: a unit whose owner dies while running it runs
// again, so handlers should be idempotent. The record is exactly once: a
// unit is marked completed once, whatever crashes happen around it.
//
// A database restart, a failover or a lost connection never ends a Cue:
// writes are retried, and a call given up meanwhile returns
// ErrStoreUnavailable (nothing stored). See docs/guarantees.md and
// docs/resilience.md in the repository.
//
// # Concurrency
//
// A Cue is safe for simultaneous use by multiple goroutines. It runs one
// dispatcher goroutine, one writer goroutine that commits the work of all
// others in shared transactions (group commit), one goroutine per running
// handler and one per event subscription; Stop and Close end them all.
package runcue
