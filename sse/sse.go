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
package sse

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue"
)

// Options configure a Handler. The zero value is valid.
type Options struct {
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
	opts := runcue.SubscribeOptions{After: after, Tasks: list(q["task"]), Buffer: 256}
	for _, t := range list(q["type"]) {
		opts.Types = append(opts.Types, runcue.EventType(t))
	}
	events, cancel, err := h.c.Subscribe(r.Context(), opts)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer cancel()
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("Connection", "keep-alive")
	hdr.Set("X-Accel-Buffering", "no") // nginx: do not buffer
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
