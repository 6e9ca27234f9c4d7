// Package runcuecli is the runcue command tree: operate a runcue database
// from a terminal or a script, while an owner runs in another process.
// cmd/runcue is this tree as a program; an application embeds it (New with
// its own Open) to get the same commands with its handlers registered,
// and with them run.
//
// Exit codes: 0 success, 1 an error (an unknown unit ID, a refused
// change, a failed database), 2 a usage error (unknown command or flag,
// missing argument).
package runcuecli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/postgres"
	"github.com/spf13/cobra"
)

// Options configure the command tree.
type Options struct {
	// Name is the command's name. Default "runcue".
	Name string
	// Open opens the database at path (a file, or a PostgreSQL URL). An
	// application passes its own, with its services and tasks registered,
	// so that run can run them. Default: runcue.Open with a default Config
	// for a file, or store/postgres for a postgres:// or postgresql:// URL
	// (no handlers: run is not offered).
	Open func(path string) (*runcue.Cue, error)
	// Handlers are the handlers of remote tasks (runcue.Task.Remote) this
	// program runs as an executor: the executor command is offered when
	// set.
	Handlers map[string]runcue.Handler
	// Stdout and Stderr default to the process's.
	Stdout, Stderr io.Writer
}

// usageError marks an error as a usage error (exit code 2).
type usageError struct{ error }

// Main runs the command tree on args (os.Args[1:]) and returns the exit
// code.
func Main(o Options, args []string) int {
	cmd := New(o)
	cmd.SetArgs(args)
	err := cmd.Execute()
	if err == nil {
		return 0
	}
	stderr := o.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	msg := err.Error()
	for _, db := range []string{cliDB(cmd), os.Getenv("RUNCUE_DB")} {
		msg = redactIn(msg, db) // a connection string's password, never printed
	}
	fmt.Fprintln(terminalSafe{stderr}, cmd.Name()+":", msg)
	var ue usageError
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") {
		return 2
	}
	return 1
}

// cli holds the state every command shares.
type cli struct {
	o        Options
	embedded bool // Open is the application's: it may create the database
	db       string
	output   string
	out      io.Writer
	// timeout bounds a command that is bounded (see unbounded).
	timeout time.Duration
	bounded bool
	// closeStore closes the store openDefault opened beside its Cue (a
	// PostgreSQL store: the Cue does not own it).
	closeStore func()
}

// openDefault opens db with a default Config: a SQLite file, or a
// PostgreSQL database by its URL.
func (c *cli) openDefault(db string) (*runcue.Cue, error) {
	kind, db, err := classifyDB(db)
	if err != nil {
		return nil, err
	}
	if kind == sqliteFile {
		return runcue.Open(db, runcue.Config{})
	}
	st, err := postgres.Open(context.Background(), db, postgres.Options{})
	if err != nil {
		return nil, err
	}
	q, err := runcue.New(st, runcue.Config{})
	if err != nil {
		st.Close()
		return nil, err
	}
	c.closeStore = func() { st.Close() }
	return q, nil
}

