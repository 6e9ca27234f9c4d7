package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/dashboard"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a database with a little of everything, and a dashboard of
// it mounted under /ops/.
type fixture struct {
	c   *runcue.Cue
	srv *httptest.Server
	ids map[string]string
}

func newFixture(t *testing.T, o dashboard.Options) *fixture {
	t.Helper()
	c, err := runcue.Open(filepath.Join(t.TempDir(), "d.db"), runcue.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 4, RateLimit: 60, RateWindow: time.Minute, Adaptive: &runcue.Adaptive{}}))
	fail := errors.New("upstream said 500")
	require.NoError(t, c.Task("fetch", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if strings.HasPrefix(w.Target, "bad") {
				return nil, runcue.Overloaded(fail) // a 503: api's adaptive limits are cut
			}
			return map[string]string{"got": w.Target}, nil
		}}))
	require.NoError(t, c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 10000, Window: time.Minute}}}))
	require.NoError(t, c.Task("chat", runcue.Task{Services: []string{"llm"},
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 1000} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			w.Used(runcue.Costs{"tokens": 640})
			return nil, nil
		}}))
	f := &fixture{c: c, ids: map[string]string{}}
	ctx := context.Background()
	chat, err := c.Submit(ctx, runcue.Submission{Task: "chat"})
	require.NoError(t, err)
	f.ids["chat"] = chat.ID
	for _, target := range []string{"ok-1", "ok-2", "bad-1"} {
		s, err := c.Submit(ctx, runcue.Submission{Task: "fetch", Target: target, Params: map[string]int{"n": len(target)}})
		require.NoError(t, err)
		f.ids[target] = s.ID
	}
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Drain(ctx))
	require.NoError(t, c.Stop(ctx))
	// Queued work behind a dependency, left queued.
	s, err := c.SubmitBatch(ctx, []runcue.Submission{{Task: "fetch", ID: "parent", Target: "later"}, {Task: "fetch", ID: "child", Target: "after-parent", DependsOn: []string{"parent"}}})
	require.NoError(t, err)
	f.ids["parent"], f.ids["child"] = s[0].ID, s[1].ID
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", dashboard.Handler(c, o)))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(f.srv.URL + "/ops/" + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// post sends a form as the dashboard's own page would (same origin).
func (f *fixture) post(t *testing.T, path string, form url.Values, crossSite bool) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/ops/"+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if crossSite {
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.Header.Set("Origin", "https://evil.example")
	} else {
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestPagesRender(t *testing.T) {
	f := newFixture(t, dashboard.Options{Title: "Ops"})
	code, body := f.get(t, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<base href="/ops/">`, "links resolve under the mount point")
	assert.Contains(t, body, `<title>Ops</title>`)
	assert.Contains(t, body, `data-state="completed">3<`) // two fetches and a chat
	assert.Contains(t, body, `data-state="failed">1<`)
	assert.Contains(t, body, `data-state="queued">2<`)
	assert.Contains(t, body, `<svg class="chart"`)
	assert.Contains(t, body, `id="backpressure">none<`, "no bound configured")

	code, body = f.get(t, "services")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-service="api"`)
	assert.Contains(t, body, "per 1m0s")
	assert.Contains(t, body, `data-meter="tokens"`)
	assert.Contains(t, body, "tokens 640/10000 per 1m0s", "the meter as the service log holds it, reconciled")
	assert.Contains(t, body, "effective limit 48/min (configured 60), lowered after 1 503", "api's adaptive limit, as stored")

	code, body = f.get(t, "work?state=failed")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "bad-1")
	assert.NotContains(t, body, "ok-1")
	assert.Contains(t, body, "upstream said 500")

	code, body = f.get(t, "work?target=ok-")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "ok-1")
	assert.Contains(t, body, "ok-2")
	assert.NotContains(t, body, "bad-1")

	code, body = f.get(t, "work/"+f.ids["child"])
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Why isn't it running?")
	assert.Contains(t, body, "waiting_dependencies")
	assert.Contains(t, body, `href="work/parent"`, "its dependency, as a link")
	code, body = f.get(t, "work/parent")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `href="work/child"`, "its dependent, as a link")

	code, body = f.get(t, "work/"+f.ids["ok-1"])
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "&#34;got&#34;: &#34;ok-1&#34;", "the result, formatted")
	assert.Contains(t, body, "completed")
	assert.Regexp(t, `(?s)<td>work_queued</td>.*<td>work_started</td>.*<td>work_completed</td>`, body, "its events, in order")
	code, body = f.get(t, "work/"+f.ids["bad-1"])
	require.Equal(t, http.StatusOK, code, body)
	assert.Regexp(t, `(?s)<td>work_failed</td><td class="num">1</td><td class="err">upstream said 500`, body, "its failure among its events")

	code, _ = f.get(t, "work/no-such-unit")
	assert.Equal(t, http.StatusNotFound, code)

	code, body = f.get(t, "work?partial=1")
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, "<html", "a live refresh takes the main block alone")
	assert.Contains(t, body, "ok-1")

	code, body = f.get(t, "tail")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="tail"`)
	code, _ = f.get(t, "assets/app.js")
	assert.Equal(t, http.StatusOK, code)
}

// TestUnitIDsInLinks: IDs with "/", "?", "#" and "%" (an application's
// "document/page-2") link to their pages, which resolve under the mount
// point; an ID typed with a raw slash reaches its page too.
func TestUnitIDsInLinks(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	odd := "doc/1?x=%2#f"
	_, err := f.c.SubmitBatch(context.Background(), []runcue.Submission{
		{Task: "fetch", ID: odd, Target: "odd", DependsOn: []string{"parent"}},
		{Task: "fetch", ID: "doc/2", Target: "slash"},
	})
	require.NoError(t, err)
	code, body := f.get(t, "work")
	require.Equal(t, http.StatusOK, code, body)
	m := regexp.MustCompile(`<a href="([^"]*)" title="` + regexp.QuoteMeta(html.EscapeString(odd)) + `"`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	assert.Equal(t, "work/doc%2F1%3Fx=%252%23f", html.UnescapeString(m[1]))
	code, body = f.get(t, html.UnescapeString(m[1]))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, html.EscapeString(odd), "its own page")
	assert.Contains(t, body, `<base href="/ops/">`, "links still resolve under the mount point")
	code, body = f.get(t, "work/parent")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `href="work/doc%2F1%3Fx=%252%23f"`, "its dependent's link, escaped")
	code, body = f.get(t, "work/doc/2")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "slash")
}

