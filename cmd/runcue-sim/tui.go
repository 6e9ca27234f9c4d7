package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/runcue/runcue"
)

// snapshot is what one frame of the TUI shows: taken off the UI's loop
// at the frame rate, never per event, so the UI's cost does not grow with
// the event rate.
type snapshot struct {
	At           time.Duration     `json:"at"`
	States       map[string]int    `json:"states"`
	Services     []serviceSnapshot `json:"services"`
	Recent       []string          `json:"-"`
	Events       int               `json:"events"`
	Retries      int               `json:"retries"`
	Backpressure bool              `json:"backpressure"`
	Paused       bool              `json:"paused"`
	ErrorRate    string            `json:"error_rate"`
	LatencyScale float64           `json:"latency_scale"`
	RateScale    float64           `json:"rate_scale"`
	Violations   map[string]int    `json:"server_side_violations"`
	Err          string            `json:"error,omitempty"`
}

type serviceSnapshot struct {
	Name          string `json:"name"`
	Active        int    `json:"active"`
	MaxConcurrent int    `json:"max_concurrent"`
	InWindow      int    `json:"in_window"`
	RateLimit     int    `json:"rate_limit"`
	MockInWindow  int    `json:"mock_in_window"`
	Circuit       string `json:"circuit"`
	Failing       bool   `json:"failing"`
}

// snapshot takes a frame's figures from the Cue (Stats, Services), the
// mocks and the recorder.
func (e *engine) snapshot(ctx context.Context) snapshot {
	now := e.clk.Now()
	s := snapshot{At: now.Sub(e.epoch), States: map[string]int{}, Violations: map[string]int{},
		Paused: e.paused.Load(), RateScale: math.Float64frombits(e.rateScale.Load())}
	st, err := e.cue.Stats(ctx)
	if err != nil {
		s.Err = err.Error()
	}
	for k, v := range st.States {
		s.States[string(k)] = v
	}
	svcs, err := e.cue.Services(ctx)
	if err != nil {
		s.Err = err.Error()
	}
	status := map[string]runcue.ServiceStatus{}
	for _, x := range svcs {
		status[x.Name] = x
	}
	s.ErrorRate = "as configured"
	for _, name := range e.cfg.serviceNames() {
		m := e.mocks[name]
		lv := m.live(now)
		x := status[name]
		s.Services = append(s.Services, serviceSnapshot{Name: name, Active: x.Active, MaxConcurrent: x.Limits.MaxConcurrent,
			InWindow: x.InWindow, RateLimit: x.Limits.RateLimit, MockInWindow: lv.inWindow, Circuit: string(x.Circuit),
			Failing: now.Sub(e.epoch) < time.Duration(m.failUntil.Load())})
		if r := math.Float64frombits(m.errorRate.Load()); !math.IsNaN(r) {
			s.ErrorRate = fmt.Sprintf("%.0f%%", 100*r)
		}
		s.LatencyScale = math.Float64frombits(m.latencyScale.Load())
	}
	for _, l := range e.rec.recentEvents() {
		s.Recent = append(s.Recent, fmt.Sprintf("%8.3fs %s", l.at.Sub(e.epoch).Seconds(), l.text))
	}
	e.rec.mu.Lock()
	s.Events, s.Retries, s.Backpressure = e.rec.events, e.rec.retried, e.rec.bpActive
	e.rec.mu.Unlock()
	return s
}

// Controls, as the spec's TUI has them.
var keys = struct {
	Error, Latency, Rate, Fail, Pause, Kill, Save, Quit key.Binding
}{
	Error:   key.NewBinding(key.WithKeys("e", "E"), key.WithHelp("E", "error rate")),
	Latency: key.NewBinding(key.WithKeys("l", "L"), key.WithHelp("L", "latency")),
	Rate:    key.NewBinding(key.WithKeys("r", "R"), key.WithHelp("R", "submit rate")),
	Fail:    key.NewBinding(key.WithKeys("c", "C"), key.WithHelp("C", "fail a service")),
	Pause:   key.NewBinding(key.WithKeys("p", "P"), key.WithHelp("P", "pause")),
	Kill:    key.NewBinding(key.WithKeys("k", "K"), key.WithHelp("K", "kill a task")),
	Save:    key.NewBinding(key.WithKeys("s", "S"), key.WithHelp("S", "snapshot")),
	Quit:    key.NewBinding(key.WithKeys("q", "Q", "ctrl+c"), key.WithHelp("Q", "quit")),
}

var (
	errorSteps   = []float64{math.NaN(), 0, 0.10, 0.25, 0.50}
	latencySteps = []float64{1, 2, 4, 0.5}
	rateSteps    = []float64{1, 1.5, 2, 0.5}
)

// Messages of the TUI.
type (
	frameMsg   struct{}
	snapMsg    snapshot
	runDoneMsg struct {
		rep *Report
		err error
	}
	statusMsg string
)