// New returns the command tree.
func New(o Options) *cobra.Command {
	if o.Name == "" {
		o.Name = "runcue"
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	embedded := o.Open != nil
	c := &cli{o: o, out: o.Stdout, embedded: embedded}
	if o.Open == nil {
		c.o.Open = c.openDefault
	}
	root := &cobra.Command{
		Use:   o.Name,
		Short: "Operate a runcue database: status, work, services, events",
		Long: `Operate a runcue database: status, work, services, events. Every command
works while the database's owner runs in another process; answers that need
the owner's live state (explain, stats, service) are asked of it.

Exit codes: 0 success; 1 an error (an unknown unit, a refused change, a
failed database); 2 a usage error (an unknown command or flag, a missing
argument, no --db).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if c.output != "table" && c.output != "json" {
				return usageError{fmt.Errorf("--output %q: want table or json", c.output)}
			}
			c.bounded = cmd.Annotations[unbounded] == ""
			return nil
		},
	}
	root.SetOut(o.Stdout)
	root.SetErr(o.Stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&c.db, "db", os.Getenv("RUNCUE_DB"), "the database: a file, or a postgres:// URL (default $RUNCUE_DB)")
	root.PersistentFlags().StringVarP(&c.output, "output", "o", "table", "output format: table or json")
	root.PersistentFlags().DurationVar(&c.timeout, "timeout", 30*time.Second,
		"how long a command waits for an unavailable database (retrying) before it fails; 0 waits as long as it takes (tail, serve, run, executor, import, prune and backup are not bounded)")
	root.AddCommand(c.statsCmd(), c.listCmd(), c.showCmd(), c.explainCmd(), c.enqueueCmd(), c.importCmd(),
		c.retryCmd(), c.cancelCmd(), c.serviceCmd(), c.taskCmd(), c.scheduleCmd(), c.pauseCmd(true), c.pauseCmd(false),
		c.tailCmd(), c.pruneCmd(), c.backupCmd(), c.serveCmd(), c.versionCmd())
	if embedded {
		root.AddCommand(c.runCmd())
	}
	if len(o.Handlers) > 0 {
		root.AddCommand(c.executorCmd())
	}
	return root
}

// args returns a positional-argument check that reports a usage error.
func args(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, a []string) error {
		if len(a) != n {
			return usageError{fmt.Errorf("want %s", what)}
		}
		return nil
	}
}

// with opens the database, runs f with a context cancelled by an
// interrupt, and closes the database.
func (c *cli) with(f func(ctx context.Context, q *runcue.Cue) error) error {
	if c.db == "" {
		return usageError{errors.New("no database: pass --db or set RUNCUE_DB")}
	}
	if _, _, err := classifyDB(c.db); err != nil && !c.embedded {
		return err
	}
	if _, err := os.Stat(c.db); err != nil && !c.embedded && !isPostgresURL(c.db) {
		// A mistyped path must not create an empty database.
		return fmt.Errorf("database %s: %w", redactDSN(c.db), err)
	}
	q, err := c.o.Open(c.db)
	if err != nil {
		return err
	}
	defer func() {
		q.Close()
		if c.closeStore != nil {
			c.closeStore()
			c.closeStore = nil
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if c.bounded && c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	return f(ctx, q)
}

// emit writes v as JSON, or calls table to write it as a table.
func (c *cli) emit(v any, table func(w *tabwriter.Writer)) error {
	if c.output == "json" {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(terminalSafe{c.out}, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

// when formats a time for tables: RFC 3339 in UTC, "-" for zero.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func (c *cli) statsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Counts, throughput, queue wait and services",
		Args:  args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				s, err := q.Stats(ctx)
				if err != nil {
					return err
				}
				return c.emit(s, func(w *tabwriter.Writer) {
					states := []runcue.State{runcue.StateQueued, runcue.StateRunning, runcue.StateCompleted,
						runcue.StateSkipped, runcue.StateFailed, runcue.StateCancelled}
					fmt.Fprintln(w, "TASK\tQUEUED\tRUNNING\tCOMPLETED\tSKIPPED\tFAILED\tCANCELLED")
					row := func(name string, m map[runcue.State]int) {
						fmt.Fprint(w, name)
						for _, st := range states {
							fmt.Fprintf(w, "\t%d", m[st])
						}
						fmt.Fprintln(w)
					}
					for _, task := range sortedKeys(s.Tasks) {
						row(task, s.Tasks[task])
					}
					row("all", s.States)
					var m runcue.MinuteStats
					for _, x := range s.Minutes {
						m.Started += x.Started
						m.Completed += x.Completed
						m.Failed += x.Failed
						m.Retried += x.Retried
						m.Deferred += x.Deferred
					}
					fmt.Fprintln(w)
					fmt.Fprintf(w, "oldest queued\t%s\n", when(s.OldestQueued))
					fmt.Fprintf(w, "last hour\t%d started, %d completed, %d failed, %d retried, %d deferred\n",
						m.Started, m.Completed, m.Failed, m.Retried, m.Deferred)
					q := s.QueueWait
					fmt.Fprintf(w, "queue wait\tp50 %s, p90 %s, p99 %s (%d dispatches; each within its histogram bucket)\n",
						q.Bounds(q.P50), q.Bounds(q.P90), q.Bounds(q.P99), q.Count)
					if s.QueuePaused {
						fmt.Fprintln(w, "queue\tpaused")
					}
					if p := s.Patterns; p.Debouncing > 0 {
						fmt.Fprintf(w, "debounce\t%d keys settling\n", p.Debouncing)
					}
					if p := s.Patterns; p.Sequences > 0 {
						fmt.Fprintf(w, "sequences\t%d keys with %d units waiting their turn, %d held by a failure\n",
							p.Sequences, p.SequenceWaiting, p.SequencesHeld)
					}
					if p := s.Patterns; p.Batches > 0 || p.BatchesWaiting > 0 {
						fmt.Fprintf(w, "batches\t%d run with %d units (%.1f a batch), %d waiting for more units\n",
							p.Batches, p.Batched, float64(p.Batched)/float64(max(p.Batches, 1)), p.BatchesWaiting)
					}
					if len(s.PausedTasks) > 0 {
						fmt.Fprintf(w, "paused tasks\t%s\n", strings.Join(s.PausedTasks, ", "))
					}
					if len(s.Services) > 0 {
						fmt.Fprintln(w)
						fmt.Fprintln(w, "SERVICE\tRUNNING/CAP\tIN WINDOW/RATE\tCIRCUIT\tPAUSED\tDEFERRED")
						for _, sv := range s.Services {
							fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%d\n", sv.Name, active(sv.ServiceStatus), inWindow(sv.ServiceStatus),
								sv.CircuitShown(), sv.Paused, sv.Deferred)
							for _, k := range sv.Keys {
								fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%v\t\n", k.Name, active(k), inWindow(k), k.CircuitShown(), k.Paused)
							}
						}
					}
				})
			})
		},
	}
}

func limit(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// filterFlags are the flags that select units (list, retry, cancel).
type filterFlags struct {
	states, tasks          []string
	targetPrefix, errorHas string
	since, until           string
}

func (f *filterFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&f.states, "state", nil, "only units in these states")
	cmd.Flags().StringSliceVar(&f.tasks, "task", nil, "only units of these task types")
	cmd.Flags().StringVar(&f.targetPrefix, "target-prefix", "", "only units whose target starts with this")
	cmd.Flags().StringVar(&f.errorHas, "error", "", "only units whose error contains this")
	cmd.Flags().StringVar(&f.since, "since", "", "only units submitted at or after this time (RFC 3339) or this long ago (1h)")
	cmd.Flags().StringVar(&f.until, "until", "", "only units submitted before this time (RFC 3339) or this long ago")
}

func (f *filterFlags) options() (runcue.ListOptions, error) {
	o := runcue.ListOptions{Tasks: f.tasks, TargetPrefix: f.targetPrefix, ErrorContains: f.errorHas}
	for _, s := range f.states {
		st := runcue.State(s)
		if !st.Valid() {
			return o, usageError{fmt.Errorf("--state %q: not a state", s)}
		}
		o.States = append(o.States, st)
	}
	var err error
	if o.SubmittedAfter, err = parseWhen(f.since); err != nil {
		return o, usageError{fmt.Errorf("--since: %w", err)}
	}
	if o.SubmittedBefore, err = parseWhen(f.until); err != nil {
		return o, usageError{fmt.Errorf("--until: %w", err)}
	}
	return o, nil
}

// parseWhen reads an RFC 3339 time or a duration ago; "" is zero.
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	return time.Parse(time.RFC3339, s)
}

func (c *cli) listCmd() *cobra.Command {
	var f filterFlags
	var limitN int
	var newest bool
	var cursor string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List units, oldest first, a page at a time",
		Args:  args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options()
			if err != nil {
				return err
			}
			o.Limit, o.Newest, o.Cursor = limitN, newest, cursor
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				page, err := q.List(ctx, o)
				if err != nil {
					return err
				}
				return c.emit(page, func(w *tabwriter.Writer) {
					fmt.Fprintln(w, "ID\tTASK\tSTATE\tTARGET\tRUNS\tERROR")
					for _, u := range page.Units {
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", cell(u.ID), u.Task, u.State, cell(u.Target), u.Runs, cell(firstLine(u.Error)))
					}
					if page.Next != "" {
						fmt.Fprintf(w, "\nmore: --cursor %s\n", page.Next)
					}
				})
			})
		},
	}
	f.add(cmd)
	cmd.Flags().IntVar(&limitN, "limit", 100, "units per page (at most 1000)")
	cmd.Flags().BoolVar(&newest, "newest", false, "newest first")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue from a previous page")
	return cmd
}

// get reads a unit, saying plainly when the ID is unknown.
func get(ctx context.Context, q *runcue.Cue, id string) (runcue.WorkInfo, error) {
	wi, err := q.Get(ctx, id)
	if errors.Is(err, runcue.ErrNotFound) {
		return wi, fmt.Errorf("no unit %q in this database", id)
	}
	return wi, err
}

func (c *cli) showCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "A unit: its fields, attempts, dependencies and why it is not running",
		Args:  args(1, "one unit ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				wi, err := get(ctx, q, a[0])
				if err != nil {
					return err
				}
				ex, err := q.Explain(ctx, a[0])
				if err != nil {
					return err
				}
				v := struct {
					Unit    runcue.WorkInfo    `json:"unit"`
					Explain runcue.Explanation `json:"explain"`
				}{wi, ex}
				return c.emit(v, func(w *tabwriter.Writer) {
					fmt.Fprintf(w, "id\t%s\ntask\t%s\ntarget\t%s\nstate\t%s\nruns\t%d (failures %d)\n", cell(wi.ID), wi.Task, cell(wi.Target),
						wi.State, wi.Runs, wi.Failures)
					fmt.Fprintf(w, "submitted\t%s\nstarted\t%s\nfinished\t%s\n", when(wi.CreatedAt), when(wi.StartedAt), when(wi.FinishedAt))
					if wi.Error != "" {
						fmt.Fprintf(w, "error\t%s (%s)\n", cell(firstLine(wi.Error)), wi.ErrorKind)
					}
					if len(wi.DependsOn) > 0 {
						fmt.Fprintf(w, "depends on\t%s\n", strings.Join(wi.DependsOn, ", "))
					}
					if wi.DebounceKey != "" {
						fmt.Fprintf(w, "debounced\tkey %s, burst since %s (a later submission of the key replaces it)\n", cell(wi.DebounceKey), when(wi.DebounceSince))
					}
					cost := wi.Cost.String()
					if cost == "" {
						cost = "requests 1"
					}
					fmt.Fprintf(w, "cost\t%s (estimated at submit; charged at each start)\n", cost)
					if len(wi.Attempts) > 0 {
						fmt.Fprintln(w, "\nRUN\tSTART\tDURATION\tOUTCOME\tUSED\tERROR")
						for _, at := range wi.Attempts {
							fmt.Fprintf(w, "%d\t%s\t%v\t%s\t%s\t%s\n", at.Run, when(at.Start), at.Duration(), at.Outcome, cell(at.Used.String()),
								cell(firstLine(at.Error)))
						}
					}
					fmt.Fprintln(w)
					explainTable(w, ex)
				})
			})
		},
	}
}

func explainTable(w *tabwriter.Writer, ex runcue.Explanation) {
	source := "the owner, live"
	if !ex.Live {
		source = "the database, as of " + when(ex.AsOf)
	}
	fmt.Fprintf(w, "REASON\tSERVICE\tUNTIL\tDETAIL\t(from %s)\n", source)
	for _, r := range ex.Reasons {
		svc := r.Service
		if r.Meter != "" {
			svc += " (" + r.Meter + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", r.Kind, cell(svc), when(r.Until), cell(r.Detail))
	}
	for _, n := range ex.Notes {
		fmt.Fprintf(w, "note\t\t\t%s\t\n", n)
	}
}

func (c *cli) explainCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "explain ID",
		Short: "Why a unit is not running now",
		Args:  args(1, "one unit ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				if _, err := get(ctx, q, a[0]); err != nil {
					return err
				}
				ex, err := q.Explain(ctx, a[0])
				if err != nil {
					return err
				}
				return c.emit(ex, func(w *tabwriter.Writer) { explainTable(w, ex) })
			})
		},
	}
}

// submission is a unit as enqueue and import read it.
type submission struct {
	Task           string          `json:"task"`
	ID             string          `json:"id,omitempty"`
	Target         string          `json:"target,omitempty"`
	Params         json.RawMessage `json:"params,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	DependsOn      []string        `json:"depends_on,omitempty"`
	RunAt          time.Time       `json:"run_at,omitzero"`
}

func (s submission) runcue() runcue.Submission {
	out := runcue.Submission{Task: s.Task, ID: s.ID, Target: s.Target, IdempotencyKey: s.IdempotencyKey,
		DependsOn: s.DependsOn, RunAt: s.RunAt}
	if len(s.Params) > 0 {
		out.Params = s.Params
	}
	return out
}

func (c *cli) enqueueCmd() *cobra.Command {
	var s submission
	var params string
	cmd := &cobra.Command{
		Use:   "enqueue TASK",
		Short: "Submit one unit",
		Args:  args(1, "one task type"),
		RunE: func(cmd *cobra.Command, a []string) error {
			s.Task = a[0]
			if params != "" {
				if !json.Valid([]byte(params)) {
					return usageError{errors.New("--params is not JSON")}
				}
				s.Params = json.RawMessage(params)
			}
			return c.with(func(ctx context.Context, q *runcue.Cue) error {
				out, err := q.Submit(ctx, s.runcue())
				if err != nil {
					return err
				}
				v := struct {
					ID        string `json:"id"`
					Duplicate bool   `json:"duplicate,omitempty"`
				}{out.ID, out.Duplicate}
				return c.emit(v, func(w *tabwriter.Writer) {
					if out.Duplicate {
						fmt.Fprintf(w, "%s\t(duplicate: the key's unit)\n", out.ID)
						return
					}
					fmt.Fprintln(w, out.ID)
				})
			})
		},
	}
	cmd.Flags().StringVar(&s.Target, "target", "", "what the unit works on")
	cmd.Flags().StringVar(&params, "params", "", "parameters, as JSON")
	cmd.Flags().StringVar(&s.IdempotencyKey, "key", "", "idempotency key")
	cmd.Flags().StringVar(&s.ID, "id", "", "the unit's ID (default: generated)")
	cmd.Flags().StringSliceVar(&s.DependsOn, "depends-on", nil, "IDs of units it waits for")
	return cmd
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// version is the module's version as built, or "(devel)".
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == "github.com/runcue/runcue" {
				if dep.Replace != nil {
					return dep.Version + " (replaced by " + dep.Replace.Path + ")"
				}
				return dep.Version
			}
		}
		if bi.Main.Path == "github.com/runcue/runcue" {
			return bi.Main.Version
		}
	}
	return "(devel)"
}

func (c *cli) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "The runcue library version this command was built with",
		Args:  args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := struct {
				Version string `json:"version"`
			}{version()}
			return c.emit(v, func(w *tabwriter.Writer) { fmt.Fprintf(w, "runcue %s\n", v.Version) })
		},
	}
}

// unbounded is the annotation of the commands --timeout does not bound:
// they run until stopped, or for as long as their data takes.
const unbounded = "unbounded"

// cliDB is the --db flag's value of the command tree cmd ran in.
func cliDB(cmd *cobra.Command) string {
	if f := cmd.PersistentFlags().Lookup("db"); f != nil {
		return f.Value.String()
	}
	return ""
}