// TestWorkListBounded: with a scan bound, a search that does not fill its
// page says so and offers to search on; following it finds the rest.
func TestWorkListBounded(t *testing.T) {
	f := newFixture(t, dashboard.Options{MaxScan: 2})
	code, body := f.get(t, "work?target=ok-")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "without filling the page")
	m := regexp.MustCompile(`href="(work\?[^"]*cursor=[^"]*)">search older units`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	seen := strings.Count(body, `class="target">ok-`)
	next := html.UnescapeString(m[1])
	for range 10 {
		code, body = f.get(t, next)
		require.Equal(t, http.StatusOK, code, body)
		seen += strings.Count(body, `class="target">ok-`)
		m = regexp.MustCompile(`href="(work\?[^"]*cursor=[^"]*)">`).FindStringSubmatch(body)
		if m == nil {
			break
		}
		next = html.UnescapeString(m[1])
	}
	assert.Equal(t, 2, seen, "ok-1 and ok-2, across the bounded pages")
}

func TestActions(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	ctx := context.Background()

	resp, body := f.post(t, "actions/service", url.Values{"service": {"api"}, "op": {"pause"}}, true)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a cross-origin POST is refused: %s", body)
	st, err := f.c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.False(t, st.Paused)

	resp, body = f.post(t, "actions/service", url.Values{"service": {"api"}, "op": {"pause"}}, false)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	assert.Equal(t, "/ops/services", resp.Header.Get("Location"))
	st, err = f.c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.True(t, st.Paused)
	// The message rides a cookie to the page it redirects to, once.
	cookies := resp.Cookies()
	require.Len(t, cookies, 1)
	assert.Equal(t, "/ops/", cookies[0].Path)
	assert.True(t, cookies[0].HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, cookies[0].SameSite)
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/ops/services", nil)
	require.NoError(t, err)
	req.AddCookie(cookies[0])
	page, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(page.Body)
	page.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(b), `<div class="flash" role="status">paused api</div>`)
	require.Len(t, page.Cookies(), 1)
	assert.Negative(t, page.Cookies()[0].MaxAge, "shown once, then cleared")

	resp, body = f.post(t, "actions/service", url.Values{"service": {"api"}, "op": {"set"}, "max_concurrent": {"2"}}, false)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	st, err = f.c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 2, st.Limits.MaxConcurrent)
	assert.Equal(t, 60, st.Limits.RateLimit, "fields not given keep their value")
	assert.True(t, st.Overridden)

	// Bulk retry: a dry run first, then the confirmed one.
	resp, body = f.post(t, "actions/bulk", url.Values{"op": {"retry"}, "state": {"failed"}}, false)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "Retry 1 units?")
	w, err := f.c.Get(ctx, f.ids["bad-1"])
	require.NoError(t, err)
	assert.Equal(t, runcue.StateFailed, w.State, "the dry run changed nothing")
	resp, body = f.post(t, "actions/bulk", url.Values{"op": {"retry"}, "state": {"failed"}, "confirm": {"1"}}, false)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	w, err = f.c.Get(ctx, f.ids["bad-1"])
	require.NoError(t, err)
	assert.Equal(t, runcue.StateQueued, w.State)

	resp, body = f.post(t, "actions/unit", url.Values{"op": {"cancel_cascade"}, "id": {"parent"}}, false)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	w, err = f.c.Get(ctx, "child")
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCancelled, w.State, "cancelled with its dependency")
}

