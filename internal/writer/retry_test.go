package writer_test

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// outages records the Outage and Recovered hooks.
type outages struct {
	mu        sync.Mutex
	began     []error
	recovered int
}

func (o *outages) hooks(h writer.Hooks) writer.Hooks {
	h.Outage = func(_ time.Time, err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.began = append(o.began, err)
	}
	h.Recovered = func(time.Time) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.recovered++
	}
	return h
}

func (o *outages) counts() (int, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.began), o.recovered
}

var errIO = errors.New("disk I/O error (flaky, injected)")

// faulty is a FaultStore on a fresh SQLite store whose errIO is Flaky.
func faulty(t *testing.T) *testutil.FaultStore {
	st, _ := open(t)
	return &testutil.FaultStore{Store: st, Class: func(err error) (store.Fault, bool) {
		if errors.Is(err, errIO) {
			return store.Flaky, true
		}
		return 0, false
	}}
}

func fastRetries(cfg writer.Settings) writer.Settings {
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 4*time.Millisecond
	return cfg
}

func units(t *testing.T, st store.Store) int {
	t.Helper()
	us, err := st.ListUnits(t.Context(), store.ListFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(us)
}

// TestTransientRetried: a transaction that fails with transient errors
// (a reset connection, a refused one) is tried again until it commits; the
// outage is reported once, as is its end; nothing is stored twice.
func TestTransientRetried(t *testing.T) {
	fs := faulty(t)
	var out outages
	var pub published
	w := writer.New(fastRetries(writer.Settings{Store: fs, Clock: clock.Real(), Hooks: out.hooks(writer.Hooks{Publish: pub.hook})}))
	defer w.Close()
	fs.Inject(testutil.Fault{Err: syscall.ECONNRESET}, testutil.Fault{Err: syscall.ECONNREFUSED}, testutil.Fault{Err: syscall.ECONNRESET})
	res, err := w.Do(t.Context(), insert("a"))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || len(res[0].Events) != 1 {
		t.Fatalf("result %+v", res[0])
	}
	if n := fs.Applies(); n != 4 {
		t.Fatalf("%d applies, want 4 (3 failed, 1 committed)", n)
	}
	if began, rec := out.counts(); began != 1 || rec != 1 {
		t.Fatalf("outage reported %d times, recovery %d: want once each", began, rec)
	}
	if w.Err() != nil {
		t.Fatalf("a transient failure is not sticky: %v", w.Err())
	}
	if _, _, ok := w.Outage(); ok {
		t.Fatal("the outage ended")
	}
	if got := pub.seqs(); len(got) != 1 {
		t.Fatalf("published %v, want one event", got)
	}
	if n := units(t, fs.Store); n != 1 {
		t.Fatalf("%d units stored", n)
	}
}

// TestFlakyBounded: a Flaky error (SQLITE_IOERR) is retried MaxFlaky
// times in a row, then the store is taken as failed, by its error's name.
func TestFlakyBounded(t *testing.T) {
	fs := faulty(t)
	failed := make(chan error, 2)
	cfg := fastRetries(writer.Settings{Store: fs, Clock: clock.Real(), MaxFlaky: 3, Hooks: writer.Hooks{Publish: func([]store.Event, bool) {},
		Failed: func(err error) { failed <- err }}})
	w := writer.New(cfg)
	defer w.Close()
	fs.Down(errIO)
	if _, err := w.Do(t.Context(), insert("a")); !errors.Is(err, errIO) {
		t.Fatalf("err %v, want the flaky error", err)
	}
	if err := <-failed; !errors.Is(err, errIO) {
		t.Fatal(err)
	}
	if n := fs.Applies(); n != 4 {
		t.Fatalf("%d applies, want 1 + MaxFlaky retries", n)
	}
	fs.Up()
	if _, err := w.Do(t.Context(), insert("b")); !errors.Is(err, errIO) {
		t.Fatalf("after the fatal failure: %v", err)
	}
}

// TestFlakyResetsOnCommit: the Flaky bound counts failures in a row; a
// commit between them starts the count again.
func TestFlakyResetsOnCommit(t *testing.T) {
	fs := faulty(t)
	w := writer.New(fastRetries(writer.Settings{Store: fs, Clock: clock.Real(), MaxFlaky: 2, Hooks: writer.Hooks{Publish: func([]store.Event, bool) {}}}))
	defer w.Close()
	for i := range 3 {
		fs.Inject(testutil.Fault{Err: errIO}, testutil.Fault{Err: errIO})
		if _, err := w.Do(t.Context(), insert(string(rune('a'+i)))); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
}

// TestWithdrawnDuringOutage: a caller that gives up during an outage gets
// ErrUnavailable (with its context's error, the outage's start and last
// error), and its ops are never stored, also once the store is back.
func TestWithdrawnDuringOutage(t *testing.T) {
	fs := faulty(t)
	w := writer.New(fastRetries(writer.Settings{Store: fs, Clock: clock.Real(), Hooks: writer.Hooks{Publish: func([]store.Event, bool) {}}}))
	defer w.Close()
	fs.Down(syscall.ECONNREFUSED)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := w.Do(ctx, insert("gone"))
	if !errors.Is(err, writer.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want ErrUnavailable and the deadline", err)
	}
	var ue *writer.UnavailableError
	if !errors.As(err, &ue) || ue.Since.IsZero() || !errors.Is(ue.Last, syscall.ECONNREFUSED) {
		t.Fatalf("err %#v: want the outage's start and last error", err)
	}
	fs.Up()
	if _, err := w.Do(t.Context(), insert("kept")); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Store.GetUnit(t.Context(), "gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the withdrawn unit: %v, want not stored", err)
	}
	if n := units(t, fs.Store); n != 1 {
		t.Fatalf("%d units stored, want 1", n)
	}
}

// TestInFlightOutcomeUnknown: a caller that gives up while its
// transaction runs gets ErrOutcomeUnknown: the transaction may commit.
func TestInFlightOutcomeUnknown(t *testing.T) {
	st, _ := open(t)
	hs := &testutil.HoldStore{Store: st}
	w := writer.New(writer.Settings{Store: hs, Clock: clock.Real(), Hooks: writer.Hooks{Publish: func([]store.Event, bool) {}}})
	defer w.Close()
	hold := hs.Hold(func([]store.Op) bool { return true })
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := w.Do(ctx, insert("maybe"))
		errc <- err
	}()
	<-hold.Entered
	cancel()
	if err := <-errc; !errors.Is(err, writer.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want ErrOutcomeUnknown", err)
	}
	hold.Release()
	if err := w.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetUnit(t.Context(), "maybe"); err != nil {
		t.Fatalf("the transaction in flight went on: %v", err)
	}
}

