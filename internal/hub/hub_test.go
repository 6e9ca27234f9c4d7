package hub

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/runcue/runcue/store"
)

// logStore is a store whose event log is a slice; only EventsAfter is used.
type logStore struct {
	store.Store
	mu    sync.Mutex
	log   []store.Event
	first int64 // events below it were pruned
}

func (s *logStore) append(n int) []store.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Event
	for range n {
		ev := store.Event{Seq: int64(len(s.log)) + 1, Type: "e"}
		s.log = append(s.log, ev)
		out = append(out, ev)
	}
	return out
}

func (s *logStore) EventsAfter(_ context.Context, after int64, limit int) ([]store.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Event
	for _, ev := range s.log {
		if ev.Seq > after && ev.Seq >= s.first && len(out) < limit {
			out = append(out, ev)
		}
	}
	return out, nil
}

func id(e *store.Event) store.Event { return *e }

func collect(t *testing.T, ch <-chan store.Event, n int) []store.Event {
	t.Helper()
	var out []store.Event
	timeout := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("closed after %d of %d", len(out), n)
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("got %d of %d", len(out), n)
		}
	}
	return out
}

func assertSeqs(t *testing.T, evs []store.Event, from int64) {
	t.Helper()
	for i, ev := range evs {
		if ev.Seq != from+int64(i) {
			t.Fatalf("event %d has seq %d, want %d", i, ev.Seq, from+int64(i))
		}
	}
}

func TestLive(t *testing.T) {
	st := &logStore{}
	h := New(st, 16, 0)
	defer h.Close()
	ch := Subscribe(t.Context(), h, Options{After: -1}, id)
	h.Publish(st.append(5))
	assertSeqs(t, collect(t, ch, 5), 1)
}

// TestOverrun: a stalled subscriber that falls behind the ring reads the
// rest from the store, in order, without gaps or duplicates; ephemeral
// events it missed are skipped.
func TestOverrun(t *testing.T) {
	st := &logStore{}
	h := New(st, 16, 0)
	defer h.Close()
	release := make(chan struct{})
	var once sync.Once
	h.BeforeSend = func() { <-release }
	ch := Subscribe(t.Context(), h, Options{After: 0}, id)
	for range 100 {
		h.Publish(st.append(7))
		h.Publish([]store.Event{{Type: "ephemeral"}})
	}
	once.Do(func() { close(release) })
	var durable []store.Event
	for len(durable) < 700 {
		ev := collect(t, ch, 1)[0]
		if ev.Seq != 0 {
			durable = append(durable, ev)
		}
	}
	assertSeqs(t, durable, 1)
	// Back on the ring: ephemeral events published after its cursor are
	// delivered (the one published after event 700 may be, if the ring still
	// held it when the subscriber reattached), then the live one.
	h.Publish([]store.Event{{Type: "ephemeral", WorkID: "live"}})
	for {
		ev := collect(t, ch, 1)[0]
		if ev.Seq != 0 {
			t.Fatalf("a durable event twice: %+v", ev)
		}
		if ev.WorkID == "live" {
			break
		}
	}
}

// TestFromStartBehindEphemeral: a subscriber from the start, on a hub whose
// oldest ring entry is ephemeral (Seq 0, like its cursor), reads the history
// from the store rather than attaching at that entry.
func TestFromStartBehindEphemeral(t *testing.T) {
	st := &logStore{}
	h := New(st, 16, 0)
	defer h.Close()
	h.Publish(st.append(20))
	h.Publish([]store.Event{{Type: "ephemeral"}})
	h.Publish(st.append(15)) // the ring holds the ephemeral event, then 21..35
	ch := Subscribe(t.Context(), h, Options{After: 0}, id)
	var durable []store.Event
	for len(durable) < 35 {
		if ev := collect(t, ch, 1)[0]; ev.Seq != 0 {
			durable = append(durable, ev)
		}
	}
	assertSeqs(t, durable, 1)
}

func TestResumeAndGap(t *testing.T) {
	st := &logStore{}
	st.append(50)
	h := New(st, 16, 50) // started after 50 events were written
	defer h.Close()
	ch := Subscribe(t.Context(), h, Options{After: 20}, id)
	assertSeqs(t, collect(t, ch, 30), 21)
	h.Publish(st.append(3))
	assertSeqs(t, collect(t, ch, 3), 51)

	st.mu.Lock()
	st.first = 40 // retention removed 1..39
	st.mu.Unlock()
	gapCh := Subscribe(t.Context(), h, Options{After: 10, Gap: func(after, first int64) store.Event {
		return store.Event{Type: "gap", Attempt: int(first - after - 1)}
	}}, id)
	evs := collect(t, gapCh, 2)
	if evs[0].Type != "gap" || evs[0].Attempt != 29 {
		t.Fatalf("want a gap of 29 events (11..39), got %+v", evs[0])
	}
	if evs[1].Seq != 40 {
		t.Fatalf("then seq 40, got %d", evs[1].Seq)
	}
}

func TestFilterWatchClose(t *testing.T) {
	st := &logStore{}
	h := New(st, 16, 0)
	ch := Subscribe(t.Context(), h, Options{After: -1, Accept: func(e *store.Event) bool { return e.Seq%2 == 0 }}, id)
	w := h.Watch("u1")
	evs := st.append(4)
	evs[2].WorkID = "u1"
	h.Publish(evs)
	got := collect(t, ch, 2)
	if got[0].Seq != 2 || got[1].Seq != 4 {
		t.Fatalf("filter: %+v", got)
	}
	select {
	case <-w:
	default:
		t.Fatal("Watch not closed by the unit's event")
	}
	closed := make(chan struct{})
	ch2 := Subscribe(context.Background(), h, Options{After: -1, OnClose: func() { close(closed) }}, id)
	h.Close()
	if _, ok := <-ch2; ok {
		t.Fatal("subscription not closed with the hub")
	}
	<-closed
	if _, ok := <-Subscribe(context.Background(), h, Options{}, id); ok {
		t.Fatal("a subscription to a closed hub must be closed")
	}
}
