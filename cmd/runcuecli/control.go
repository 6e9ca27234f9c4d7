package runcuecli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/runcue/runcue"
	"github.com/spf13/cobra"
)

// importBatch is how many lines import submits per transaction.
const importBatch = 500

// importItem is import's outcome for one line.
type importItem struct {
	Line   int    `json:"line"`
	ID     string `json:"id,omitempty"`
	Status string `json:"status"` // new, duplicate, refused
	Error  string `json:"error,omitempty"`
}

func (c *cli) importCmd() *cobra.Command {
	return &cobra.Command{
		Use:         "import FILE.jsonl",
		Annotations: map[string]string{unbounded: "yes"},
		Short:       "Submit one unit per line of a JSON Lines file (task, id, target, params, idempotency_key, depends_on, run_at)",
		Long: `import submits the file's units in batches. A unit whose idempotency key
is already held is reported as a duplicate, not an error, so an import can be
run again. A line that cannot be submitted is reported refused, with why; the
rest of its batch is still stored. A depends_on may name the id of any line
of the file: dependencies are submitted first. A line that is not valid UTF-8
is refused (JSON would replace its bytes). The exit code is 0 when every line
was stored or was a duplicate, 1 when a line was refused or the database
failed.`,
		Args: args(1, "one file"),
		RunE: func(cmd *cobra.Command, a []string) error {
			f, err := os.Open(a[0])
			if err != nil {
				return err
			}
			defer f.Close()
			var items []importItem
			var lines []importLine
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 64<<20)
			n := 0
			for sc.Scan() {
				n++
				text := bytes.TrimSpace(sc.Bytes())
				if len(text) == 0 {
					continue
				}
				var s submission
				var why string
				switch err := json.Unmarshal(text, &s); {
				case !utf8.Valid(text):
					why = "not valid UTF-8"
				case err != nil:
					why = "not a JSON object: " + err.Error()
				case s.Task == "":
					why = "no task"
				}
				if why != "" {
					items = append(items, importItem{Line: n, Status: "refused", Error: why})
					continue
				}
				lines = append(lines, importLine{n: n, s: s})
			}
			if err := sc.Err(); err != nil {
				return err
			}
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				progress := progressLine(c.o.Stderr)
				done, err := importLines(ctx, q, dependenciesFirst(lines), func(k int) { progress(fmt.Sprintf("%d lines", k)) })
				progress("")
				if err != nil {
					return err
				}
				items = append(items, done...)
				slices.SortFunc(items, func(a, b importItem) int { return a.Line - b.Line })
				counts := map[string]int{}
				for _, it := range items {
					counts[it.Status]++
				}
				v := struct {
					New       int          `json:"new"`
					Duplicate int          `json:"duplicate"`
					Refused   int          `json:"refused"`
					Items     []importItem `json:"items"`
				}{counts["new"], counts["duplicate"], counts["refused"], items}
				if err := c.emit(v, func(w *tabwriter.Writer) {
					fmt.Fprintf(w, "%d new, %d duplicate, %d refused\n", v.New, v.Duplicate, v.Refused)
					for _, it := range items {
						if it.Status == "refused" {
							fmt.Fprintf(w, "line %d\trefused\t%s\n", it.Line, cell(it.Error))
						}
					}
				}); err != nil {
					return err
				}
				if v.Refused > 0 {
					return fmt.Errorf("%d of %d lines refused", v.Refused, len(items))
				}
				return nil
			})
		},
	}
}

// importLine is a parsed line of an import: its number and submission.
type importLine struct {
	n int
	s submission
}

// dependenciesFirst orders lines so that a line whose depends_on names the
// id of another line of the file comes after it (else in file order).
// Lines in a cycle keep their order and are refused when submitted.
func dependenciesFirst(lines []importLine) []importLine {
	byID := make(map[string]int, len(lines))
	for i, l := range lines {
		if l.s.ID != "" {
			if _, dup := byID[l.s.ID]; !dup {
				byID[l.s.ID] = i
			}
		}
	}
	out := make([]importLine, 0, len(lines))
	const (
		unseen = iota
		visiting
		placed
	)
	state := make([]uint8, len(lines))
	var visit func(i int)
	visit = func(i int) {
		if state[i] != unseen {
			return // placed, or a cycle: left where it is met
		}
		state[i] = visiting
		for _, dep := range lines[i].s.DependsOn {
			if j, ok := byID[dep]; ok {
				visit(j)
			}
		}
		state[i] = placed
		out = append(out, lines[i])
	}
	for i := range lines {
		visit(i)
	}
	return out
}

