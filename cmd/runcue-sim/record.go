package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/runcue/runcue"
)

// runRec is one run of a unit as the simulator's handler saw it.
type runRec struct {
	attempt    int
	start, end time.Duration // since the epoch; end 0 while running
	answer     string
	ended      bool
}

// retryRec is a work_retrying event: run attempt ended and the unit is
// eligible again at next.
type retryRec struct {
	attempt int
	next    time.Duration
	reason  string
}

// unitRec is everything known of one unit.
type unitRec struct {
	spec      unitSpec
	submitted time.Duration
	runs      []runRec
	retries   []retryRec
	// From the events: completions counts work_completed; final is the
	// terminal state ("" until one) and finalAt its time.
	completions int
	final       string // set once, through setFinal
	finalAt     time.Duration
	errorKind   string
}

// circuitRec is a change of a service's circuit.
type circuitRec struct {
	at      time.Duration
	service string
	state   string
}

// eventLine is a recent event as the TUI shows it.
type eventLine struct {
	at   time.Time
	text string
}

// recorder gathers the run's facts: from the handlers (what each run
// did), from the events (what runcue recorded) and from the workload
// (what was submitted). Every method is safe for concurrent use.
type recorder struct {
	epoch time.Time

	mu       sync.Mutex
	units    map[string]*unitRec
	order    []string // accepted units in submission order
	circuits []circuitRec
	circuit  map[string]string // service -> last state seen
	lastSeq  int64
	seqMoved chan struct{} // closed and replaced when lastSeq grows
	// Submission outcomes.
	groups, refusedCycles, refusedBackpressure, refusedOther int
	refusedPatterns                                          map[string]int
	// Backpressure events, and whether it is active.
	backpressureOn int
	bpActive       bool
	// Counters for the live view.
	retried    int
	recent     []eventLine // ring of the last recentMax
	recentNext int
	events     int
	finals     int // accepted units with a final state
}

const recentMax = 12

func newRecorder(epoch time.Time) *recorder {
	return &recorder{epoch: epoch, units: map[string]*unitRec{}, circuit: map[string]string{},
		refusedPatterns: map[string]int{}, seqMoved: make(chan struct{})}
}

func (r *recorder) since(t time.Time) time.Duration { return t.Sub(r.epoch) }

// submitted records a group's submission and its outcome.
func (r *recorder) submitted(gr group, at time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups++
	switch {
	case err == nil:
		for _, u := range gr.units {
			// Its runs and events may have come first (a fast dispatch).
			rec := r.unit(u.id)
			rec.spec, rec.submitted = u, r.since(at)
			if rec.final != "" {
				r.finals++
			}
			r.order = append(r.order, u.id)
		}
		return
	case isCycle(err):
		r.refusedCycles++
	case isBackpressure(err):
		r.refusedBackpressure++
	default:
		r.refusedOther++
	}
	r.refusedPatterns[gr.pattern]++
}

func (r *recorder) runStarted(id string, attempt int, start time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.unit(id)
	u.runs = append(u.runs, runRec{attempt: attempt, start: r.since(start)})
}

func (r *recorder) runEnded(id string, attempt int, end time.Time, answer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.unit(id)
	for i := len(u.runs) - 1; i >= 0; i-- {
		if u.runs[i].attempt == attempt && !u.runs[i].ended {
			u.runs[i].end, u.runs[i].answer, u.runs[i].ended = r.since(end), answer, true
			return
		}
	}
}

// unit returns a unit's record, making one for a unit the simulator did
// not submit in this process (the recovery scenario's child).
func (r *recorder) unit(id string) *unitRec {
	u := r.units[id]
	if u == nil {
		u = &unitRec{spec: unitSpec{id: id}}
		r.units[id] = u
	}
	return u
}

// event records one of runcue's events.
func (r *recorder) event(e runcue.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events++
	if e.Seq > r.lastSeq {
		r.lastSeq = e.Seq
		close(r.seqMoved)
		r.seqMoved = make(chan struct{})
	}
	at := r.since(e.Time)
	line := ""
	switch e.Type {
	case runcue.EventWorkStarted:
		line = fmt.Sprintf("%-16s %s task=%s attempt=%d", e.Type, e.WorkID, e.Task, e.Attempt)
	case runcue.EventWorkCompleted:
		u := r.unit(e.WorkID)
		u.completions++
		r.setFinal(u, "completed", at)
		line = fmt.Sprintf("%-16s %s task=%s", e.Type, e.WorkID, e.Task)
	case runcue.EventWorkSkipped, runcue.EventWorkCancelled:
		u := r.unit(e.WorkID)
		r.setFinal(u, string(e.Type)[len("work_"):], at)
		line = fmt.Sprintf("%-16s %s task=%s", e.Type, e.WorkID, e.Task)
	case runcue.EventWorkFailed:
		u := r.unit(e.WorkID)
		u.errorKind = e.ErrorKind
		if !e.WillRetry {
			r.setFinal(u, "failed", at)
		}
		line = fmt.Sprintf("%-16s %s task=%s error=%s", e.Type, e.WorkID, e.Task, e.ErrorKind)
	case runcue.EventWorkRetrying:
		r.retried++
		u := r.unit(e.WorkID)
		u.retries = append(u.retries, retryRec{attempt: e.Attempt, next: r.since(e.NextAttempt), reason: e.Reason})
		line = fmt.Sprintf("%-16s %s task=%s attempt=%d", e.Type, e.WorkID, e.Task, e.Attempt+1)
	case runcue.EventServiceStatus:
		if s := e.Service; s != nil {
			st := string(s.Circuit)
			if prev, ok := r.circuit[s.Name]; (ok && prev != st) || (!ok && st != string(runcue.CircuitClosed)) {
				r.circuits = append(r.circuits, circuitRec{at: at, service: s.Name, state: st})
				line = fmt.Sprintf("circuit_%-8s service=%s", st, s.Name)
			}
			r.circuit[s.Name] = st
		}
	case runcue.EventBackpressureActive:
		r.backpressureOn++
		r.bpActive = true
		line = fmt.Sprintf("%-16s queued=%d max=%d", e.Type, e.Queued, e.MaxQueued)
	case runcue.EventBackpressureCleared:
		r.bpActive = false
		line = fmt.Sprintf("%-16s queued=%d", e.Type, e.Queued)
	}
	if line != "" {
		if len(r.recent) < recentMax {
			r.recent = append(r.recent, eventLine{})
		}
		r.recent[r.recentNext] = eventLine{at: e.Time, text: line}
		r.recentNext = (r.recentNext + 1) % recentMax
	}
}

// recentEvents returns the recent events, oldest first.
func (r *recorder) recentEvents() []eventLine {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]eventLine, 0, len(r.recent))
	for i := range len(r.recent) {
		out = append(out, r.recent[(r.recentNext+i)%len(r.recent)])
	}
	return out
}

// waitSeq blocks until the events up to seq have been recorded.
func (r *recorder) waitSeq(done <-chan struct{}, seq int64) bool {
	for {
		r.mu.Lock()
		last, moved := r.lastSeq, r.seqMoved
		r.mu.Unlock()
		if last >= seq {
			return true
		}
		select {
		case <-moved:
		case <-done:
			return false
		}
	}
}

// setFinal records a unit's terminal state. A unit the simulator did not
// submit is not counted in finals.
func (r *recorder) setFinal(u *unitRec, state string, at time.Duration) {
	if u.final == "" && u.spec.task != "" {
		r.finals++
	}
	u.final, u.finalAt = state, at
}

// pending returns the units accepted and not ended.
func (r *recorder) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.order) - r.finals
}
