package dashboard

import (
	"embed"
	"fmt"
	"html/template"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue"
)

//go:embed templates
var templates embed.FS

var funcs = template.FuncMap{
	"list": func(xs ...string) []string { return xs },
	"sub":  func(a, b int) int { return a - b },
	"pct":  func(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) },
	// unit is the link to a unit's page: its ID escaped as one path
	// segment (IDs may hold "/", "?", "#" or "%").
	"unit": func(id string) template.URL { return template.URL("work/" + url.PathEscape(id)) },
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return humanDuration(time.Since(t)) + " ago"
	},
	"until": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		d := time.Until(t)
		if d <= 0 {
			return "now"
		}
		return "in " + humanDuration(d)
	},
	"dur": humanDuration,
	"stamp": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.Local().Format("2006-01-02 15:04:05.000")
	},
	"short": shortID,
	"query": func(kv ...string) template.URL {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				v.Set(kv[i], kv[i+1])
			}
		}
		return template.URL(v.Encode())
	},
}

// shortID abbreviates a unit ID for a link's text: "01M8…E2KW2M", and for
// a path-like ID its last part whole, "01M8…E2KW2M/analyze".
func shortID(id string) string {
	if i := strings.LastIndexByte(id, '/'); i > 0 && len(id)-i <= 24 {
		return shortID(id[:i]) + id[i:]
	}
	if len(id) > 12 {
		return id[:4] + "…" + id[len(id)-6:]
	}
	return id
}

// humanDuration writes d the way an operator reads it: 3.2s, 4m10s, 2h5m.
func humanDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

func parsePages() map[string]*template.Template {
	out := map[string]*template.Template{}
	for _, name := range []string{"overview", "services", "work", "unit", "tail", "confirm"} {
		out[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templates, "templates/layout.html", "templates/"+name+".html"))
	}
	return out
}

// overviewData is the overview page.
type overviewData struct {
	Stats   runcue.Stats
	States  []stateCount
	Tasks   []taskRow
	Chart   template.HTML
	Oldest  time.Time
	Running int
	Queued  int
}

type stateCount struct {
	State runcue.State
	N     int
}

type taskRow struct {
	Task   string
	Counts []int // in the order of states
}

var allStates = []runcue.State{runcue.StateQueued, runcue.StateRunning, runcue.StateCompleted, runcue.StateSkipped, runcue.StateFailed, runcue.StateCancelled}

func (d *dash) overview(w http.ResponseWriter, r *http.Request) {
	st, err := d.c.Stats(r.Context())
	if err != nil {
		d.fail(w, err)
		return
	}
	data := overviewData{Stats: st, Oldest: st.OldestQueued, Running: st.States[runcue.StateRunning], Queued: st.States[runcue.StateQueued]}
	for _, s := range allStates {
		data.States = append(data.States, stateCount{s, st.States[s]})
	}
	for _, task := range slices.Sorted(maps.Keys(st.Tasks)) {
		row := taskRow{Task: task}
		for _, s := range allStates {
			row.Counts = append(row.Counts, st.Tasks[task][s])
		}
		data.Tasks = append(data.Tasks, row)
	}
	data.Chart = minuteChart(st.Minutes)
	d.render(w, r, "overview", "", data)
}

// minuteChart draws completions and failures per minute over the last
// hour as inline SVG.
func minuteChart(ms []runcue.MinuteStats) template.HTML {
	const w, h, pad = 720.0, 160.0, 30.0
	top := 1
	for _, m := range ms {
		top = max(top, m.Completed, m.Failed)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="completions and failures per minute">`, w, h+18)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" class="axis"/>`, pad, h, w, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="12" class="tick" text-anchor="end">%d</text><text x="%.0f" y="%.0f" class="tick" text-anchor="end">0</text>`, pad-4, top, pad-4, h)
	n := max(len(ms), 1)
	slot := (w - pad) / float64(n)
	for i, m := range ms {
		x := pad + slot*float64(i)
		for k, v := range []int{m.Completed, m.Failed} {
			bh := (h - 16) * float64(v) / float64(top)
			cls := []string{"bar-ok", "bar-fail"}[k]
			fmt.Fprintf(&b, `<rect class="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d completed, %d failed</title></rect>`,
				cls, x+slot*0.1+slot*0.4*float64(k), h-bh, math.Max(slot*0.4, 0.5), bh, m.Minute.Local().Format("15:04"), m.Completed, m.Failed)
		}
	}
	if len(ms) > 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" class="tick">%s</text><text x="%.0f" y="%.0f" class="tick" text-anchor="end">%s</text>`,
			pad, h+14, ms[0].Minute.Local().Format("15:04"), w, h+14, ms[len(ms)-1].Minute.Local().Format("15:04"))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func (d *dash) services(w http.ResponseWriter, r *http.Request) {
	st, err := d.c.Stats(r.Context())
	if err != nil {
		d.fail(w, err)
		return
	}
	d.render(w, r, "services", "service_status,service_changed,work_started,work_completed,work_failed", st.Services)
}

