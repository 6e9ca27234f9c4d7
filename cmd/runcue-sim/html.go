package main

import (
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"os"
	"strings"
	"time"
)

// writeHTML writes the report as one self-contained HTML file: inline SVG
// charts (queue depth, each service's use against its limit, the latency
// distributions, the circuits over time), the verdicts and the metrics.
// It loads nothing from anywhere.
func writeHTML(path string, r *Report) error {
	var b strings.Builder
	if err := htmlPage.Execute(&b, htmlData(r)); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

type chartSeries struct {
	name   string
	color  string
	values []float64
	dashed bool
}

const (
	chartW, chartH = 760.0, 200.0
	padL, padB     = 50.0, 24.0
)

// lineChart draws series sampled evenly over [0, end].
func lineChart(title string, end time.Duration, series ...chartSeries) template.HTML {
	ymax := 1.0
	for _, s := range series {
		for _, v := range s.values {
			ymax = math.Max(ymax, v)
		}
	}
	ymax = niceCeil(ymax * 1.05)
	var b strings.Builder
	fmt.Fprintf(&b, `<figure><figcaption>%s</figcaption><svg viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img">`,
		template.HTMLEscapeString(title), chartW, chartH+padB, chartW, chartH+padB)
	axes(&b, ymax, end)
	for _, s := range series {
		if len(s.values) == 0 {
			continue
		}
		var pts []string
		for i, v := range s.values {
			x := padL + (chartW-padL-10)*float64(i)/math.Max(1, float64(len(s.values)-1))
			y := chartH - (chartH-10)*v/ymax
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		}
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.6"%s points="%s"/>`, s.color, dash, strings.Join(pts, " "))
	}
	legend(&b, series)
	b.WriteString(`</svg></figure>`)
	return template.HTML(b.String())
}

func axes(b *strings.Builder, ymax float64, end time.Duration) {
	fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, padL, chartH, chartW-10, chartH)
	fmt.Fprintf(b, `<line x1="%.0f" y1="10" x2="%.0f" y2="%.0f" stroke="#888"/>`, padL, padL, chartH)
	for i := 0; i <= 4; i++ {
		v := ymax * float64(i) / 4
		y := chartH - (chartH-10)*float64(i)/4
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" font-size="10" text-anchor="end">%s</text>`, padL-4, y+3, trimFloat(v))
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`, padL, y, chartW-10, y)
	}
	for i := 0; i <= 6; i++ {
		x := padL + (chartW-padL-10)*float64(i)/6
		t := time.Duration(float64(end) * float64(i) / 6).Round(time.Second)
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" font-size="10" text-anchor="middle">%v</text>`, x, chartH+16, t)
	}
}

func legend(b *strings.Builder, series []chartSeries) {
	x := padL + 10
	for _, s := range series {
		fmt.Fprintf(b, `<rect x="%.0f" y="12" width="10" height="10" fill="%s"/><text x="%.0f" y="21" font-size="11">%s</text>`,
			x, s.color, x+14, template.HTMLEscapeString(s.name))
		x += 24 + 7*float64(len(s.name))
	}
}

// barChart draws a histogram of latency buckets (upper bounds in ms, the
// last bar counts the rest).
func barChart(title string, buckets []float64, series ...struct {
	name, color string
	counts      []int
}) template.HTML {
	ymax := 1.0
	for _, s := range series {
		for _, c := range s.counts {
			ymax = math.Max(ymax, float64(c))
		}
	}
	ymax = niceCeil(ymax * 1.05)
	n := len(buckets) + 1
	var b strings.Builder
	fmt.Fprintf(&b, `<figure><figcaption>%s</figcaption><svg viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img">`,
		template.HTMLEscapeString(title), chartW, chartH+padB, chartW, chartH+padB)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, padL, chartH, chartW-10, chartH)
	for i := 0; i <= 4; i++ {
		y := chartH - (chartH-10)*float64(i)/4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" font-size="10" text-anchor="end">%s</text>`, padL-4, y+3, trimFloat(ymax*float64(i)/4))
	}
	slot := (chartW - padL - 10) / float64(n)
	bw := slot * 0.8 / float64(max(1, len(series)))
	for i := range n {
		label := "more"
		if i < len(buckets) {
			label = "≤" + trimFloat(buckets[i])
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="10" text-anchor="middle">%s</text>`, padL+slot*(float64(i)+0.5), chartH+16, label)
		for k, s := range series {
			if i >= len(s.counts) {
				continue
			}
			h := (chartH - 10) * float64(s.counts[i]) / ymax
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s ms: %d</title></rect>`,
				padL+slot*float64(i)+slot*0.1+bw*float64(k), chartH-h, bw, h, s.color, s.name, label, s.counts[i])
		}
	}
	var ls []chartSeries
	for _, s := range series {
		ls = append(ls, chartSeries{name: s.name + " (ms)", color: s.color})
	}
	legend(&b, ls)
	b.WriteString(`</svg></figure>`)
	return template.HTML(b.String())
}

