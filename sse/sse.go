// Package sse serves a Cue's events to browsers as Server-Sent Events.
//
//	http.Handle("/events", sse.Handler(cue, sse.Options{}))
//
// Each durable event carries its sequence number as the SSE id, so a
// browser's EventSource that reconnects sends Last-Event-ID and resumes
// exactly where it stopped: no event is lost or repeated. The query string
// filters the stream: ?type=work_completed,work_failed and ?task=extract
// (both repeatable or comma-separated); ?after=N resumes after sequence
// number N when there is no Last-Event-ID header (0: the whole retained
// log; absent: from now).
//
// An event is sent as
//
//	id: 42
//	event: work_completed
//	data: {"seq":42,"type":"work_completed","work_id":"01J...","task":"extract",...}
//
// with the data a runcue.Event in JSON. Events that are not durable
// (work_progress, queue_status, service_status) have no id.
//
// A stream ends when the client goes away, the Cue closes, or the request's
// context ends. An event stream never goes idle, so http.Server.Shutdown
// does not end it by itself: give the server a BaseContext that is
// cancelled at shutdown (srv.RegisterOnShutdown(cancel)), as
// examples/webui does. The handler clears the connection's write deadline,
// so a server WriteTimeout does not cut streams.
//
// Options.Authorize decides who may read which events: it sees each
// request and may refuse it or narrow its filter. Without it every client
// that reaches the handler reads every event: mount it behind your
// authentication.
package sse

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue"
)

// Filter is what a stream delivers: events of these types and of units of
// these tasks (empty: all).
type Filter struct {
	Types []runcue.EventType
	Tasks []string
}

// Options configure a Handler. The zero value is valid.
type Options struct {
	// Authorize, when set, is called for every request with the filter the
	// query string asks for, before anything is sent. It returns an error
	// to refuse the request (answered 403 Forbidden with the error's text,
	// or the status of an *Error), or narrows f in place (say, to the tasks
	// the caller may see); the stream delivers what f says afterwards.
	Authorize func(r *http.Request, f *Filter) error
	// KeepAlive is how often a comment line is sent when no event is, so
	// that proxies keep the connection open. Default 15s.
	KeepAlive time.Duration
	// Retry is the reconnection delay suggested to the browser. Default 2s.
	Retry time.Duration
}

// Handler returns an http.Handler streaming c's events. It is safe for
// simultaneous use; each request is one subscription, which ends when the
// client goes away or c closes.
func Handler(c *runcue.Cue, o Options) http.Handler {
	if o.KeepAlive <= 0 {
		o.KeepAlive = 15 * time.Second
	}
	if o.Retry <= 0 {
		o.Retry = 2 * time.Second
	}
	return &handler{c: c, o: o}
}

// Error is an error with an HTTP status, for Authorize to return (401
// Unauthorized for a missing login, say).
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

type handler struct {
	c *runcue.Cue
	o Options
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	q := r.URL.Query()
	after := runcue.SeqNow
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bad Last-Event-ID", http.StatusBadRequest)
			return
		}
		after = n
	} else if a := q.Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bad after", http.StatusBadRequest)
			return
		}
		after = n
	}
	f := Filter{Tasks: list(q["task"])}
	for _, t := range list(q["type"]) {
		f.Types = append(f.Types, runcue.EventType(t))
	}
	if h.o.Authorize != nil {
		if err := h.o.Authorize(r, &f); err != nil {
			status := http.StatusForbidden
			var he *Error
			if errors.As(err, &he) && he.Status != 0 {
				status = he.Status
			}
			http.Error(w, err.Error(), status)
			return
		}
	}
	opts := runcue.SubscribeOptions{After: after, Tasks: f.Tasks, Types: f.Types, Buffer: 256}
	events, cancel, err := h.c.Subscribe(r.Context(), opts)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer cancel()
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no") // nginx: do not buffer
	// A stream outlives any write timeout the server has; keep-alive pings
	// detect a dead client.
	if err := rc.SetWriteDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprintf(w, "retry: %d\n\n", h.o.Retry.Milliseconds()); err != nil {
		return
	}
	if rc.Flush() != nil {
		return
	}
	keepAlive := time.NewTicker(h.o.KeepAlive)
	defer keepAlive.Stop()
	var buf []byte
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return // the client left, or the Cue closed
			}
			buf = appendEvent(buf[:0], ev)
			// Send what else is ready in the same write.
			for more := true; more && len(buf) < 64<<10; {
				select {
				case ev, ok := <-events:
					if !ok {
						more = false
						break
					}
					buf = appendEvent(buf, ev)
				default:
					more = false
				}
			}
			if _, err := w.Write(buf); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		case <-keepAlive.C:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

func appendEvent(b []byte, ev runcue.Event) []byte {
	if ev.Seq > 0 {
		b = append(b, "id: "...)
		b = strconv.AppendInt(b, ev.Seq, 10)
		b = append(b, '\n')
	}
	b = append(b, "event: "...)
	b = append(b, ev.Type...)
	b = append(b, "\ndata: "...)
	data, _ := json.Marshal(ev) // no newline in compact JSON
	b = append(b, data...)
	return append(b, "\n\n"...)
}

// list splits repeated, comma-separated query values.
func list(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}
