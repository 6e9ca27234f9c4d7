package runcue_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/sse"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// countingStore counts the events a store hands to subscribers.
type countingStore struct {
	store.Store
	read atomic.Int64
}

func (s *countingStore) EventsAfter(ctx context.Context, after int64, limit int) ([]store.Event, error) {
	evs, err := s.Store.EventsAfter(ctx, after, limit)
	s.read.Add(int64(len(evs)))
	return evs, err
}

func (s *countingStore) MatchingEvents(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	evs, err := s.Store.MatchingEvents(ctx, q)
	s.read.Add(int64(len(evs)))
	return evs, err
}

// TestFilteredSubscriptionReadsOnlyMatches: a subscription from the start
// of the log with a task or type filter reads only the events it delivers
// from the store, not the whole retained log (an SSE client asking for
// ?after=0&task=nothing used to make the Cue read everything).
func TestFilteredSubscriptionReadsOnlyMatches(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	cs := &countingStore{Store: st}
	c, err := runcue.New(cs, runcue.Config{Logger: quietLogger, EventBuffer: 16})
	require.NoError(t, err)
	defer c.Close()
	ctx := t.Context()
	require.NoError(t, c.Task("a", runcue.Task{Handler: noop}))
	require.NoError(t, c.Task("b", runcue.Task{Handler: noop}))
	require.NoError(t, c.Start(ctx))
	_, err = c.SubmitBatch(ctx, batchOf("a", 2000))
	require.NoError(t, err)
	require.NoError(t, c.Drain(ctx))
	b, err := c.Submit(ctx, runcue.Submission{Task: "b"})
	require.NoError(t, err)
	_, err = c.Wait(ctx, b.ID)
	require.NoError(t, err)
	require.NoError(t, c.Drain(ctx))

	for _, o := range []runcue.SubscribeOptions{
		{After: 0, Tasks: []string{"b"}},
		{After: 0, Tasks: []string{"b"}, Types: []runcue.EventType{runcue.EventWorkQueued, runcue.EventWorkStarted, runcue.EventWorkCompleted}},
	} {
		cs.read.Store(0)
		evs, cancel, err := c.Subscribe(ctx, o)
		require.NoError(t, err)
		for _, want := range []runcue.EventType{runcue.EventWorkQueued, runcue.EventWorkStarted, runcue.EventWorkCompleted} {
			ev := <-evs
			assert.Equal(t, want, ev.Type)
			assert.Equal(t, b.ID, ev.WorkID)
		}
		cancel()
		assert.LessOrEqual(t, cs.read.Load(), int64(10), "read %d events from the store for 3 delivered (the log has over 6,000)", cs.read.Load())
	}
	cs.read.Store(0)
	evs, cancel, err := c.Subscribe(ctx, runcue.SubscribeOptions{After: 0, Types: []runcue.EventType{runcue.EventWorkCompleted}, Tasks: []string{"b"}})
	require.NoError(t, err)
	assert.Equal(t, b.ID, (<-evs).WorkID)
	cancel()
	assert.LessOrEqual(t, cs.read.Load(), int64(3))
}

// sseData reads an SSE stream until n data lines, returning their events.
func sseData(t *testing.T, body io.Reader, n int) []runcue.Event {
	t.Helper()
	var out []runcue.Event
	sc := bufio.NewScanner(body)
	for len(out) < n && sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var ev runcue.Event
			require.NoError(t, json.Unmarshal([]byte(data), &ev))
			out = append(out, ev)
		}
	}
	require.Len(t, out, n, "stream ended: %v", sc.Err())
	return out
}

// TestSSEAuthorize: the hook refuses requests or narrows their filter.
func TestSSEAuthorize(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("public", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Task("secret", runcue.Task{Handler: noop}))
	h := sse.Handler(e.c, sse.Options{Authorize: func(r *http.Request, f *sse.Filter) error {
		switch r.Header.Get("Authorization") {
		case "":
			return &sse.Error{Status: http.StatusUnauthorized, Msg: "login first"}
		case "guest":
			f.Tasks = []string{"public"} // whatever they asked for
			return nil
		case "banned":
			return errors.New("not you")
		}
		return nil
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, disconnect := context.WithCancel(e.ctx)
	defer disconnect() // before srv.Close, which waits for the streams
	e.start()
	e.wait(e.submit("secret"))
	pub := e.submit("public")
	e.wait(pub)
	get := func(auth string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/?after=0&task=secret,public", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	assert.Equal(t, http.StatusUnauthorized, get("").StatusCode)
	assert.Equal(t, http.StatusForbidden, get("banned").StatusCode)
	resp := get("guest")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Connection"), "no hop-by-hop header")
	for _, ev := range sseData(t, resp.Body, 3) {
		assert.Equal(t, pub, ev.WorkID, "the guest sees only public work")
	}
}

// TestSSEOutlivesWriteTimeout: a server's WriteTimeout does not cut a
// stream (the handler clears the write deadline).
func TestSSEOutlivesWriteTimeout(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	srv := httptest.NewUnstartedServer(sse.Handler(e.c, sse.Options{KeepAlive: 10 * time.Millisecond}))
	srv.Config.WriteTimeout = 100 * time.Millisecond
	srv.Start()
	defer srv.Close()
	ctx, disconnect := context.WithCancel(e.ctx)
	defer disconnect()
	e.start()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/?type=work_completed", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	time.Sleep(300 * time.Millisecond) // past the write timeout (not a measurement)
	id := e.submit("t")
	assert.Equal(t, id, sseData(t, resp.Body, 1)[0].WorkID, "the stream is still open")
}