func TestReadOnly(t *testing.T) {
	f := newFixture(t, dashboard.Options{ReadOnly: true})
	_, body := f.get(t, "services")
	assert.NotContains(t, body, `action="actions/`, "no action is offered")
	assert.Contains(t, body, "read-only")
	resp, _ := f.post(t, "actions/service", url.Values{"service": {"api"}, "op": {"pause"}}, false)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	st, err := f.c.ServiceStatus(context.Background(), "api")
	require.NoError(t, err)
	assert.False(t, st.Paused)
}

func TestPulse(t *testing.T) {
	f := newFixture(t, dashboard.Options{Heartbeat: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/ops/pulse", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	beats := 0
	for beats < 3 && sc.Scan() {
		if sc.Text() == "event: heartbeat" {
			beats++
		}
	}
	assert.Equal(t, 3, beats)
}

func TestFormatRedacts(t *testing.T) {
	f := newFixture(t, dashboard.Options{Format: func(w runcue.WorkInfo, field string, raw json.RawMessage) string {
		return field + " of " + w.Task + " hidden"
	}})
	_, body := f.get(t, "work/"+f.ids["ok-1"])
	assert.Contains(t, body, "params of fetch hidden")
	assert.Contains(t, body, "result of fetch hidden")
	assert.NotContains(t, body, "&#34;got&#34;")
}

func TestBasicAuth(t *testing.T) {
	h := dashboard.BasicAuth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "in") }), "ops", "s3cret", "runcue")
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, c := range []struct {
		user, pass string
		want       int
	}{{"ops", "s3cret", http.StatusOK}, {"ops", "wrong", http.StatusUnauthorized}, {"", "", http.StatusUnauthorized}, {"other", "s3cret", http.StatusUnauthorized}} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if c.user != "" {
			req.SetBasicAuth(c.user, c.pass)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, c.want, resp.StatusCode, "%s:%s", c.user, c.pass)
		if c.want == http.StatusUnauthorized {
			assert.Equal(t, `Basic realm="runcue", charset="UTF-8"`, resp.Header.Get("WWW-Authenticate"))
		}
	}
}