// TestUnknownCommitResolved: a COMMIT whose answer was lost is resolved by
// asking the store (through its errors while it is still unreachable),
// never by trying again: a transaction that committed is taken with its
// results and events; one that did not is tried again. Either way the
// unit is stored once.
func TestUnknownCommitResolved(t *testing.T) {
	for _, committed := range []bool{true, false} {
		t.Run(map[bool]string{true: "committed", false: "not committed"}[committed], func(t *testing.T) {
			fs := faulty(t)
			var pub published
			w := writer.New(fastRetries(writer.Settings{Store: fs, Clock: clock.Real(), Hooks: writer.Hooks{Publish: pub.hook}}))
			defer w.Close()
			fs.Inject(testutil.Fault{Err: syscall.ECONNRESET, Unknown: true, Committed: committed,
				ResolveErrs: []error{syscall.ECONNREFUSED, syscall.ECONNREFUSED}})
			res, err := w.Do(t.Context(), insert("once"))
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Err != nil || !res[0].Applied || len(res[0].Events) != 1 {
				t.Fatalf("result %+v", res[0])
			}
			want := 1
			if !committed {
				want = 2
			}
			if n := fs.Applies(); n != want {
				t.Fatalf("%d applies, want %d", n, want)
			}
			if n := units(t, fs.Store); n != 1 {
				t.Fatalf("%d units stored", n)
			}
			if got := pub.seqs(); len(got) != 1 {
				t.Fatalf("published %v, want one event", got)
			}
			last, _ := fs.Store.LastSeq(t.Context())
			if last != 1 {
				t.Fatalf("the log holds %d events, want 1", last)
			}
		})
	}
}