// importLines submits lines in batches of importBatch, in order, and
// reports each. A line whose dependency (by id, in the file) was refused
// is refused without being submitted.
func importLines(ctx context.Context, q *runcue.Cue, lines []importLine, progress func(int)) ([]importItem, error) {
	refused := map[string]int{} // id -> line
	var items []importItem
	var batch []submission
	var nums []int
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		res, err := submitEach(ctx, q, batch, nums, refused)
		if err != nil {
			return err
		}
		for i, r := range res {
			r.Line = nums[i]
			if r.Status == "refused" && batch[i].ID != "" {
				refused[batch[i].ID] = nums[i]
			}
			items = append(items, r)
		}
		batch, nums = batch[:0], nums[:0]
		progress(len(items))
		return nil
	}
	for _, l := range lines {
		if it, ok := refusedDependency(l.s, refused); ok {
			it.Line = l.n
			if l.s.ID != "" {
				refused[l.s.ID] = l.n
			}
			items = append(items, it)
			continue
		}
		batch, nums = append(batch, l.s), append(nums, l.n)
		if len(batch) == importBatch {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return items, nil
}

// submitEach submits a batch and reports each item. A batch refused as a
// whole (an unknown task, a cycle, an invalid line) is submitted again one
// by one, so that each refusal is told to its own line; then a line that
// depends on one refused (refused: id -> line) is refused without being
// submitted.
func submitEach(ctx context.Context, q *runcue.Cue, batch []submission, nums []int, refused map[string]int) ([]importItem, error) {
	subs := make([]runcue.Submission, len(batch))
	for i, s := range batch {
		subs[i] = s.runcue()
	}
	out, err := q.SubmitBatch(ctx, subs)
	if err == nil {
		items := make([]importItem, len(out))
		for i, r := range out {
			items[i] = itemOf(r, nil)
		}
		return items, nil
	}
	if ctx.Err() != nil || len(batch) == 1 {
		if len(batch) == 1 && ctx.Err() == nil && !isStoreFailure(err) {
			return []importItem{itemOf(runcue.Submitted{}, err)}, nil
		}
		return nil, err
	}
	items := make([]importItem, 0, len(batch))
	for k, s := range batch {
		if it, ok := refusedDependency(s, refused); ok {
			if s.ID != "" {
				refused[s.ID] = nums[k]
			}
			items = append(items, it)
			continue
		}
		r, err := q.Submit(ctx, s.runcue())
		if err != nil && (ctx.Err() != nil || isStoreFailure(err)) {
			return nil, err
		}
		it := itemOf(r, err)
		if it.Status == "refused" && s.ID != "" {
			refused[s.ID] = nums[k]
		}
		items = append(items, it)
	}
	return items, nil
}

// refusedDependency refuses s if it depends on a line refused (refused:
// id -> line); the caller marks s refused too.
func refusedDependency(s submission, refused map[string]int) (importItem, bool) {
	i := slices.IndexFunc(s.DependsOn, func(d string) bool { _, ok := refused[d]; return ok })
	if i < 0 {
		return importItem{}, false
	}
	dep := s.DependsOn[i]
	return importItem{Status: "refused", Error: fmt.Sprintf("depends on %s (line %d), which was refused", dep, refused[dep])}, true
}

// isStoreFailure reports an error that is not a refusal of the items.
func isStoreFailure(err error) bool {
	for _, refusal := range []error{runcue.ErrInvalid, runcue.ErrUnknownTask, runcue.ErrUnknownDependency, runcue.ErrCycle,
		runcue.ErrDuplicate, runcue.ErrDuplicateID, runcue.ErrDependencyRefused, runcue.ErrBackpressure} {
		if errors.Is(err, refusal) {
			return false
		}
	}
	return true
}

func itemOf(r runcue.Submitted, err error) importItem {
	if err == nil {
		err = r.Err
	}
	switch {
	case err != nil:
		return importItem{ID: r.ID, Status: "refused", Error: err.Error()}
	case r.Duplicate:
		return importItem{ID: r.ID, Status: "duplicate"}
	}
	return importItem{ID: r.ID, Status: "new"}
}

// progressLine returns a function that shows a progress line on w if it is
// a terminal ("" clears it), and does nothing otherwise.
func progressLine(w any) func(string) {
	f, ok := w.(*os.File)
	if !ok {
		return func(string) {}
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return func(string) {}
	}
	return func(s string) { fmt.Fprintf(f, "\r\033[K%s", s) }
}

func (c *cli) retryCmd() *cobra.Command {
	var f filterFlags
	var failed, dryRun bool
	cmd := &cobra.Command{
		Use:   "retry ID | --failed [filters] [--dry-run]",
		Short: "Requeue a failed unit, or every failed unit a filter selects, with a fresh retry budget",
		RunE: func(cmd *cobra.Command, a []string) error {
			if failed == (len(a) == 1) || len(a) > 1 {
				return usageError{errors.New("want one unit ID, or --failed with filters")}
			}
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				if !failed {
					if _, err := get(ctx, q, a[0]); err != nil {
						return err
					}
					if err := q.Retry(ctx, a[0]); err != nil {
						return err
					}
					return c.count("requeued", 1, false)
				}
				o, err := f.options()
				if err != nil {
					return err
				}
				n, err := q.RetryWhere(ctx, o, dryRun)
				if err != nil {
					return err
				}
				return c.count("requeued", n, dryRun)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().BoolVar(&failed, "failed", false, "every failed unit the filters select")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count, change nothing")
	return cmd
}

// count reports how many units a change touched (or, dry, would).
func (c *cli) count(what string, n int, dry bool) error {
	v := struct {
		Count  int  `json:"count"`
		DryRun bool `json:"dry_run,omitempty"`
	}{n, dry}
	return c.emit(v, func(w *tabwriter.Writer) {
		if dry {
			fmt.Fprintf(w, "%d would be %s (dry run)\n", n, what)
			return
		}
		fmt.Fprintf(w, "%d %s\n", n, what)
	})
}

func (c *cli) cancelCmd() *cobra.Command {
	var f filterFlags
	var opts runcue.CancelOptions
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "cancel ID | [filters] [--dry-run]",
		Short: "Cancel a unit, or every queued or running unit the filters select",
		RunE: func(cmd *cobra.Command, a []string) error {
			filtered := len(f.states)+len(f.tasks) > 0 || f.targetPrefix != "" || f.errorHas != "" || f.since != "" || f.until != ""
			if filtered == (len(a) == 1) || len(a) > 1 {
				return usageError{errors.New("want one unit ID, or filters")}
			}
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				if !filtered {
					if _, err := get(ctx, q, a[0]); err != nil {
						return err
					}
					if err := q.Cancel(ctx, a[0], opts); err != nil {
						return err
					}
					return c.count("cancelled", 1, false)
				}
				o, err := f.options()
				if err != nil {
					return err
				}
				n, err := q.CancelWhere(ctx, o, opts, dryRun)
				if err != nil {
					return err
				}
				return c.count("cancelled", n, dryRun)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().BoolVar(&opts.Cascade, "cascade", false, "cancel the dependents too (else they fail)")
	cmd.Flags().StringVar(&opts.Reason, "reason", "", "recorded as the units' error")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count, change nothing")
	return cmd
}

func (c *cli) serviceCmd() *cobra.Command {
	svc := &cobra.Command{Use: "service", Short: "Services and keyed instances (host:example.org): ls, show, pause, resume, set, reset"}
	svc.AddCommand(&cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "Every service: its own load, and its keyed instances apart", Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				all, err := q.Services(ctx)
				if err != nil {
					return err
				}
				return c.emit(all, func(w *tabwriter.Writer) {
					// A class's own load against its limits; its instances
					// (each with those limits of its own) apart.
					// Against the limits in force (an adaptive service's
					// effective ones).
					fmt.Fprintln(w, "SERVICE\tRUNNING/CAP\tIN WINDOW/RATE\tCIRCUIT\tPAUSED\tKEYS\tKEYS RUNNING")
					for _, s := range all {
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%d\t%d\n", s.Name, active(s), inWindow(s),
							s.CircuitShown(), s.Paused, s.Keys, s.KeysActive)
					}
				})
			})
		},
	})
	svc.AddCommand(&cobra.Command{
		Use: "show NAME", Short: "One service's limits and state", Args: args(1, "one service"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				st, err := q.ServiceStatus(ctx, a[0])
				if err != nil {
					return err
				}
				return c.emit(st, func(w *tabwriter.Writer) {
					l := st.Limits
					circuit := "off"
					if l.CircuitThreshold > 0 {
						circuit = fmt.Sprintf("opens after %d failures in a row, for %v", l.CircuitThreshold, l.CircuitTimeout)
					}
					rate := "none"
					if l.RateLimit > 0 {
						rate = fmt.Sprintf("%d per %v", l.RateLimit, l.RateWindow)
					}
					fmt.Fprintf(w, "service\t%s\nlimits\tmax_concurrent %s, rate %s, circuit breaker %s\n", st.Name,
						limit(l.MaxConcurrent), rate, circuit)
					if l.RateLimit > 0 {
						fmt.Fprintf(w, "margin\t%s%s\n", margin(l.Margin), map[bool]string{true: ", paced"}[l.Pace])
					}
					if st.Keys > 0 {
						fmt.Fprintf(w, "keys\t%d (%d units running; %d groups of queued units, by task and keys, waiting for one; each with these limits of its own)\n",
							st.Keys, st.KeysActive, st.KeysWaiting)
					}
					fmt.Fprintf(w, "overridden\t%v\npaused\t%v (%d keys paused)\nrunning\t%s\nin window\t%s\ncircuit\t%s\n", st.Overridden,
						st.Paused, st.PausedKeys, active(st), inWindow(st), st.CircuitShown())
					if st.Waiting > 0 {
						fmt.Fprintf(w, "waiting\t%d units, in %d groups (by task and keys), held by this service\n", st.WaitingUnits, st.Waiting)
					}
					if len(st.Unmatched) > 0 {
						fmt.Fprintf(w, "ignored\treported amounts no meter counts: %s (see Meter.Aliases)\n", strings.Join(st.Unmatched, ", "))
					}
					fmt.Fprintf(w, "held until\t%s\nnext capacity\t%s\n", when(st.BlockedUntil), when(st.NextCapacity))
					for _, m := range st.Meters {
						fmt.Fprintf(w, "meter %s\t%s\n", m.Name, meterLine(m))
					}
					if st.Adaptive != nil && !st.Adaptive.Lowered() {
						fmt.Fprintf(w, "adaptive\tat the configured limits\n")
					}
					for _, line := range st.Adaptive.Describe(l) {
						fmt.Fprintf(w, "adaptive\t%s\n", line)
					}
				})
			})
		},
	})
	change := func(use, short string, f func(*runcue.Cue, context.Context, string) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " NAME", Short: short, Args: args(1, "one service or keyed instance"),
			RunE: func(cmd *cobra.Command, a []string) error {
				return c.with(func(ctx context.Context, q *runcue.Cue) error {
					if err := f(q, ctx, a[0]); err != nil {
						return err
					}
					return c.done(use, a[0])
				})
			},
		}
	}
	svc.AddCommand(change("pause", "Stop dispatching to it (stored)", (*runcue.Cue).PauseService),
		change("resume", "Dispatch to it again", (*runcue.Cue).ResumeService),
		change("reset", "Clear its override: its registered limits apply", (*runcue.Cue).ResetService))
	var maxC, rate, threshold int
	var window, timeout, marginD time.Duration
	var pace bool
	set := &cobra.Command{
		Use: "set NAME", Short: "Override its limits (the flags given; the others keep their values)", Args: args(1, "one service or keyed instance"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				st, err := q.ServiceStatus(ctx, a[0]) // a keyed instance's own limits
				if err != nil {
					return err
				}
				l := st.Limits
				fl := cmd.Flags()
				if fl.Changed("max-concurrent") {
					l.MaxConcurrent = maxC
				}
				if fl.Changed("rate-limit") {
					l.RateLimit = rate
				}
				if fl.Changed("rate-window") {
					l.RateWindow = window
				}
				if fl.Changed("circuit-threshold") {
					l.CircuitThreshold = threshold
				}
				if fl.Changed("circuit-timeout") {
					l.CircuitTimeout = timeout
				}
				if fl.Changed("margin") {
					l.Margin = marginD
				}
				if fl.Changed("pace") {
					l.Pace = pace
				}
				if err := q.SetService(ctx, a[0], l); err != nil {
					return err
				}
				return c.done("set", a[0])
			})
		},
	}
	set.Flags().IntVar(&maxC, "max-concurrent", 0, "units at once (0: unlimited)")
	set.Flags().IntVar(&rate, "rate-limit", 0, "starts per --rate-window (0: none)")
	set.Flags().DurationVar(&window, "rate-window", 0, "the rate window")
	set.Flags().IntVar(&threshold, "circuit-threshold", 0, "consecutive failures that open the circuit (0: none)")
	set.Flags().DurationVar(&timeout, "circuit-timeout", 0, "how long an open circuit stays open")
	set.Flags().DurationVar(&marginD, "margin", 0, "the spread from a start to its arrival at the service that the window tolerates (0: 10ms; negative: none)")
	set.Flags().BoolVar(&pace, "pace", false, "space the starts of a backlog rate-window/rate-limit apart")
	svc.AddCommand(set)
	return svc
}

