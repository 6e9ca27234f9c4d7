package writer_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

var at = time.Unix(1_800_000_000, 0)

func open(t *testing.T) (*sqlite.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "w.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, path
}

func insert(id string) *store.Insert {
	return &store.Insert{Units: []*store.Unit{{ID: id, Task: "t"}}, At: at}
}

// published collects what the Publish hook receives, and checks that it
// comes before the Done of its transaction.
type published struct {
	mu     sync.Mutex
	events []store.Event
	ext    []bool
}

func (p *published) hook(evs []store.Event, external bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range evs {
		p.events = append(p.events, e)
		p.ext = append(p.ext, external)
	}
}

func (p *published) seqs() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int64
	for _, e := range p.events {
		out = append(out, e.Seq)
	}
	return out
}

// TestGroupCommit: requests that wait while a transaction runs go into the
// next one together, in order; each Done gets its own results, after its
// events were published.
func TestGroupCommit(t *testing.T) {
	st, _ := open(t)
	hs := &testutil.HoldStore{Store: st}
	var pub published
	w := writer.New(writer.Settings{Store: hs, Clock: clock.Real(), Hooks: writer.Hooks{Publish: pub.hook}})
	defer w.Close()
	hold := hs.Hold(func([]store.Op) bool { return true })
	first := make(chan error, 1)
	w.Submit(&writer.Request{Ops: []store.Op{insert("first")}, Done: func(_ []store.Result, err error) { first <- err }})
	<-hold.Entered
	var wg sync.WaitGroup
	results := make([]string, 10)
	for i := range 10 {
		wg.Add(1)
		id := fmt.Sprint("u", i)
		if err := w.Submit(&writer.Request{Ops: []store.Op{insert(id)}, Done: func(res []store.Result, err error) {
			defer wg.Done()
			if err != nil || len(res) != 1 {
				t.Errorf("%s: %v %v", id, res, err)
				return
			}
			results[i] = res[0].Units[0].ID
			if n := len(pub.seqs()); int64(n) < res[0].Events[0].Seq {
				t.Errorf("%s: Done before its event was published", id)
			}
		}}); err != nil {
			t.Fatal(err)
		}
	}
	hold.Release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, id := range results {
		if id != fmt.Sprint("u", i) {
			t.Fatalf("result %d is %q", i, id)
		}
	}
	batches, ops, _ := w.Stats()
	if batches != 2 || ops != 11 {
		t.Fatalf("%d transactions for %d ops: the waiting requests should share one", batches, ops)
	}
	for i, s := range pub.seqs() {
		if s != int64(i+1) {
			t.Fatalf("published %v: not contiguous in order", pub.seqs())
		}
	}
}

// TestMaxOps: a transaction holds at most MaxOps ops, but a request is
// never split.
func TestMaxOps(t *testing.T) {
	st, _ := open(t)
	hs := &testutil.HoldStore{Store: st}
	w := writer.New(writer.Settings{Store: hs, Clock: clock.Real(), MaxOps: 3})
	defer w.Close()
	hold := hs.Hold(func([]store.Op) bool { return true })
	var wg sync.WaitGroup
	submit := func(ids ...string) {
		var ops []store.Op
		for _, id := range ids {
			ops = append(ops, insert(id))
		}
		wg.Add(1)
		w.Submit(&writer.Request{Ops: ops, Done: func(_ []store.Result, err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		}})
	}
	submit("a")
	<-hold.Entered
	submit("b", "c")
	submit("d", "e", "f", "g") // alone over the cap: its own transaction
	submit("h")
	hold.Release()
	wg.Wait()
	if batches, ops, _ := w.Stats(); batches != 4 || ops != 8 {
		t.Fatalf("%d transactions, %d ops", batches, ops)
	}
}