// TestFenceFailsPending: once an owner's epoch is fenced (its lease lost),
// its ops still waiting fail with ErrNotOwner without reaching the store,
// while the store is down; others' ops wait and commit when it is back.
func TestFenceFailsPending(t *testing.T) {
	fs := faulty(t)
	w := writer.New(fastRetries(writer.Settings{Store: fs, Clock: clock.Real(), Hooks: writer.Hooks{Publish: func([]store.Event, bool) {}}}))
	defer w.Close()
	fs.Down(syscall.ECONNREFUSED)
	owner := make(chan error, 1)
	w.Submit(&writer.Request{Ops: []store.Op{&store.Recover{Epoch: 3}}, Done: func(_ []store.Result, err error) { owner <- err }})
	other := make(chan error, 1)
	w.Submit(&writer.Request{Ops: []store.Op{insert("other")}, Done: func(_ []store.Result, err error) { other <- err }})
	for fs.Applies() < 3 {
		time.Sleep(time.Millisecond)
	}
	w.Fence(3)
	select {
	case err := <-owner:
		if !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("fenced op: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the fenced op still waits")
	}
	select {
	case err := <-other:
		t.Fatalf("the other op ended while the store is down: %v", err)
	default:
	}
	fs.Up()
	if err := <-other; err != nil {
		t.Fatal(err)
	}
	if n := units(t, fs.Store); n != 1 {
		t.Fatalf("%d units", n)
	}
}

// TestCloseDuringOutage: Close retries what is pending for StopGrace (on
// the writer's clock), then fails it with ErrUnavailable: nothing stored.
func TestCloseDuringOutage(t *testing.T) {
	fs := faulty(t)
	fake := clock.NewFake(at)
	w := writer.New(writer.Settings{Store: fs, Clock: fake, StopGrace: 5 * time.Second, Hooks: writer.Hooks{Publish: func([]store.Event, bool) {}}})
	fs.Down(syscall.ECONNREFUSED)
	errc := make(chan error, 1)
	w.Submit(&writer.Request{Ops: []store.Op{insert("late")}, Done: func(_ []store.Result, err error) { errc <- err }})
	closed := make(chan struct{})
	go func() {
		w.Close()
		close(closed)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for done := false; !done; {
		select {
		case <-closed:
			done = true
		default:
			if time.Now().After(deadline) {
				t.Fatal("Close did not end")
			}
			if next, ok := fake.NextDeadline(); ok {
				fake.Set(next)
			} else {
				time.Sleep(time.Millisecond)
			}
		}
	}
	if err := <-errc; !errors.Is(err, writer.ErrUnavailable) || !errors.Is(err, writer.ErrClosed) {
		t.Fatalf("err %v, want ErrUnavailable after Close", err)
	}
	if fake.Now().Sub(at) < 5*time.Second {
		t.Fatalf("gave up after %v, before the grace", fake.Now().Sub(at))
	}
	if n := units(t, fs.Store); n != 0 {
		t.Fatalf("%d units", n)
	}
}

// TestRewindDetected: a commit that follows a log ending below what the
// writer already published (the database lost commits) fails the store,
// naming ErrRewound.
func TestRewindDetected(t *testing.T) {
	st, _ := open(t)
	failed := make(chan error, 1)
	w := writer.New(writer.Settings{Store: st, Clock: clock.Real(), LastSeq: 100,
		Hooks: writer.Hooks{Publish: func([]store.Event, bool) {}, Failed: func(err error) { failed <- err }}})
	defer w.Close()
	if _, err := w.Do(t.Context(), insert("a")); err != nil {
		t.Fatal(err)
	}
	if err := <-failed; !errors.Is(err, store.ErrRewound) {
		t.Fatalf("Failed %v, want ErrRewound", err)
	}
	if _, err := w.Do(t.Context(), insert("b")); !errors.Is(err, store.ErrRewound) {
		t.Fatalf("later writes: %v", err)
	}
}

// TestRewindSeenByPolls: a writer that commits nothing (a standby, a
// submitter) sees the log go back at its polls.
func TestRewindSeenByPolls(t *testing.T) {
	st, _ := open(t)
	failed := make(chan error, 1)
	w := writer.New(writer.Settings{Store: st, Clock: clock.Real(), Poll: time.Millisecond, LastSeq: 100,
		Hooks: writer.Hooks{Publish: func([]store.Event, bool) {}, Failed: func(err error) { failed <- err }}})
	defer w.Close()
	select {
	case err := <-failed:
		if !errors.Is(err, store.ErrRewound) {
			t.Fatalf("Failed %v, want ErrRewound", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the rewind was not seen")
	}
}