// meterLine describes an amount meter now: "7,900 of 8,000 in the last
// 1m0s; frees at 12:01:07" (its oldest start's leaving).
func meterLine(m runcue.MeterStatus) string {
	s := fmt.Sprintf("%s of %s in the last %v", grouped(m.Used), grouped(m.Limit), m.Window)
	if m.FromElsewhere > 0 || m.ElsewhereShare > 0 {
		s += fmt.Sprintf(" (%s of it room kept: the headers showed %s used by others", grouped(m.Elsewhere), grouped(m.FromElsewhere))
		if m.ElsewhereShare > 0 {
			s += fmt.Sprintf(", and %.0f%% of the refill", 100*m.ElsewhereShare)
		}
		s += ")"
	}
	if !m.Frees.IsZero() {
		s += "; frees at " + m.Frees.Local().Format("15:04:05")
	}
	return s
}

// grouped writes n with its thousands separated by commas.
func grouped(n int64) string {
	s := strconv.FormatInt(max(n, 0), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// inWindow is a service's starts in its rate window against its limit.
// inWindow is a service's rate window against the limit in force: "12/60
// per 1m0s"; "-" without one.
func inWindow(s runcue.ServiceStatus) string {
	if s.Limits.RateLimit == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d per %v", s.InWindow, s.Rate(), s.Limits.RateWindow)
}

// active is a service's running units against the cap in force: "3/8";
// "3" without a cap.
func active(s runcue.ServiceStatus) string {
	if s.Concurrency() == 0 {
		return fmt.Sprint(s.Active)
	}
	return fmt.Sprintf("%d/%d", s.Active, s.Concurrency())
}

// margin describes a Service.Margin.
func margin(m time.Duration) string {
	switch {
	case m == 0:
		return runcue.DefaultMargin.String() + " (default)"
	case m < 0:
		return "none"
	}
	return m.String()
}

// done reports a change applied to name.
func (c *cli) done(what, name string) error {
	v := struct {
		Name   string `json:"name"`
		Change string `json:"change"`
	}{name, what}
	return c.emit(v, func(w *tabwriter.Writer) { fmt.Fprintf(w, "%s: %s\n", name, what) })
}

func (c *cli) taskCmd() *cobra.Command {
	task := &cobra.Command{Use: "task", Short: "Pause or resume a task type"}
	for _, pause := range []bool{true, false} {
		use, f := "resume", (*runcue.Cue).ResumeTask
		if pause {
			use, f = "pause", (*runcue.Cue).PauseTask
		}
		task.AddCommand(&cobra.Command{
			Use: use + " NAME", Short: use + " a task type (stored)", Args: args(1, "one task type"),
			RunE: func(cmd *cobra.Command, a []string) error {
				return c.with(func(ctx context.Context, q *runcue.Cue) error {
					if err := f(q, ctx, a[0]); err != nil {
						return err
					}
					return c.done(use, a[0])
				})
			},
		})
	}
	return task
}

func (c *cli) pauseCmd(pause bool) *cobra.Command {
	use, f := "resume", (*runcue.Cue).ResumeQueue
	if pause {
		use, f = "pause", (*runcue.Cue).PauseQueue
	}
	return &cobra.Command{
		Use: use, Short: use + " the whole queue (stored; running units go on)", Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				if err := f(q, ctx); err != nil {
					return err
				}
				return c.done(use, "queue")
			})
		},
	}
}

