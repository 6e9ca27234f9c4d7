// Package dashboard serves a live operator dashboard for a Cue as an
// http.Handler: an overview of the queue, the services and their limits,
// a filtered and paged list of work, each unit with its attempts, its
// dependencies and why it is not running, and a live tail of events.
//
//	mux.Handle("/ops/", http.StripPrefix("/ops", dashboard.Handler(cue, dashboard.Options{})))
//
// It works under any path prefix: every link is relative to the prefix the
// request was routed under. Pages update live over Server-Sent Events,
// coalesced to at most one refresh a second whatever the event rate, and
// say "disconnected" within a few heartbeats (Options.Heartbeat) when the
// server goes away; they reconnect by themselves.
//
// State-changing requests are POSTs guarded by http.CrossOriginProtection;
// Options.ReadOnly hides and refuses them. Every action calls the same Cue
// method as the runcue command, and the Cue records it as an event.
//
// A page holds two streams open (events and heartbeats), which never go
// idle: as for the sse package, give the http.Server a BaseContext that is
// cancelled at shutdown, so that Shutdown ends them.
//
// The handler does no authentication: mount it behind the application's
// own (BasicAuth is a minimal helper). It reads the Cue from any process
// on the database, owner or not (see Cue.Stats and Cue.Services).
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/sse"
)

// Options configure a Handler. The zero value is valid.
type Options struct {
	// Title heads every page. Default "runcue".
	Title string
	// ReadOnly hides the actions and refuses state-changing requests
	// (403).
	ReadOnly bool
	// Format renders a unit's params or result (field "params" or
	// "result") for display; it may redact them. Default: the JSON,
	// indented.
	Format func(w runcue.WorkInfo, field string, raw json.RawMessage) string
	// Heartbeat is how often the live connection proves the server is
	// there; a page says "disconnected" after about two missed beats.
	// Default 2s.
	Heartbeat time.Duration
	// TrustedOrigins are origins (scheme://host[:port]) allowed to send
	// state-changing requests besides the request's own, for a proxy
	// that rewrites Host.
	TrustedOrigins []string
	// MaxScan bounds the units one request of the work list examines
	// (runcue.ListOptions.MaxScan), so that a filter no index serves (a
	// target, an error text, a task) answers in bounded time on any
	// database; a page that stops there offers to search older units.
	// Default 250,000: about 60 ms for an error search on the machine of
	// the README's figures.
	MaxScan int
	// AuthorizeEvents, when set, decides which events a page's live
	// stream may read (see sse.Options.Authorize).
	AuthorizeEvents func(r *http.Request, f *sse.Filter) error
	// FrameAncestors are the sources that may show the dashboard in a
	// frame, in Content-Security-Policy's syntax ("'self'",
	// "https://portal.example.com"). Default none: no page may frame it,
	// so no other site can overlay its buttons (clickjacking gets around
	// the cross-origin check of a POST).
	FrameAncestors []string
}

//go:embed assets
var assets embed.FS

// Handler returns the dashboard of c. It panics if an Options field is
// invalid (a malformed trusted origin).
func Handler(c *runcue.Cue, o Options) http.Handler {
	if o.Title == "" {
		o.Title = "runcue"
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 2 * time.Second
	}
	if o.MaxScan <= 0 {
		o.MaxScan = 250_000
	}
	if o.Format == nil {
		o.Format = formatJSON
	}
	d := &dash{c: c, o: o, pages: parsePages()}
	cop := http.NewCrossOriginProtection()
	for _, origin := range o.TrustedOrigins {
		if err := cop.AddTrustedOrigin(origin); err != nil {
			panic(fmt.Sprintf("dashboard: trusted origin %q: %v", origin, err))
		}
	}
	static, _ := fs.Sub(assets, "assets")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", d.snapshot(d.overview))
	mux.HandleFunc("GET /services", d.snapshot(d.services))
	mux.HandleFunc("GET /work", d.snapshot(d.work))
	mux.HandleFunc("GET /work/{id...}", d.snapshot(d.unit))
	mux.HandleFunc("GET /tail", d.snapshot(d.tail))
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(static)))
	mux.Handle("GET /stream", sse.Handler(c, sse.Options{Authorize: o.AuthorizeEvents, KeepAlive: o.Heartbeat}))
	mux.HandleFunc("GET /pulse", d.pulse)
	actions := http.NewServeMux()
	actions.HandleFunc("POST /actions/service", d.serviceAction)
	actions.HandleFunc("POST /actions/unit", d.unitAction)
	actions.HandleFunc("POST /actions/bulk", d.bulkAction)
	var act http.Handler = actions
	if o.ReadOnly {
		act = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "read-only dashboard", http.StatusForbidden)
		})
	}
	mux.Handle("POST /actions/", cop.Handler(act))
	return secure(mux, o.FrameAncestors)
}