// tuiModel is the Bubble Tea model: it holds the last snapshot and
// applies the keys to the engine.
type tuiModel struct {
	e         *engine
	ctx       context.Context
	frame     time.Duration
	snap      snapshot
	status    string
	help      help.Model
	errStep   int
	latStep   int
	rateStep  int
	failNext  int
	saves     int
	saveDir   string
	stopping  bool
	done      bool
	width     int
	rep       *Report
	runErr    error
	frameSeen int // frames rendered from snapshots (tests)
}

func newTUIModel(ctx context.Context, e *engine, fps int, saveDir string) *tuiModel {
	fps = max(1, min(fps, 60))
	return &tuiModel{e: e, ctx: ctx, frame: time.Second / time.Duration(fps), help: help.New(), saveDir: saveDir, width: 72}
}

func (m *tuiModel) Init() tea.Cmd { return m.tick() }

func (m *tuiModel) tick() tea.Cmd {
	return tea.Tick(m.frame, func(time.Time) tea.Msg { return frameMsg{} })
}

// takeSnapshot takes the frame's snapshot off the UI loop.
func (m *tuiModel) takeSnapshot() tea.Cmd {
	e, ctx := m.e, m.ctx
	return func() tea.Msg { return snapMsg(e.snapshot(ctx)) }
}

func (m *tuiModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case frameMsg:
		return m, m.takeSnapshot()
	case snapMsg:
		m.snap = snapshot(msg)
		m.frameSeen++
		if m.done {
			return m, nil
		}
		return m, m.tick()
	case statusMsg:
		m.status = string(msg)
	case tea.WindowSizeMsg:
		m.width = max(60, min(msg.Width-2, 100))
	case runDoneMsg:
		m.done, m.rep, m.runErr = true, msg.rep, msg.err
		return m, tea.Quit
	case tea.KeyPressMsg:
		return m, m.key(msg)
	}
	return m, nil
}

// key applies a key press; commands that wait (kill, save) run off the
// UI loop.
func (m *tuiModel) key(k tea.KeyPressMsg) tea.Cmd {
	e := m.e
	switch {
	case key.Matches(k, keys.Quit):
		if !m.stopping {
			m.stopping = true
			m.status = "stopping: the run ends and its report is written"
			e.stopRun()
		}
	case key.Matches(k, keys.Error):
		m.errStep = (m.errStep + 1) % len(errorSteps)
		for _, mk := range e.mocks {
			mk.errorRate.Store(math.Float64bits(errorSteps[m.errStep]))
		}
		m.status = "error rate: " + rateLabel(errorSteps[m.errStep])
	case key.Matches(k, keys.Latency):
		m.latStep = (m.latStep + 1) % len(latencySteps)
		for _, mk := range e.mocks {
			mk.latencyScale.Store(math.Float64bits(latencySteps[m.latStep]))
		}
		m.status = fmt.Sprintf("latency ×%g", latencySteps[m.latStep])
	case key.Matches(k, keys.Rate):
		m.rateStep = (m.rateStep + 1) % len(rateSteps)
		e.rateScale.Store(math.Float64bits(rateSteps[m.rateStep]))
		m.status = fmt.Sprintf("submission rate ×%g", rateSteps[m.rateStep])
	case key.Matches(k, keys.Fail):
		names := e.cfg.serviceNames()
		name := names[m.failNext%len(names)]
		m.failNext++
		mk := e.mocks[name]
		mk.failUntil.Store(int64(e.clk.Now().Sub(e.epoch) + 30*time.Second))
		m.status = name + " fails every call for 30s"
	case key.Matches(k, keys.Pause):
		p := !e.paused.Load()
		e.paused.Store(p)
		m.status = map[bool]string{true: "submission paused", false: "submission resumed"}[p]
	case key.Matches(k, keys.Kill):
		ctx := m.ctx
		return func() tea.Msg {
			page, err := e.cue.List(ctx, runcue.ListOptions{States: []runcue.State{runcue.StateRunning}, Limit: 1})
			if err != nil {
				return statusMsg("kill: " + err.Error())
			}
			if len(page.Units) == 0 {
				return statusMsg("kill: nothing is running")
			}
			id := page.Units[0].ID
			if err := e.cue.Cancel(ctx, id, runcue.CancelOptions{}); err != nil {
				return statusMsg("kill " + id + ": " + err.Error())
			}
			return statusMsg("killed " + id)
		}
	case key.Matches(k, keys.Save):
		m.saves++
		path := filepath.Join(m.saveDir, fmt.Sprintf("runcue-sim-snapshot-%d.json", m.saves))
		snap := m.snap
		return func() tea.Msg {
			b, _ := json.MarshalIndent(snap, "", "  ")
			if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
				return statusMsg("save: " + err.Error())
			}
			return statusMsg("saved " + path)
		}
	}
	return nil
}

func rateLabel(x float64) string {
	if math.IsNaN(x) {
		return "as configured"
	}
	return fmt.Sprintf("%.0f%%", 100*x)
}

