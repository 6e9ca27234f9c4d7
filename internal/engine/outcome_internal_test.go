package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// TestDecide is the table of run outcomes: how a run ended, and the
// retry policy, decide the unit's fate, the verdict for its circuits and
// the Finish recorded.
func TestDecide(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	end := start.Add(2 * time.Second)
	facts := runFacts{id: "u", task: "t", owner: "o", run: 3, start: start, failures: 1, deferrals: 0,
		policy: doubling{attempts: 3, base: time.Second}, retryable: always, maxDeferrals: 2,
		services: []string{"api", "host:x.example", "llm"}}
	exhausted := facts
	exhausted.failures = 2
	deferredOut := facts
	deferredOut.deferrals = 2
	probe := facts
	probe.probe, probe.probeFails = true, rt.MaxFreeProbes-1
	poison := probe
	poison.probeFails = rt.MaxFreeProbes
	transient := errors.New("503")
	panicked := errors.New("panic: bug")
	retryAfter := func(d time.Duration, services ...string) ending {
		return ending{returned: true, err: transient, class: ClassRetryAfter, delay: d, services: services, at: end}
	}
	for _, tc := range []struct {
		name    string
		f       runFacts
		e       ending
		state   store.State
		outcome string
		kind    string
		verdict verdict
		requeue bool
		runAt   time.Time
		events  []string
		budget  bool
	}{
		{"success", facts, ending{returned: true, result: []byte(`1`), at: end},
			store.Completed, "completed", "", verdictSuccess, false, time.Time{}, []string{store.TypeWorkCompleted}, false},
		{"failure retried", facts, ending{returned: true, err: transient, at: end},
			store.Queued, "failed", "error", verdictFailure, true, end.Add(2 * time.Second), []string{store.TypeWorkFailed, store.TypeWorkRetrying}, true},
		{"failure, budget spent", exhausted, ending{returned: true, err: transient, at: end},
			store.Failed, "failed", "error", verdictFailure, false, time.Time{}, []string{store.TypeWorkFailed}, true},
		{"permanent", facts, ending{returned: true, err: transient, permanent: true, at: end},
			store.Failed, "failed", "error", verdictNone, false, time.Time{}, []string{store.TypeWorkFailed}, true},
		{"panic", facts, ending{returned: true, err: panicked, class: ClassPanic, at: end},
			store.Queued, "panic", "panic", verdictFailure, true, end.Add(2 * time.Second), []string{store.TypeWorkFailed, store.TypeWorkRetrying}, true},
		{"timeout", facts, ending{err: fmt.Errorf("%w after 2s", ErrTimeout), at: end},
			store.Queued, "timeout", "timeout", verdictFailure, true, end.Add(2 * time.Second), []string{store.TypeWorkFailed, store.TypeWorkRetrying}, true},
		{"timeout, the handler returned its context's cause first", facts, ending{returned: true, err: fmt.Errorf("%w (worker killed)", ErrTimeout), at: end},
			store.Queued, "timeout", "timeout", verdictFailure, true, end.Add(2 * time.Second), []string{store.TypeWorkFailed, store.TypeWorkRetrying}, true},
		{"cancelled, returned", facts, ending{returned: true, err: ErrCancelled, cancelled: &rt.CancelOptions{Reason: "user"}, at: end},
			store.Cancelled, "cancelled", "cancelled", verdictNone, false, time.Time{}, []string{store.TypeWorkCancelled}, false},
		{"cancelled, grace passed", facts, ending{err: ErrCancelled, cancelled: &rt.CancelOptions{}, at: end},
			store.Cancelled, "cancelled", "cancelled", verdictNone, false, time.Time{}, []string{store.TypeWorkCancelled}, false},
		{"cancelled but succeeded", facts, ending{returned: true, cancelled: &rt.CancelOptions{}, at: end},
			store.Completed, "completed", "", verdictSuccess, false, time.Time{}, []string{store.TypeWorkCompleted}, false},
		{"skip", exhausted, ending{returned: true, err: errors.New("skipped: not modified"), class: ClassSkip, skipReason: "not modified", at: end},
			store.Skipped, "skipped", "skipped", verdictNone, false, time.Time{}, []string{store.TypeWorkSkipped}, false},
		{"skip while cancelled", facts, ending{returned: true, err: errors.New("skipped: gone"), class: ClassSkip, skipReason: "gone", cancelled: &rt.CancelOptions{}, at: end},
			store.Skipped, "skipped", "skipped", verdictNone, false, time.Time{}, []string{store.TypeWorkSkipped}, false},
		{"skip at shutdown", facts, ending{returned: true, err: errors.New("skipped: gone"), class: ClassSkip, skipReason: "gone", shutdown: true, at: end},
			store.Skipped, "skipped", "skipped", verdictNone, false, time.Time{}, []string{store.TypeWorkSkipped}, false},
		{"shutdown", facts, ending{returned: true, err: ErrShutdown, shutdown: true, at: end},
			store.Queued, "interrupted", "interrupted", verdictNone, true, time.Time{}, []string{store.TypeWorkRequeued}, false},
		{"late start", facts, ending{returned: true, err: ErrLateStart, class: ClassLateStart, at: end},
			store.Queued, "late_start", "late_start", verdictNone, true, time.Time{}, []string{store.TypeWorkRequeued}, false},
		{"retry-after", facts, retryAfter(30*time.Second, "api"),
			store.Queued, "deferred", "retry_after", verdictNone, true, end.Add(30 * time.Second), []string{store.TypeWorkRetrying}, false},
		{"retry-after past MaxDeferrals", deferredOut, retryAfter(30 * time.Second),
			store.Queued, "failed", "error", verdictNone, true, end.Add(2 * time.Second), []string{store.TypeWorkFailed, store.TypeWorkRetrying}, true},
		{"failed probe", probe, ending{returned: true, err: transient, at: end},
			store.Queued, "failed", "error", verdictFailure, true, time.Time{}, []string{store.TypeWorkFailed, store.TypeWorkRetrying}, false},
		{"failed probe, free probes spent", poison, ending{returned: true, err: transient, at: end},
			store.Queued, "failed", "error", verdictFailure, true, end.Add(2 * time.Second), []string{store.TypeWorkFailed, store.TypeWorkRetrying}, true},
		{"permanent failure of a probe", probe, ending{returned: true, err: transient, permanent: true, at: end},
			store.Failed, "failed", "error", verdictNone, false, time.Time{}, []string{store.TypeWorkFailed}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := decide(tc.f, tc.e, 0)
			fin := o.fin
			if fin.State != tc.state || fin.Attempt.Outcome != tc.outcome || fin.ErrorKind != tc.kind {
				t.Fatalf("state %s outcome %s kind %q; want %s %s %q", fin.State, fin.Attempt.Outcome, fin.ErrorKind, tc.state, tc.outcome, tc.kind)
			}
			if o.verdict != tc.verdict || o.requeue != tc.requeue || !o.runAt.Equal(tc.runAt) || !fin.RunAt.Equal(tc.runAt) {
				t.Fatalf("verdict %d requeue %v at %v (finish %v); want %d %v %v", o.verdict, o.requeue, o.runAt, fin.RunAt, tc.verdict, tc.requeue, tc.runAt)
			}
			if fin.SpendBudget != tc.budget {
				t.Fatalf("budget %v", fin.SpendBudget)
			}
			var types []string
			for _, ev := range fin.Events {
				types = append(types, ev.Type)
			}
			if fmt.Sprint(types) != fmt.Sprint(tc.events) {
				t.Fatalf("events %v, want %v", types, tc.events)
			}
			if fin.ID != "u" || fin.Run != 3 || fin.Owner != "o" || !fin.At.Equal(end) || !fin.Attempt.Start.Equal(start) || !fin.Attempt.End.Equal(end) {
				t.Fatalf("finish identity %+v", fin)
			}
			wantFailures := tc.f.failures
			if tc.budget {
				wantFailures++
			}
			if o.failures != wantFailures {
				t.Fatalf("failures %d, want %d", o.failures, wantFailures)
			}
			if fin.Propagate != (fin.State == store.Failed || fin.State == store.Cancelled) {
				t.Fatalf("propagate %v for %s", fin.Propagate, fin.State)
			}
		})
	}
	// A Retry-After holds the services it names (by name or class), or all
	// of the run's when it names none or one the run does not use; the
	// work_retrying event says which.
	for _, tc := range []struct {
		named         []string
		held, unknown string
	}{
		{[]string{"api"}, "[api]", ""},
		{nil, "[api host:x.example llm]", ""},
		{[]string{"host"}, "[host:x.example]", ""},
		{[]string{"host:x.example", "llm"}, "[host:x.example llm]", ""},
		{[]string{"ap1"}, "[api host:x.example llm]", "ap1"},
	} {
		o := decide(facts, retryAfter(time.Minute, tc.named...), 0)
		if o.hold != time.Minute || fmt.Sprint(o.holdServices) != tc.held || o.holdUnknown != tc.unknown || o.deferrals != 1 {
			t.Fatalf("%v: hold %v %v unknown %q deferrals %d", tc.named, o.hold, o.holdServices, o.holdUnknown, o.deferrals)
		}
		if got := o.fin.Events[0].Detail.Services; fmt.Sprint(got) != tc.held {
			t.Fatalf("%v: the event says %v", tc.named, got)
		}
	}
}

