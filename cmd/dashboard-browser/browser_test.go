package browsertest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/dashboard"
)

var screenshots = flag.String("screenshots", "", "write a PNG of every page to this directory")

// TestMain runs the tests, or, without a browser and outside CI, none:
// then go test says "[no tests to run]" on the package's ok line, which it
// shows without -v (a package whose every test skipped says only "ok"),
// and the reason goes to stderr (shown with -v).
func TestMain(m *testing.M) {
	flag.Parse()
	if findChromium() == "" && os.Getenv("CI") != "true" {
		fmt.Fprintln(os.Stderr, "SKIP: no Chromium on PATH (chromium, chromium-browser, google-chrome): the dashboard's browser tests did not run; apt-get install chromium")
		_ = flag.Set("test.run", "^$")
	}
	goleak.VerifyTestMain(m)
}

// findChromium returns the path of a Chromium on PATH, or "".
func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// deadline bounds every wait on the browser: generous, a guard against a
// hang, never a measurement.
const deadline = 60 * time.Second

// chromium returns the browser's path; without one the test skips with a
// message, or fails when CI=true.
func chromium(t *testing.T) string {
	t.Helper()
	if p := findChromium(); p != "" {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and no Chromium on PATH (chromium, chromium-browser, google-chrome): .ci/run installs the Debian package chromium")
	}
	t.Skip("SKIP: no Chromium on PATH (chromium, chromium-browser, google-chrome): the dashboard's browser tests did not run; apt-get install chromium")
	return ""
}

// browser starts a headless Chromium for the test and returns a tab's
// context. Confirmation dialogs are accepted.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1200, 900))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx), "start Chromium")
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			go func() {
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
			}()
		}
	}))
	return ctx
}

// site is a Cue and its dashboard, served on loopback under /ops/.
type site struct {
	c    *runcue.Cue
	srv  *httptest.Server
	url  string // the dashboard's root, with a final slash
	gate chan struct{}
	// frozen, while set, holds every response write: a server that hangs
	// without closing its connections.
	mu     sync.Mutex
	frozen chan struct{}
	// streams, while set, holds every event stream request before it
	// reaches the dashboard: a stream that connects late.
	streams chan struct{}
}

func newSite(t *testing.T, o dashboard.Options) *site {
	t.Helper()
	c, err := runcue.Open(filepath.Join(t.TempDir(), "d.db"), runcue.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s := &site{c: c, gate: make(chan struct{})}
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 4}))
	require.NoError(t, c.Task("work", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			switch {
			case strings.HasPrefix(w.Target, "hold"):
				select {
				case <-s.gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			case strings.HasPrefix(w.Target, "bad"):
				return nil, runcue.Permanent(errors.New("upstream said 500"))
			}
			return map[string]string{"did": w.Target}, nil
		}}))
	ctx := context.Background()
	require.NoError(t, c.Start(ctx))
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", dashboard.Handler(c, o)))
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stream") {
			s.mu.Lock()
			held := s.streams
			s.mu.Unlock()
			if held != nil {
				select {
				case <-held:
				case <-r.Context().Done():
					return
				}
			}
		}
		mux.ServeHTTP(&freezable{ResponseWriter: w, s: s}, r)
	}))
	base, cancel := context.WithCancel(context.Background())
	s.srv.Config.BaseContext = func(_ net.Listener) context.Context { return base }
	s.srv.Start()
	s.url = s.srv.URL + "/ops/"
	t.Cleanup(func() {
		s.thaw()
		cancel() // ends the streams, so that Close does not wait for them
		s.srv.Close()
		stop, done := context.WithTimeout(context.Background(), deadline)
		defer done()
		select {
		case <-s.gate:
		default:
			close(s.gate)
		}
		assert.NoError(t, c.Stop(stop))
		assert.NoError(t, c.Close())
	})
	return s
}

// freeze holds every response write until thaw: the page's streams stay
// open but fall silent, as when the server hangs.
func (s *site) freeze() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frozen == nil {
		s.frozen = make(chan struct{})
	}
}

func (s *site) thaw() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frozen != nil {
		close(s.frozen)
		s.frozen = nil
	}
}

func (s *site) hold(ctx context.Context) {
	s.mu.Lock()
	f := s.frozen
	s.mu.Unlock()
	if f != nil {
		select {
		case <-f:
		case <-ctx.Done():
		}
	}
}

// freezable is a ResponseWriter whose writes wait while the site is frozen.
type freezable struct {
	http.ResponseWriter
	s *site
}

func (f *freezable) Write(b []byte) (int, error) {
	f.s.hold(context.Background())
	return f.ResponseWriter.Write(b)
}