// workData is the work list.
type workData struct {
	Filter   workFilter
	Units    []runcue.WorkInfo
	Next     string
	Partial  bool
	Scan     int
	States   []runcue.State
	Tasks    []string
	NotFound string
}

// workFilter is the work list's query string.
type workFilter struct {
	State, Task, Target, Error, Since, Cursor string
}

// since values, and how far back each reaches.
var sinceOptions = map[string]time.Duration{"15m": 15 * time.Minute, "1h": time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

func (f workFilter) options(now time.Time, maxScan int) (runcue.ListOptions, error) {
	o := runcue.ListOptions{Newest: true, Limit: 50, Cursor: f.Cursor, TargetPrefix: f.Target, ErrorContains: f.Error, MaxScan: maxScan}
	if f.State != "" {
		if !slices.Contains(allStates, runcue.State(f.State)) {
			return o, fmt.Errorf("%w: state %q", runcue.ErrInvalid, f.State)
		}
		o.States = []runcue.State{runcue.State(f.State)}
	}
	if f.Task != "" {
		o.Tasks = []string{f.Task}
	}
	if f.Since != "" {
		d, ok := sinceOptions[f.Since]
		if !ok {
			return o, fmt.Errorf("%w: since %q", runcue.ErrInvalid, f.Since)
		}
		o.SubmittedAfter = now.Add(-d)
	}
	return o, nil
}

// filterOf reads the filter from the query string, or a form's fields.
func filterOf(r *http.Request) workFilter {
	return workFilter{State: r.FormValue("state"), Task: r.FormValue("task"), Target: r.FormValue("target"),
		Error: r.FormValue("error"), Since: r.FormValue("since"), Cursor: r.FormValue("cursor")}
}

// values is the filter as a query string's values, without the cursor.
func (f workFilter) values() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"state": f.State, "task": f.Task, "target": f.Target, "error": f.Error, "since": f.Since} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

func (d *dash) work(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if id := strings.TrimSpace(r.URL.Query().Get("id")); id != "" {
		// A unit ID: straight to its page.
		if _, err := d.c.Get(ctx, id); err == nil {
			http.Redirect(w, r, base(r)+"work/"+url.PathEscape(id), http.StatusSeeOther)
			return
		}
	}
	f := filterOf(r)
	o, err := f.options(time.Now(), d.o.MaxScan)
	if err != nil {
		d.fail(w, err)
		return
	}
	page, err := d.c.List(ctx, o)
	if err != nil {
		d.fail(w, err)
		return
	}
	st, err := d.c.Stats(ctx)
	if err != nil {
		d.fail(w, err)
		return
	}
	data := workData{Filter: f, Units: page.Units, Next: page.Next, Partial: page.Partial, Scan: d.o.MaxScan, States: allStates, Tasks: slices.Sorted(maps.Keys(st.Tasks)),
		NotFound: r.URL.Query().Get("id")}
	d.render(w, r, "work", "work_queued,work_started,work_completed,work_failed,work_skipped,work_cancelled,work_retrying", data)
}

// unitData is a unit's page.
type unitData struct {
	W          runcue.WorkInfo
	Params     string
	Result     string
	Why        *runcue.Explanation
	Dependents []string
	Terminal   bool
	// Events are the unit's retained events, a page of them from ?after=;
	// MoreEvents is the Seq to read on after, 0 when there are no more.
	Events     []runcue.Event
	MoreEvents int64
}

// unitEventsPage is how many of a unit's events its page shows at once.
const unitEventsPage = 200

func (d *dash) unit(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	info, err := d.c.Get(ctx, id)
	if err != nil {
		d.fail(w, err)
		return
	}
	data := unitData{W: info, Params: d.o.Format(info, "params", info.Params), Result: d.o.Format(info, "result", info.Result)}
	switch info.State {
	case runcue.StateQueued:
		if ex, err := d.c.Explain(ctx, id); err == nil {
			data.Why = &ex
		}
	case runcue.StateCompleted, runcue.StateFailed, runcue.StateSkipped, runcue.StateCancelled:
		data.Terminal = true
	}
	if deps, err := d.c.Dependents(ctx, id); err == nil {
		data.Dependents = deps
	}
	after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
	evs, err := d.c.WorkEvents(ctx, id, max(after, 0), unitEventsPage+1)
	if err != nil {
		d.fail(w, err)
		return
	}
	if len(evs) > unitEventsPage {
		evs = evs[:unitEventsPage]
		data.MoreEvents = evs[len(evs)-1].Seq
	}
	data.Events = evs
	d.render(w, r, "unit", "work_queued,work_started,work_completed,work_failed,work_skipped,work_cancelled,work_retrying", data)
}

func (d *dash) tail(w http.ResponseWriter, r *http.Request) {
	st, err := d.c.Stats(r.Context())
	if err != nil {
		d.fail(w, err)
		return
	}
	d.render(w, r, "tail", "", slices.Sorted(maps.Keys(st.Tasks)))
}
