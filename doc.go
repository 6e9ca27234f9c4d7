// Package runcue coordinates rate-limited and capacity-limited work from
// inside a Go service, with one SQLite file and no other moving parts.
//
// runcue is a traffic controller, not a job executor: the work it
// coordinates mostly runs elsewhere (an LLM API, an object store, an SSH
// host, a local process pool). It keeps a durable queue of work units,
// decides which may run now within the limits of the services they use, calls
// the handler registered for each unit's task type, records the outcome,
// and reports every change on an event stream a UI can follow.
//
// # Vocabulary
//
// A Service is an external resource with limits (concurrency, request rate,
// circuit breaker). A Task is a type of work: the services each of its units
// needs and the Handler that performs one. A work unit is one Submission of
// a task, with a target and parameters; it is queued, running, completed,
// failed or cancelled. A Cue holds them together.
//
// # Lifecycle
//
// Open a database, register services and tasks, Start, Submit:
//
//	cue, err := runcue.Open("work.db", runcue.Config{})
//	...
//	cue.Service("llm", runcue.Service{MaxConcurrent: 5})
//	cue.Task("summarize", runcue.Task{Services: []string{"llm"}, Handler: summarize})
//	cue.Start(ctx)
//	cue.Submit(ctx, runcue.Submission{Task: "summarize", Target: "doc-17"})
//
// Any number of Cues, in any number of processes, may open the same
// database to submit and inspect work (a web server and a CLI next to a
// worker, say). One at a time owns it: Start takes an operating-system lock
// that dies with its process, and a second Start fails with ErrLocked.
//
// # Guarantees
//
// Submit returns only after its unit is committed. Every state change is one
// transaction, and events are published only after their change is
// committed, in commit order, each with a durable sequence number.
//
// Execution is at least once: a unit whose owner dies while running it is
// requeued by the next owner (work_recovered) and runs again, so handlers
// should be idempotent. The record is exactly once: a unit is marked
// completed once, whatever crashes happen around it.
//
// With SQLite's default synchronous setting (sqlite.Normal), a committed
// unit survives any process crash; sqlite.Full extends that to power loss
// at the cost of an fsync per commit:
//
//	st, err := sqlite.Open("work.db", sqlite.Options{Synchronous: sqlite.Full})
//	...
//	c, err := runcue.New(st, runcue.Config{})
//	...
//	defer st.Close() // after c.Close
//
// # Concurrency
//
// A Cue is safe for simultaneous use by multiple goroutines. It runs one
// dispatcher goroutine, one writer goroutine that commits the work of all
// others in shared transactions (group commit), one goroutine per running
// handler and one per event subscription; Stop and Close end them all.
package runcue