// The lease rule: a run cut off at its deadline whose Runner has not
// reported its end may go on until its lease ends, so its unit waits for
// that (at least) before it runs again; a handler that returned its
// context's cause did end, and waits only its backoff.
func TestDecideLeaseRule(t *testing.T) {
	end := time.Date(2026, 1, 1, 0, 0, 2, 0, time.UTC)
	f := runFacts{id: "u", task: "t", run: 1, policy: doubling{attempts: 3, base: time.Second}, retryable: always,
		lease: end.Add(time.Minute)}
	o := decide(f, ending{err: ErrTimeout, at: end}, 0)
	if !o.leaseHeld || !o.runAt.Equal(f.lease) || !o.fin.RunAt.Equal(f.lease) || !o.backoffAt.Equal(end.Add(time.Second)) {
		t.Fatalf("cut off: held %v, runAt %v, backoff %v", o.leaseHeld, o.runAt, o.backoffAt)
	}
	if got := o.fin.Events[1].Detail.NextAttempt; got != f.lease.UnixNano() {
		t.Fatalf("work_retrying says %v", time.Unix(0, got))
	}
	o = decide(f, ending{returned: true, class: ClassTimeout, err: ErrTimeout, at: end}, 0)
	if o.leaseHeld || !o.runAt.Equal(end.Add(time.Second)) {
		t.Fatalf("returned: held %v, runAt %v", o.leaseHeld, o.runAt)
	}
	f.lease = end // a lease already over holds nothing
	if o = decide(f, ending{err: ErrTimeout, at: end}, 0); o.leaseHeld {
		t.Fatal("an ended lease holds")
	}
}