var (
	boxStyle   = lipgloss.NewStyle().Border(lipgloss.RoundedBorder()).Padding(0, 1)
	titleStyle = lipgloss.NewStyle().Bold(true)
	okStyle    = lipgloss.NewStyle().Foreground(lipgloss.Color("2"))
	badStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("1"))
	halfStyle  = lipgloss.NewStyle().Foreground(lipgloss.Color("3"))
)

func (m *tuiModel) View() tea.View {
	v := tea.NewView(m.render())
	v.AltScreen = true
	return v
}

// render draws the panels: Queue, Services, Recent Events, Controls.
func (m *tuiModel) render() string {
	s := m.snap
	w := m.width
	var b strings.Builder
	onOff := map[bool]string{true: badStyle.Render("ON"), false: "OFF"}
	paused := ""
	if s.Paused {
		paused = badStyle.Render("  SUBMISSION PAUSED")
	}
	fmt.Fprintf(&b, "%s  %s  t=%v%s\n", titleStyle.Render("runcue-sim"), m.e.cfg.Name, s.At.Round(time.Second), paused)
	queue := fmt.Sprintf("%s\nQueued: %d    Running: %d    Completed: %d    Failed: %d\nBackpressure: %s    Retries: %d    Events: %d",
		titleStyle.Render("Queue"), s.States["queued"], s.States["running"], s.States["completed"], s.States["failed"], onOff[s.Backpressure], s.Retries, s.Events)
	b.WriteString(boxStyle.Width(w).Render(queue) + "\n")
	var sv strings.Builder
	sv.WriteString(titleStyle.Render("Services"))
	for _, x := range s.Services {
		bar := concurrencyBar(x.Active, x.MaxConcurrent, 10)
		rate := "      -      "
		if x.RateLimit > 0 {
			rate = fmt.Sprintf("%3d/%-3d rate (mock %d)", x.InWindow, x.RateLimit, x.MockInWindow)
		}
		conc := fmt.Sprintf("%d/%d", x.Active, x.MaxConcurrent)
		if x.MaxConcurrent == 0 {
			conc = fmt.Sprintf("%d/∞", x.Active)
		}
		circuit := okStyle.Render("● OK")
		switch x.Circuit {
		case "open":
			circuit = badStyle.Render("○ OPEN")
		case "half_open":
			circuit = halfStyle.Render("◐ HALF")
		}
		failing := ""
		if x.Failing {
			failing = badStyle.Render(" failing")
		}
		fmt.Fprintf(&sv, "\n%-12s %s %-5s conc  %s  %s%s", x.Name, bar, conc, rate, circuit, failing)
	}
	b.WriteString(boxStyle.Width(w).Render(sv.String()) + "\n")
	ev := titleStyle.Render("Recent Events")
	for _, l := range s.Recent {
		if len(l) > w-4 {
			l = l[:w-4]
		}
		ev += "\n" + l
	}
	b.WriteString(boxStyle.Width(w).Render(ev) + "\n")
	ctl := fmt.Sprintf("%s  error rate %s, latency ×%g, rate ×%g\n%s",
		titleStyle.Render("Controls"), s.ErrorRate, s.LatencyScale, s.RateScale,
		m.help.ShortHelpView([]key.Binding{keys.Error, keys.Latency, keys.Rate, keys.Fail, keys.Pause, keys.Kill, keys.Save, keys.Quit}))
	if m.status != "" {
		ctl += "\n" + m.status
	}
	b.WriteString(boxStyle.Width(w).Render(ctl) + "\n")
	return b.String()
}

// concurrencyBar draws used of max as a bar of n cells.
func concurrencyBar(used, limit, n int) string {
	if limit <= 0 {
		return "[" + strings.Repeat("·", n) + "]"
	}
	k := min(n, (used*n+limit-1)/limit)
	return "[" + strings.Repeat("█", k) + strings.Repeat("░", n-k) + "]"
}

// stopRun ends a real-clock run early (the TUI's Q).
func (e *engine) stopRun() { e.stopOnce.Do(func() { close(e.stop) }) }

// runTUI runs the simulation on the real clock with the TUI; the run's
// report comes back when it ends (drained, its time up, or Q).
func runTUI(ctx context.Context, cfg Config, f *flags) (*Report, error) {
	e, err := newEngine(cfg, options{DB: f.db})
	if err != nil {
		return nil, err
	}
	m := newTUIModel(ctx, e, f.frameRate, f.snapshotDir)
	p := tea.NewProgram(m, tea.WithContext(ctx))
	// The run's goroutine ends with the run; runTUI waits for it.
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		rep, err := e.run(ctx)
		p.Send(runDoneMsg{rep: rep, err: err}) // returns at once once the program has ended
	}()
	if _, err := p.Run(); err != nil {
		e.stopRun()
		<-ran
		return nil, err
	}
	if m.runErr != nil {
		return nil, m.runErr
	}
	if m.rep == nil {
		return nil, fmt.Errorf("the run did not end")
	}
	return m.rep, nil
}