// Example of mounting the dashboard under a prefix, behind a password.
func ExampleHandler() {
	c, err := runcue.Open(filepath.Join(os.TempDir(), "example-dashboard.db"), runcue.Config{})
	if err != nil {
		return
	}
	defer c.Close()
	mux := http.NewServeMux()
	ops := dashboard.Handler(c, dashboard.Options{Title: "Jobs", ReadOnly: false})
	mux.Handle("/ops/", dashboard.BasicAuth(http.StripPrefix("/ops", ops), "ops", os.Getenv("OPS_PASSWORD"), "jobs"))
	_ = &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
	// srv.ListenAndServe()
}

// Every response forbids framing (no other site may overlay the buttons:
// clickjacking gets around the cross-origin check of a POST), sniffing
// and scripts or styles from elsewhere; a message cannot be forged from a
// link.
func TestSecurityHeaders(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	for _, path := range []string{"", "services", "work", "work/" + url.PathEscape(f.ids["ok-1"]), "tail", "assets/app.js", "nowhere"} {
		resp, err := http.Get(f.srv.URL + "/ops/" + path)
		require.NoError(t, err)
		resp.Body.Close()
		h := resp.Header
		assert.Equal(t, "DENY", h.Get("X-Frame-Options"), path)
		assert.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), path)
		csp := h.Get("Content-Security-Policy")
		for _, d := range []string{"frame-ancestors 'none'", "script-src 'self'", "style-src 'self'", "default-src 'none'", "form-action 'self'"} {
			assert.Contains(t, csp, d, path)
		}
	}
	code, body := f.get(t, "services?flash="+url.QueryEscape("Your session expired: call +1 555 0100"))
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, "session expired", "a flash in the URL is not shown")
	assert.NotContains(t, body, `style="`, "no inline style for the policy to refuse")
	assert.Contains(t, body, `<meter min="0" max="3" value="0">`)

	framed := newFixture(t, dashboard.Options{FrameAncestors: []string{"'self'"}})
	resp, err := http.Get(framed.srv.URL + "/ops/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "SAMEORIGIN", resp.Header.Get("X-Frame-Options"))
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'self'")
	portal := newFixture(t, dashboard.Options{FrameAncestors: []string{"https://portal.example.com"}})
	resp, err = http.Get(portal.srv.URL + "/ops/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Empty(t, resp.Header.Get("X-Frame-Options"), "X-Frame-Options cannot name another origin; the policy does")
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors https://portal.example.com")
}

// TestPulseSaysOutage: each heartbeat says whether the database answers,
// for the page's banner: not while its reads fail (since when, and why),
// again once they answer.
func TestPulseSaysOutage(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "d.db"), sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	fs := &testutil.FaultStore{Store: st}
	c, err := runcue.New(fs, runcue.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	srv := httptest.NewServer(dashboard.Handler(c, dashboard.Options{Heartbeat: 20 * time.Millisecond}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/pulse", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	next := func() map[string]any {
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var b map[string]any
				require.NoError(t, json.Unmarshal([]byte(data), &b), data)
				return b
			}
		}
		t.Fatal("the pulse ended")
		return nil
	}
	assert.Equal(t, true, next()["ok"])
	fs.DownReads(errors.New("connection refused (injected)"))
	var b map[string]any
	for b = next(); b["ok"] == true; b = next() {
	}
	assert.Contains(t, b["error"], "connection refused")
	assert.NotEmpty(t, b["since"])
	fs.Up()
	for b = next(); b["ok"] == false; b = next() {
	}
	assert.Equal(t, "client", b["role"])
}