func (f *freezable) Flush() {
	f.s.hold(context.Background())
	if fl, ok := f.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

func (f *freezable) Unwrap() http.ResponseWriter { return f.ResponseWriter }

func (s *site) submit(t *testing.T, targets ...string) []string {
	t.Helper()
	var subs []runcue.Submission
	for _, target := range targets {
		subs = append(subs, runcue.Submission{Task: "work", Target: target})
	}
	out, err := s.c.SubmitBatch(context.Background(), subs)
	require.NoError(t, err)
	ids := make([]string, len(out))
	for i, o := range out {
		ids[i] = o.ID
	}
	return ids
}

// poll waits, in the page, until the JavaScript expression is true.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Poll[any](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(deadline))(ctx, t)
		return chromedp.Void{}, err
	}
}

// live waits until the page's connection indicator says "live".
var live = poll(`document.getElementById("conn").dataset.state === "live"`)

// batches reads the page's count of live refreshes.
func batches(ctx context.Context, t *testing.T) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`parseInt(document.body.dataset.batches || "0", 10)`))
	require.NoError(t, err)
	return n
}

// shot writes a screenshot of the page to -screenshots, if given.
func shot(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if *screenshots == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(*screenshots, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(*screenshots, name+".png"), png, 0o644))
}

func text(ctx context.Context, t *testing.T, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err)
	return strings.TrimSpace(s)
}

// TestPagesRender: every page renders in the browser with the database's
// counts, and a screenshot of each is kept with -screenshots.
func TestPagesRender(t *testing.T) {
	s := newSite(t, dashboard.Options{Title: "browser test"})
	ctx := browser(t)
	s.submit(t, "ok-1", "ok-2", "ok-3", "ok-4", "ok-5", "bad-1")
	require.NoError(t, s.c.Drain(ctx))
	require.NoError(t, s.c.PauseTask(ctx, "work"))
	queued := s.submit(t, "later-1", "later-2")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url), live))
	assert.Equal(t, "5", text(ctx, t, `[data-state="completed"]`))
	assert.Equal(t, "1", text(ctx, t, `[data-state="failed"]`))
	assert.Equal(t, "2", text(ctx, t, `[data-state="queued"]`))
	shot(ctx, t, "overview")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url+"services"), live))
	assert.Contains(t, text(ctx, t, `tr[data-service="api"]`), "0/4")
	shot(ctx, t, "services")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url+"work?state=failed"), live))
	assert.Contains(t, text(ctx, t, `table.work tbody`), "upstream said 500")
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("table.work tbody tr[data-id]").length`))
	require.NoError(t, err)
	assert.Equal(t, 1, rows, "the failed unit alone")
	shot(ctx, t, "work-failed")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url+"work/"+queued[0]), live))
	assert.Contains(t, text(ctx, t, `ul.why`), "task_paused")
	assert.Contains(t, text(ctx, t, `table.events`), "work_queued")
	shot(ctx, t, "unit-queued")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url+"tail"), live))
	require.NoError(t, s.c.ResumeTask(ctx, "work"))
	require.NoError(t, chromedp.Do(ctx, poll(`document.querySelectorAll("#tail tr.ev-work_completed").length >= 2`)))
	shot(ctx, t, "tail")
}

// TestStateChangeReachesPage: a unit's page follows it from running to
// completed without a reload.
func TestStateChangeReachesPage(t *testing.T) {
	s := newSite(t, dashboard.Options{})
	ctx := browser(t)
	id := s.submit(t, "hold-1")[0]
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url+"work/"+id), live,
		poll(`document.querySelector("h1 .pill").textContent === "running"`)))
	close(s.gate)
	require.NoError(t, chromedp.Do(ctx, poll(`document.querySelector("h1 .pill").textContent === "completed"`)))
	assert.Contains(t, text(ctx, t, `table.events`), "work_completed")
	assert.Positive(t, batches(ctx, t), "by a live refresh, not a reload")
	shot(ctx, t, "unit-completed")
}

// TestChangeBeforeStreamConnects: a change committed after the page was
// read but before its live stream connected still reaches the page (the
// stream starts at the page's event position, not at "now").
func TestChangeBeforeStreamConnects(t *testing.T) {
	s := newSite(t, dashboard.Options{})
	ctx := browser(t)
	require.NoError(t, s.c.PauseQueue(ctx))
	id := s.submit(t, "ok-late")[0]
	s.mu.Lock()
	s.streams = make(chan struct{})
	s.mu.Unlock()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url+"work/"+id), live))
	assert.Equal(t, "queued", text(ctx, t, "h1 .pill"))
	require.NoError(t, s.c.ResumeQueue(ctx))
	_, err := s.c.Wait(ctx, id)
	require.NoError(t, err)
	s.mu.Lock()
	close(s.streams)
	s.streams = nil
	s.mu.Unlock()
	require.NoError(t, chromedp.Do(ctx, poll(`document.querySelector("h1 .pill").textContent === "completed"`)))
}

// TestCoalescing: under a stream of events the page refreshes at most
// about once a second: at most 12 batches in 10 s.
func TestCoalescing(t *testing.T) {
	s := newSite(t, dashboard.Options{})
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url), live))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			targets := make([]string, 20)
			for j := range targets {
				targets[j] = fmt.Sprintf("u-%d-%d", i, j)
			}
			if _, err := s.c.SubmitBatch(context.Background(), func() []runcue.Submission {
				subs := make([]runcue.Submission, len(targets))
				for j, tg := range targets {
					subs[j] = runcue.Submission{Task: "work", Target: tg}
				}
				return subs
			}()); err != nil {
				return
			}
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	// The window is wall-clock time: what is counted is how often the page
	// refreshes while the events stream in, not how fast anything is.
	require.NoError(t, chromedp.Do(ctx, poll(`parseInt(document.body.dataset.batches, 10) >= 1`)))
	before := batches(ctx, t)
	events0, err := s.c.Stats(ctx)
	require.NoError(t, err)
	time.Sleep(10 * time.Second)
	n := batches(ctx, t) - before
	events1, err := s.c.Stats(ctx)
	require.NoError(t, err)
	done := events1.States[runcue.StateCompleted] - events0.States[runcue.StateCompleted]
	t.Logf("%d units completed (about %d events) in the window; the page refreshed %d times", done, 3*done, n)
	assert.LessOrEqual(t, n, 12, "at most about one refresh a second")
	assert.Positive(t, n, "it refreshed under the stream")
	assert.Greater(t, done, 100, "the stream was a stream")
}

// TestPauseFromPage: the pause button (after its confirmation) pauses the
// service, and its units stop being dispatched.
func TestPauseFromPage(t *testing.T) {
	s := newSite(t, dashboard.Options{})
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url+"services"), live,
		chromedp.Click(chromedp.CSS(`tr[data-service="api"] button[value="pause"]`)),
		chromedp.WaitVisible(chromedp.CSS(`div.flash`))))
	assert.Contains(t, text(ctx, t, `div.flash`), "paused api")
	assert.Contains(t, text(ctx, t, `tr[data-service="api"]`), "paused")
	st, err := s.c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.True(t, st.Paused)
	shot(ctx, t, "services-paused")

	id := s.submit(t, "ok-after-pause")[0]
	ex, err := s.c.Explain(ctx, id)
	require.NoError(t, err)
	require.NotEmpty(t, ex.Reasons)
	assert.Equal(t, runcue.ReasonPaused, ex.Reasons[0].Kind, "held by the pause: %+v", ex.Reasons)
	wi, err := s.c.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateQueued, wi.State)

	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-service="api"] button[value="resume"]`)),
		chromedp.WaitVisible(chromedp.CSS(`div.flash`))))
	wi, err = s.c.Wait(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State, "resumed from the page")
}