func (c *cli) tailCmd() *cobra.Command {
	var o runcue.SubscribeOptions
	var types []string
	cmd := &cobra.Command{
		Use:         "tail",
		Annotations: map[string]string{unbounded: "yes"},
		Short:       "Follow events as they are committed (one JSON object per line with -o json) until interrupted",
		Args:        args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, t := range types {
				o.Types = append(o.Types, runcue.EventType(t))
			}
			if !cmd.Flags().Changed("after") {
				o.After = runcue.SeqNow
			}
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				evs, stop, err := q.Subscribe(ctx, o)
				if err != nil {
					return err
				}
				defer stop()
				enc := json.NewEncoder(c.out)
				out := terminalSafe{c.out}
				for ev := range evs {
					if c.output == "json" {
						if err := enc.Encode(ev); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintf(out, "%d %s %s %s %s %s %s\n", ev.Seq, ev.Time.UTC().Format(time.RFC3339Nano), ev.Type, cell(ev.Task),
						cell(ev.WorkID), cell(ev.Target), cell(firstLine(ev.Error)))
				}
				return nil
			})
		},
	}
	cmd.Flags().Int64Var(&o.After, "after", 0, "resume after this sequence number (default: from now)")
	cmd.Flags().StringSliceVar(&types, "type", nil, "only these event types")
	cmd.Flags().StringSliceVar(&o.Tasks, "task", nil, "only events of these task types")
	cmd.Flags().StringVar(&o.Name, "name", "", "a durable subscription to resume (acknowledge with your consumer)")
	return cmd
}