// secure sets the headers every response carries: a Content-Security-
// Policy that lets the pages load only their own scripts, styles and
// streams and be framed only by ancestors (none by default), the legacy
// X-Frame-Options to match, nosniff, and no referrer beyond the origin.
func secure(h http.Handler, ancestors []string) http.Handler {
	frame, xfo := "'none'", "DENY"
	if len(ancestors) > 0 {
		frame, xfo = strings.Join(ancestors, " "), ""
		if len(ancestors) == 1 && ancestors[0] == "'self'" {
			xfo = "SAMEORIGIN"
		}
	}
	csp := "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"form-action 'self'; base-uri 'self'; frame-ancestors " + frame
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", csp)
		if xfo != "" {
			hd.Set("X-Frame-Options", xfo)
		}
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

// dash serves the pages. It holds no state of its own between requests.
type dash struct {
	c     *runcue.Cue
	o     Options
	pages map[string]*template.Template
}

func formatJSON(_ runcue.WorkInfo, _ string, raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// base returns the path the dashboard is mounted under, with a final
// slash: the request's original path less the path the handler sees, both
// as sent (escaped).
func base(r *http.Request) string {
	path := r.URL.EscapedPath()
	orig := path
	if r.RequestURI != "" {
		if p, _, _ := strings.Cut(r.RequestURI, "?"); p != "" && !strings.Contains(p, "://") {
			orig = p
		}
	}
	prefix := strings.TrimSuffix(orig, path)
	if path == "/" {
		prefix = strings.TrimSuffix(orig, "/")
	}
	return prefix + "/"
}

// afterKey keys the request context's event position (snapshot).
type afterKey struct{}

// snapshot reads the last committed event's sequence number before h
// reads what its page shows, and hands it to the page: its live stream
// starts after it, so a change committed while the page was being read,
// or before its stream connected, still reaches it.
func (d *dash) snapshot(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		seq, err := d.c.LastSeq(r.Context())
		if err != nil {
			d.fail(w, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), afterKey{}, seq)))
	}
}

// page is what every page's template sees.
type page struct {
	Title     string
	Base      string
	Nav       string
	ReadOnly  bool
	Heartbeat int // ms
	Stream    string
	After     int64 // the live stream's start (snapshot)
	Data      any
	Flash     string
	Error     string
}

func (d *dash) render(w http.ResponseWriter, r *http.Request, name, stream string, data any) {
	after, _ := r.Context().Value(afterKey{}).(int64)
	p := page{Title: d.o.Title, Base: base(r), Nav: name, ReadOnly: d.o.ReadOnly, After: after,
		Heartbeat: int(d.o.Heartbeat / time.Millisecond), Stream: stream, Data: data}
	if r.URL.Query().Get("partial") != "1" {
		p.Flash = takeFlash(w, r)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	tmpl := d.pages[name]
	block := "page"
	if r.URL.Query().Get("partial") == "1" {
		block = "main" // a live refresh takes the main block alone
	}
	if err := tmpl.ExecuteTemplate(w, block, p); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (d *dash) fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, runcue.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, runcue.ErrInvalid), errors.Is(err, runcue.ErrUnknownService), errors.Is(err, runcue.ErrUnknownTask):
		code = http.StatusBadRequest
	case errors.Is(err, context.Canceled):
		return
	}
	http.Error(w, err.Error(), code)
}

// pulse sends a heartbeat event every Options.Heartbeat: a page that
// misses about two says "disconnected".
func (d *dash) pulse(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	if rc := http.NewResponseController(w); rc != nil {
		_ = rc.SetWriteDeadline(time.Time{})
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	t := time.NewTicker(d.o.Heartbeat)
	defer t.Stop()
	var h health
	fmt.Fprintf(w, "retry: %d\nevent: heartbeat\ndata: %s\n\n", d.o.Heartbeat.Milliseconds(), h.check(r.Context(), d.c, d.o.Heartbeat))
	fl.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
			if _, err := fmt.Fprintf(w, "event: heartbeat\ndata: %s\n\n", h.check(r.Context(), d.c, d.o.Heartbeat)); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// health is what a pulse stream says of the database with each heartbeat,
// for the page's banner: whether it answers, since when it does not, and
// what this process's Cue is doing.
type health struct {
	failing time.Time // when reads began to fail (zero: they answer)
}

// beat is a heartbeat's data.
type beat struct {
	Role      runcue.Role `json:"role"`
	Ok        bool        `json:"ok"`
	Since     time.Time   `json:"since,omitzero"`
	Error     string      `json:"error,omitempty"`
	Heartbeat int64       `json:"heartbeat_ms"`
}

// check reads the database's end (a cheap read, bounded by a heartbeat)
// and the Cue's status, and returns the heartbeat's JSON: not ok while
// the read fails or the Cue's own writes do.
func (h *health) check(ctx context.Context, c *runcue.Cue, hb time.Duration) []byte {
	st := c.Status()
	b := beat{Role: st.Role, Ok: true, Heartbeat: hb.Milliseconds()}
	rctx, cancel := context.WithTimeout(ctx, hb)
	_, err := c.LastSeq(rctx)
	cancel()
	switch {
	case err != nil && ctx.Err() == nil:
		if h.failing.IsZero() {
			h.failing = time.Now()
		}
		b.Ok, b.Since, b.Error = false, h.failing, err.Error()
	case !st.StoreUnavailableSince.IsZero():
		b.Ok, b.Since, b.Error = false, st.StoreUnavailableSince, st.LastError
	case st.Role == runcue.RoleFailed:
		b.Ok, b.Since, b.Error = false, st.Since, st.LastError
	default:
		h.failing = time.Time{}
	}
	out, _ := json.Marshal(b)
	return out
}