// TestStickyFailure: a failed transaction fails its requests, calls Failed
// once, and fails every later request at once with the same error.
func TestStickyFailure(t *testing.T) {
	st, _ := open(t)
	fs := &testutil.FailStore{Store: st}
	failed := make(chan error, 2)
	w := writer.New(writer.Settings{Store: fs, Clock: clock.Real(), Hooks: writer.Hooks{Publish: func([]store.Event, bool) {},
		Failed: func(err error) { failed <- err }}})
	defer w.Close()
	if _, err := w.Do(t.Context(), insert("ok")); err != nil {
		t.Fatal(err)
	}
	fs.Fail()
	if _, err := w.Do(t.Context(), insert("lost")); !errors.Is(err, testutil.ErrInjected) {
		t.Fatalf("err %v", err)
	}
	if err := <-failed; !errors.Is(err, testutil.ErrInjected) {
		t.Fatal(err)
	}
	applies := fs.Applies()
	if _, err := w.Do(t.Context(), insert("later")); !errors.Is(err, testutil.ErrInjected) {
		t.Fatalf("later: %v", err)
	}
	if fs.Applies() != applies {
		t.Fatal("a failed writer does not touch the store again")
	}
	if !errors.Is(w.Err(), testutil.ErrInjected) {
		t.Fatal("Err reports the failure")
	}
	select {
	case err := <-failed:
		t.Fatalf("Failed called twice: %v", err)
	default:
	}
}