// TestSchedulesShown: the overview lists the schedules with their timing
// and next period; a unit a schedule submitted names it and its period.
func TestSchedulesShown(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	ctx := t.Context()
	require.NoError(t, f.c.Schedule(ctx, "nightly", runcue.Schedule{Submission: runcue.Submission{Task: "fetch", Target: "ok-9"},
		Timing: runcue.Timing{Cron: "30 2 * * *", Zone: "Europe/Berlin"}}))
	require.NoError(t, f.c.PauseSchedule(ctx, "nightly"))
	code, body := f.get(t, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="schedules"`)
	assert.Contains(t, body, "30 2 * * * Europe/Berlin")
	assert.Contains(t, body, "nightly <span class=\"bad\">paused</span>")
	assert.Regexp(t, `T02:30 Europe/Berlin</td>`, body, "the next period")
}

// TestServiceBarsAgainstLimitsInForce: a service's bars are drawn against
// the limits in force, which an adaptive service lowered (the fixture's
// api: 3 at once of 4, 48 a minute of 60), as the text beneath says; a
// service without a breaker shows its circuit as off, not as a closed
// circuit with 0 failures.
func TestServiceBarsAgainstLimitsInForce(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	code, body := f.get(t, "services")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `<td class="inflight"><meter min="0" max="3" value="0"></meter> 0/3</td>`)
	assert.Contains(t, body, `<meter min="0" max="48" value="3"></meter> 3/48 per 1m0s`)
	assert.Contains(t, body, `room for 45 more`)
	assert.Contains(t, body, `effective limit 3 at once (configured 4)`)
	assert.Contains(t, body, `<td class="circuit-off">off</td>`)
	assert.NotContains(t, body, `max="4"`, "no bar against the configured cap")
}

// TestUnitCostAndUsage: the unit page shows the unit's cost (its
// estimate) and what each run reported using.
func TestUnitCostAndUsage(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	code, body := f.get(t, "work/"+f.ids["chat"])
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `<td id="cost">tokens 1000 <span class="muted">estimated at submit, charged at each start</span></td>`)
	assert.Contains(t, body, `<td class="used">tokens 640</td>`)
	_, body = f.get(t, "work/"+f.ids["ok-1"])
	assert.Contains(t, body, `<td id="cost">requests 1`)
	assert.Contains(t, body, `<td class="used">—</td>`)
}

// TestQueueWaitAsBuckets: the overview shows the queue-wait percentiles
// as the histogram buckets they fell in, not as exact durations.
func TestQueueWaitAsBuckets(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	code, body := f.get(t, "")
	require.Equal(t, http.StatusOK, code)
	m := regexp.MustCompile(`<span id="queue-wait">p50 ([^<]*) · p95 ([^<]*) · p99 ([^<]*)</span>`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	for _, p := range m[1:] {
		assert.Regexp(t, `^(under \S+|\S+-\S+|over \S+)$`, p)
	}
	assert.Contains(t, body, "percentiles within their histogram buckets")
}

// TestUnitDebounced: a debounced unit's page says which key it holds and
// that a later submission replaces it.
func TestUnitDebounced(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	require.NoError(t, f.c.Task("index", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil },
		Debounce: &runcue.Debounce{Period: time.Hour}}))
	idx, err := f.c.Submit(t.Context(), runcue.Submission{Task: "index", Target: "doc-1"})
	require.NoError(t, err)
	code, body := f.get(t, "work/"+idx.ID)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `<td id="debounce">key <b>doc-1</b>, burst since`)
	assert.Contains(t, body, "unless a later submission of the key replaces it")
	_, body = f.get(t, "")
	assert.Contains(t, body, `<span id="debouncing">1</span> key settling`, "the overview counts it")
}

// TestOverviewBatches: the overview counts the batches run, their units,
// and a batch waiting for more units.
func TestOverviewBatches(t *testing.T) {
	f := newFixture(t, dashboard.Options{})
	ctx := t.Context()
	require.NoError(t, f.c.Task("bulk", runcue.Task{Batch: &runcue.Batch{Max: 2, Wait: time.Hour,
		Handler: func(ctx context.Context, ws []*runcue.Work) ([]runcue.Outcome, error) {
			return make([]runcue.Outcome, len(ws)), nil
		}}}))
	_, err := f.c.SubmitBatch(ctx, []runcue.Submission{{Task: "bulk"}, {Task: "bulk"}, {Task: "bulk"}})
	require.NoError(t, err)
	require.NoError(t, f.c.Start(ctx))
	defer f.c.Stop(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := f.get(t, "")
		if strings.Contains(body, `<span id="batches">`) {
			assert.Contains(t, body, `<span id="batches">1</span> run with <span id="batched">2</span> units, 1 waiting for more units`)
			return
		}
		require.True(t, time.Now().Before(deadline), "no batches on the overview")
		time.Sleep(10 * time.Millisecond)
	}
}