func (c *cli) pruneCmd() *cobra.Command {
	var older time.Duration
	cmd := &cobra.Command{
		Use:         "prune --older-than DURATION",
		Annotations: map[string]string{unbounded: "yes"},
		Short:       "Delete finished units (and their history) finished longer ago than DURATION",
		Args:        args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if older <= 0 {
				return usageError{errors.New("--older-than: want a positive duration (720h)")}
			}
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				n, err := q.Prune(ctx, older)
				if err != nil {
					return err
				}
				return c.count("pruned", n, false)
			})
		},
	}
	cmd.Flags().DurationVar(&older, "older-than", 0, "how long ago they finished")
	return cmd
}

func (c *cli) backupCmd() *cobra.Command {
	return &cobra.Command{
		Use:         "backup FILE",
		Annotations: map[string]string{unbounded: "yes"},
		Short:       "Write a consistent copy of the database to FILE while work goes on",
		Args:        args(1, "one file to create"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				if err := q.Backup(ctx, a[0]); err != nil {
					return err
				}
				return c.done("backup", a[0])
			})
		},
	}
}

func (c *cli) runCmd() *cobra.Command {
	var drain bool
	cmd := &cobra.Command{
		Use:         "run [--drain]",
		Annotations: map[string]string{unbounded: "yes"},
		Short:       "Own the database and run its work with this program's handlers, until interrupted (or, with --drain, done)",
		Args:        args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				before, err := q.Stats(ctx)
				if err != nil {
					return err
				}
				if err := q.Start(ctx); err != nil {
					return err
				}
				progress := progressLine(c.o.Stderr)
				done := make(chan error, 1)
				go func() {
					if drain {
						done <- q.Drain(ctx)
						return
					}
					<-ctx.Done()
					done <- nil
				}()
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				start := time.Now()
				for {
					select {
					case err := <-done:
						progress("")
						if err != nil && !errors.Is(err, context.Canceled) {
							return err
						}
						stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						if err := q.Stop(stopCtx); err != nil {
							return err
						}
						return c.runSummary(stopCtx, q, before, time.Since(start))
					case <-tick.C:
						s, err := q.Stats(ctx)
						if err != nil {
							continue
						}
						var completed int
						for _, m := range s.Minutes {
							completed += m.Completed
						}
						progress(fmt.Sprintf("queued %d · running %d · completed %d · failed %d · %.1f/s",
							s.States[runcue.StateQueued], s.States[runcue.StateRunning], s.States[runcue.StateCompleted],
							s.States[runcue.StateFailed], float64(completed)/max(time.Since(start).Seconds(), 1)))
					}
				}
			})
		},
	}
	cmd.Flags().BoolVar(&drain, "drain", false, "return once no work is left")
	return cmd
}