// TestExternalCommitsPublishedFirst: events another connection committed
// are published (marked external) before this writer's own, in sequence
// order, when its next commit or a Poll finds them.
func TestExternalCommitsPublishedFirst(t *testing.T) {
	st, path := open(t)
	other, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var pub published
	w := writer.New(writer.Settings{Store: st, Clock: clock.Real(), Hooks: writer.Hooks{Publish: pub.hook}})
	defer w.Close()
	if _, err := w.Do(t.Context(), insert("mine-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Apply(t.Context(), []store.Op{insert("theirs-1"), insert("theirs-2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Do(t.Context(), insert("mine-2")); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Apply(t.Context(), []store.Op{insert("theirs-3")}); err != nil {
		t.Fatal(err)
	}
	if err := w.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	var got []string
	for i, e := range pub.events {
		got = append(got, fmt.Sprintf("%d:%s:%v", e.Seq, e.WorkID, pub.ext[i]))
	}
	want := []string{"1:mine-1:false", "2:theirs-1:true", "3:theirs-2:true", "4:mine-2:false", "5:theirs-3:true"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("published %v, want %v", got, want)
	}
}

// TestCloseCommitsPending: Close commits what was submitted before it;
// later requests fail with ErrClosed; Sync after Close returns nil.
func TestCloseCommitsPending(t *testing.T) {
	st, _ := open(t)
	w := writer.New(writer.Settings{Store: st, Clock: clock.Real()})
	done := make(chan error, 1)
	w.Submit(&writer.Request{Ops: []store.Op{insert("pending")}, Done: func(_ []store.Result, err error) { done <- err }})
	w.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetUnit(context.Background(), "pending"); err != nil {
		t.Fatal("a request submitted before Close is committed:", err)
	}
	if err := w.Submit(&writer.Request{Ops: []store.Op{insert("late")}}); !errors.Is(err, writer.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if err := w.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	w.Close() // idempotent
}

// sink records a request's outcome.
type sink chan []store.Result

func (s sink) Committed(res []store.Result, err error) {
	if err != nil {
		res = nil
	}
	s <- res
}

// TestSink: a request without Done reports to its Sink, with its own
// results, after a commit shared with a request that has Done.
func TestSink(t *testing.T) {
	st, _ := open(t)
	w := writer.New(writer.Settings{Store: st, Clock: clock.Real()})
	defer w.Close()
	s := make(sink, 1)
	done := make(chan error, 1)
	w.Submit(&writer.Request{Ops: []store.Op{insert("a")}, Done: func(_ []store.Result, err error) { done <- err }})
	w.Submit(&writer.Request{Ops: []store.Op{insert("b"), insert("c")}, Sink: s})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	res := <-s
	if len(res) != 2 || res[0].Units[0].ID != "b" || res[1].Units[0].ID != "c" {
		t.Fatalf("the sink's results: %+v", res)
	}
}

// watching is a store that pushes change notifications (store.Watcher).
type watching struct {
	*sqlite.Store
	ch chan struct{}
}

func (s watching) Watch(ctx context.Context) (<-chan struct{}, error) { return s.ch, nil }

// TestWatcher: with a store that pushes notifications, another process's
// commit is published at the notification, without waiting for a poll.
func TestWatcher(t *testing.T) {
	st, path := open(t)
	other, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	got := make(chan store.Event, 4)
	ws := watching{Store: st, ch: make(chan struct{}, 1)}
	w := writer.New(writer.Settings{Store: ws, Clock: clock.Real(), Poll: time.Hour, Hooks: writer.Hooks{Publish: func(evs []store.Event, external bool) {
		for _, e := range evs {
			if external {
				got <- e
			}
		}
	}}})
	defer w.Close()
	if _, err := other.Apply(t.Context(), []store.Op{insert("theirs")}); err != nil {
		t.Fatal(err)
	}
	ws.ch <- struct{}{}
	select {
	case e := <-got:
		if e.WorkID != "theirs" {
			t.Fatalf("published %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the notification did not bring the commit")
	}
}

// reading counts the log reads of a watching store.
type reading struct {
	watching
	reads *atomic.Int64
}

func (s reading) EventsAfter(ctx context.Context, after int64, limit int) ([]store.Event, error) {
	s.reads.Add(1)
	return s.watching.EventsAfter(ctx, after, limit)
}

// TestNoPublishNoFollow: a writer without a Publish hook (an executor's)
// neither watches nor reads what other processes commit; with one, the
// same commits are read.
func TestNoPublishNoFollow(t *testing.T) {
	for _, publish := range []bool{false, true} {
		st, path := open(t)
		other, err := sqlite.Open(path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		rs := reading{watching: watching{Store: st, ch: make(chan struct{}, 1)}, reads: new(atomic.Int64)}
		cfg := writer.Settings{Store: rs, Clock: clock.Real(), Poll: time.Millisecond}
		if publish {
			cfg.Hooks.Publish = func([]store.Event, bool) {}
		}
		w := writer.New(cfg)
		if _, err := other.Apply(t.Context(), []store.Op{insert("theirs-" + fmt.Sprint(publish))}); err != nil {
			t.Fatal(err)
		}
		select {
		case rs.ch <- struct{}{}:
		default:
		}
		// Its own commit follows theirs (Batch.Follows).
		if _, err := w.Do(t.Context(), insert("mine-"+fmt.Sprint(publish))); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if n := rs.reads.Load(); (n > 0) != publish {
			t.Fatalf("with Publish %v: %d reads of the log", publish, n)
		}
	}
}

// timedStore's Apply takes took by the fake clock, and fails while fail
// is set.
type timedStore struct {
	store.Store
	clk  *clock.Fake
	took time.Duration
	fail atomic.Bool
}

func (s *timedStore) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	s.clk.Advance(s.took)
	if s.fail.Load() {
		return store.Batch{}, errors.New("the store failed")
	}
	return s.Store.Apply(ctx, ops)
}

// TestBusyTime: the writer's busy time is the time its transactions took
// by its clock, failed ones included, and not the time it waited for
// requests.
func TestBusyTime(t *testing.T) {
	st, _ := open(t)
	clk := clock.NewFake(at)
	ts := &timedStore{Store: st, clk: clk, took: 30 * time.Millisecond}
	w := writer.New(writer.Settings{Store: ts, Clock: clk})
	defer w.Close()
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if _, err := w.Do(ctx, insert(id)); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Second) // idle
	if batches, ops, busy := w.Stats(); batches != 2 || ops != 2 || busy != 60*time.Millisecond {
		t.Fatalf("%d transactions, %d ops, busy %v; want 2, 2, 60ms", batches, ops, busy)
	}
	ts.fail.Store(true)
	ts.took = 20 * time.Millisecond
	if _, err := w.Do(ctx, insert("c")); err == nil {
		t.Fatal("the failed transaction reported no error")
	}
	if batches, _, busy := w.Stats(); batches != 2 || busy != 80*time.Millisecond {
		t.Fatalf("%d transactions, busy %v after a failed one; want 2, 80ms", batches, busy)
	}
}