// A handler's error of any size is recorded cut to maxErrorText, at a
// character's start, saying how much was cut.
func TestDecideBoundsErrorText(t *testing.T) {
	facts := runFacts{id: "u", task: "t", run: 1, policy: doubling{attempts: 1, base: time.Second}, retryable: always}
	huge := errors.New(strings.Repeat("é", 1<<20))
	o := decide(facts, ending{returned: true, err: huge, at: time.Unix(1, 0)}, 0)
	if len(o.fin.Error) > maxErrorText || !utf8.ValidString(o.fin.Error) || !strings.HasSuffix(o.fin.Error, "bytes cut)") {
		t.Fatalf("recorded %d bytes, valid UTF-8 %v, ends %q", len(o.fin.Error), utf8.ValidString(o.fin.Error), o.fin.Error[len(o.fin.Error)-30:])
	}
	if o.fin.Attempt.Error != o.fin.Error || !strings.Contains(o.fin.Events[0].Detail.Error, "bytes cut") {
		t.Fatal("the attempt and the event record the same cut text")
	}
	if small := decide(facts, ending{returned: true, err: errors.New("503"), at: time.Unix(1, 0)}, 0); small.fin.Error != "503" {
		t.Fatalf("a small error is kept whole: %q", small.fin.Error)
	}
}

// doubling is a retry policy of attempts runs, waiting base, then twice as
// long after each failure.
type doubling struct {
	attempts int
	base     time.Duration
}

func (p doubling) Attempts() int { return p.attempts }
func (p doubling) Delay(failures int, _ float64) time.Duration {
	return p.base << (failures - 1)
}

func always(error) bool { return true }