// runSummary prints what a run did (the units that ended meanwhile, by
// state) and what is left, on a terminal or not.
func (c *cli) runSummary(ctx context.Context, q *runcue.Cue, before runcue.Stats, took time.Duration) error {
	after, err := q.Stats(ctx)
	if err != nil {
		return err
	}
	delta := func(st runcue.State) int { return max(after.States[st]-before.States[st], 0) }
	v := struct {
		Seconds   float64 `json:"seconds"`
		Completed int     `json:"completed"`
		Failed    int     `json:"failed"`
		Skipped   int     `json:"skipped"`
		Cancelled int     `json:"cancelled"`
		Queued    int     `json:"queued"`
		Running   int     `json:"running"`
	}{took.Seconds(), delta(runcue.StateCompleted), delta(runcue.StateFailed), delta(runcue.StateSkipped),
		delta(runcue.StateCancelled), after.States[runcue.StateQueued], after.States[runcue.StateRunning]}
	return c.emit(v, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "ran %s: %d completed, %d failed, %d skipped, %d cancelled; %d queued, %d running\n",
			took.Round(100*time.Millisecond), v.Completed, v.Failed, v.Skipped, v.Cancelled, v.Queued, v.Running)
	})
}

func (c *cli) scheduleCmd() *cobra.Command {
	sched := &cobra.Command{Use: "schedule", Short: "Recurring submissions: ls, pause, resume, delete"}
	sched.AddCommand(&cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "Every schedule, with its last and next period", Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				all, err := q.Schedules(ctx)
				if err != nil {
					return err
				}
				return c.emit(all, func(w *tabwriter.Writer) {
					fmt.Fprintln(w, "SCHEDULE\tTASK\tTIMING\tMISSED\tPAUSED\tLAST\tNEXT\tNEXT AT")
					for _, s := range all {
						next := "-"
						if !s.NextAt.IsZero() {
							next = s.NextAt.Format(time.RFC3339)
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%s\t%s\t%s\n", s.Name, s.Task, timingText(s.Timing, s.Retimed), s.Missed, s.Paused,
							orDash(s.Last), orDash(s.Next), next)
					}
				})
			})
		},
	})
	for _, op := range []struct {
		use, short string
		f          func(*runcue.Cue, context.Context, string) error
	}{
		{"pause", "Stop a schedule submitting (stored; the periods due meanwhile are missed)", (*runcue.Cue).PauseSchedule},
		{"resume", "Let a paused schedule submit again", (*runcue.Cue).ResumeSchedule},
		{"delete", "Delete a schedule (its units stay)", (*runcue.Cue).DeleteSchedule},
	} {
		sched.AddCommand(&cobra.Command{
			Use: op.use + " NAME", Short: op.short, Args: args(1, "one schedule"),
			RunE: func(cmd *cobra.Command, a []string) error {
				return c.with(func(ctx context.Context, q *runcue.Cue) error {
					if err := op.f(q, ctx, a[0]); err != nil {
						return err
					}
					return c.done(op.use, a[0])
				})
			},
		})
	}
	return sched
}

// timingText is a schedule's timing in a word or two.
func timingText(t runcue.Timing, retimed bool) string {
	s := "every " + t.Every.String()
	if t.Cron != "" {
		s = t.Cron
		if t.Zone != "" {
			s += " " + t.Zone
		}
	}
	if retimed {
		s += " (retimed)"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