// TestCrossOriginPostRefused: a page of another origin that posts the pause
// form to the dashboard is refused, and nothing changes.
func TestCrossOriginPostRefused(t *testing.T) {
	s := newSite(t, dashboard.Options{})
	ctx := browser(t)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%sactions/service"><input name="service" value="api"><input name="op" value="pause"></form>
<script>document.getElementById("f").submit()</script>`, s.url)
	}))
	defer evil.Close()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(evil.URL),
		poll(`location.href.indexOf("/actions/service") >= 0 && document.readyState === "complete"`)))
	body := text(ctx, t, "body")
	assert.Contains(t, strings.ToLower(body), "cross-origin", "refused by CrossOriginProtection")
	st, err := s.c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.False(t, st.Paused, "nothing changed")
}

// TestReadOnly: a read-only dashboard shows no actions and refuses a POST
// even from its own page.
func TestReadOnly(t *testing.T) {
	s := newSite(t, dashboard.Options{ReadOnly: true})
	ctx := browser(t)
	s.submit(t, "bad-1")
	require.NoError(t, s.c.Drain(ctx))
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url+"services"), live))
	forms, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("form[method=post]").length`))
	require.NoError(t, err)
	assert.Zero(t, forms, "no action is offered")
	assert.Equal(t, "read-only", text(ctx, t, `header .badge`))
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](
		`fetch("actions/service", {method: "POST", body: new URLSearchParams({service: "api", op: "pause"})}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, status)
	st, err := s.c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.False(t, st.Paused)
	shot(ctx, t, "services-read-only")
}

// TestDisconnected: the page says "disconnected" when the server hangs
// (its heartbeats stop, the connection stays open), says "live" again when
// it recovers, and "disconnected" when it is gone.
func TestDisconnected(t *testing.T) {
	s := newSite(t, dashboard.Options{Heartbeat: 500 * time.Millisecond})
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.url), live))
	s.freeze()
	require.NoError(t, chromedp.Do(ctx, poll(`document.getElementById("conn").dataset.state === "disconnected"`)))
	shot(ctx, t, "disconnected")
	s.thaw()
	require.NoError(t, chromedp.Do(ctx, live), "the heartbeats resume")
	s.srv.CloseClientConnections()
	s.srv.Listener.Close()
	require.NoError(t, chromedp.Do(ctx, poll(`document.getElementById("conn").dataset.state === "disconnected"`)))
	assert.Equal(t, "disconnected", text(ctx, t, "#conn"))
}