var circuitColors = map[string]string{"closed": "#3a3", "open": "#d33", "half_open": "#e90"}

// circuitChart draws each service's circuit state as a band over time.
func circuitChart(r *Report) template.HTML {
	names := r.Config.serviceNames()
	rowH := 22.0
	h := rowH*float64(len(names)) + padB + 10
	end := r.Ended.D()
	var b strings.Builder
	fmt.Fprintf(&b, `<figure><figcaption>Circuit state over time (green closed, red open, orange half-open)</figcaption><svg viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img">`, chartW, h, chartW, h)
	span := chartW - padL - 10 - 60
	for i, name := range names {
		y := 5 + rowH*float64(i)
		fmt.Fprintf(&b, `<text x="4" y="%.1f" font-size="11">%s</text>`, y+14, template.HTMLEscapeString(name))
		state, from := "closed", time.Duration(0)
		draw := func(to time.Duration) {
			x0 := padL + 60 + span*float64(from)/math.Max(1, float64(end))
			x1 := padL + 60 + span*float64(to)/math.Max(1, float64(end))
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s"><title>%s %s from %v</title></rect>`,
				x0, y, math.Max(0.5, x1-x0), rowH-6, circuitColors[state], name, state, from.Round(time.Second))
		}
		for _, c := range r.Services[name].Circuit {
			draw(c.At.D())
			state, from = c.State, c.At.D()
		}
		draw(end)
	}
	for i := 0; i <= 6; i++ {
		x := padL + 60 + span*float64(i)/6
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="10" text-anchor="middle">%v</text>`, x, h-6, time.Duration(float64(end)*float64(i)/6).Round(time.Second))
	}
	b.WriteString(`</svg></figure>`)
	return template.HTML(b.String())
}

func niceCeil(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"}

type pageData struct {
	R        *Report
	Mode     string
	Queue    template.HTML
	Services []template.HTML
	Latency  template.HTML
	Circuits template.HTML
	JSON     string
}

func htmlData(r *Report) pageData {
	d := pageData{R: r, Mode: "real clock"}
	if r.Virtual {
		d.Mode = "virtual clock"
	}
	end := r.Ended.D()
	var waiting, running []float64
	for _, p := range r.QueueDepth {
		waiting = append(waiting, float64(p.Waiting))
		running = append(running, float64(p.Running))
	}
	d.Queue = lineChart("Queue depth over time", end,
		chartSeries{name: "waiting", color: palette[0], values: waiting},
		chartSeries{name: "running", color: palette[1], values: running})
	for i, name := range r.Config.serviceNames() {
		sm := r.Services[name]
		sc := r.Config.Services[name]
		var use, limit []float64
		for _, v := range sm.Usage {
			use = append(use, float64(v))
			limit = append(limit, float64(sm.Limit))
		}
		what := fmt.Sprintf("calls in the last %v", sc.RateWindow.D())
		if sc.RateLimit == 0 {
			what = "calls in progress"
		}
		series := []chartSeries{{name: what, color: palette[i%len(palette)], values: use},
			{name: fmt.Sprintf("limit %d", sm.Limit), color: "#d33", values: limit, dashed: true}}
		if ml := sc.Behavior.MockLimit; ml > 0 && ml != sc.RateLimit {
			var mock []float64
			for range sm.Usage {
				mock = append(mock, float64(ml))
			}
			series = append(series, chartSeries{name: fmt.Sprintf("mock limit %d", ml), color: "#777", values: mock, dashed: true})
		}
		d.Services = append(d.Services, lineChart(fmt.Sprintf("%s: use against its limit (%d calls, %d violations)", name, sm.Checks.Calls, sm.Checks.RateViolations+sm.Checks.ConcurrencyViolations), end, series...))
	}
	q, run := r.Latency.QueueWait, r.Latency.Run
	d.Latency = barChart(fmt.Sprintf("Latency distribution: queue wait p50 %.0f / p95 %.0f / p99 %.0f ms; run p50 %.0f / p95 %.0f / p99 %.0f ms", q.P50, q.P95, q.P99, run.P50, run.P95, run.P99),
		q.Buckets, struct {
			name, color string
			counts      []int
		}{"queue wait", palette[0], q.Histogram}, struct {
			name, color string
			counts      []int
		}{"run", palette[1], run.Histogram})
	d.Circuits = circuitChart(r)
	b, _ := json.MarshalIndent(r, "", "  ")
	d.JSON = string(b)
	return d
}

var htmlPage = template.Must(template.New("report").Funcs(template.FuncMap{
	"dur": func(d Duration) string { return d.D().Round(time.Millisecond).String() },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>runcue-sim: {{.R.Scenario}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;max-width:820px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
.pass{color:#080;font-weight:bold}.fail{color:#c00;font-weight:bold}
figure{margin:14px 0}figcaption{font-size:13px;margin-bottom:4px}
pre{font-size:11px;background:#f6f6f6;padding:8px;overflow:auto;max-height:300px}
</style></head><body>
<h1>runcue-sim: {{.R.Scenario}} — {{if .R.Pass}}<span class="pass">PASS</span>{{else}}<span class="fail">FAIL</span>{{end}}</h1>
<p>{{.R.Config.Description}}</p>
<p>{{.Mode}}, seed {{.R.Config.Seed}}: {{dur .R.Ended}} simulated ({{.R.EndReason}}) in {{dur .R.Wall}}.
{{.R.Submission.Units}} units submitted in {{.R.Submission.Groups}} groups; {{.R.Units.Completed}} completed, {{.R.Units.Failed}} failed, {{.R.Units.Unfinished}} unfinished.</p>
<h2>Invariants</h2>
<table><tr><th>check</th><th>verdict</th><th>detail</th></tr>
{{range .R.Invariants}}<tr><td>{{.Name}}</td><td>{{if .Pass}}<span class="pass">pass</span>{{else}}<span class="fail">FAIL</span>{{end}}</td><td>{{.Detail}}</td></tr>
{{end}}</table>
<h2>Queue</h2>
{{.Queue}}
<h2>Services</h2>
{{range .Services}}{{.}}{{end}}
{{.Circuits}}
<h2>Latency</h2>
{{.Latency}}
<h2>Figures</h2>
<table>
<tr><td>throughput</td><td>{{.R.Throughput.Mean}} units/min (peak {{.R.Throughput.Peak}})</td></tr>
<tr><td>retries</td><td>rate {{.R.Retries.Rate}}; {{.R.Retries.Retried}} units retried, {{.R.Retries.SucceededAfterRetry}} succeeded after retry; {{.R.Retries.Deferred}} deferred (429)</td></tr>
<tr><td>priority inversions</td><td>{{.R.Priority.Inversions}}</td></tr>
<tr><td>refused at submit</td><td>{{.R.Submission.RefusedCycles}} cycles, {{.R.Submission.RefusedBackpressure}} backpressure</td></tr>
{{range $name, $s := .R.Services}}<tr><td>{{$name}}</td><td>{{$s.Checks.Calls}} calls, max {{$s.Checks.MaxInWindow}} in a window, max {{$s.Checks.MaxConcurrent}} at once, rate-limited {{dur $s.RateLimited}}, circuit opened {{$s.Opened}}</td></tr>
{{end}}</table>
<h2>Report (JSON)</h2>
<pre>{{.JSON}}</pre>
</body></html>
`))
