package runcuecli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
	"github.com/runcue/runcue/store/sqlite"
)

// executorCmd runs this program's handlers (Options.Handlers) for the
// remote tasks of the database's owner (runcue.Task.Remote).
func (c *cli) executorCmd() *cobra.Command {
	var cfg runcue.ExecutorConfig
	cmd := &cobra.Command{
		Use:         "executor [--capacity N] [--poll DURATION] [--id NAME]",
		Annotations: map[string]string{unbounded: "yes"},
		Short:       "Run this program's handlers of remote tasks for the database's owner, until interrupted",
		Long: `Run this program's handlers of the database owner's remote tasks
(runcue.Task.Remote), on this host: the executor registers its tasks and
capacity, starts the runs the owner assigns it (each by its start
deadline), reports their starts and ends, and keeps their leases alive. On
SIGINT or SIGTERM it stops its handlers (cause ErrShutdown), reports them
and leaves. --poll must be at most a quarter of the owner's MaxStartDelay
(--max-start-delay, default the owner's default).`,
		Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.db == "" {
				return usageError{errors.New("no database: pass --db or set RUNCUE_DB")}
			}
			st, err := openStore(c.db)
			if err != nil {
				return err
			}
			defer st.Close()
			x, err := runcue.NewExecutor(st, cfg, c.o.Handlers)
			if err != nil {
				return usageError{err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			fmt.Fprintf(c.o.Stderr, "executor %s: %d tasks, capacity %d\n", x.ID(), len(c.o.Handlers), cfg.Capacity)
			return x.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&cfg.ID, "id", "", "the executor's name in the database (default host:pid:unique; a stable name lets a restart report its predecessor's runs at once)")
	cmd.Flags().IntVar(&cfg.Capacity, "capacity", 4, "handlers run at once")
	cmd.Flags().DurationVar(&cfg.PollInterval, "poll", 100*time.Millisecond, "how often to read the assignments")
	cmd.Flags().DurationVar(&cfg.MaxStartDelay, "max-start-delay", 0, "the owner's Config.MaxStartDelay (default its default)")
	return cmd
}

// openStore opens db's store: a SQLite file (which must exist), or a
// PostgreSQL database by its URL.
func openStore(db string) (store.Store, error) {
	kind, db, err := classifyDB(db)
	if err != nil {
		return nil, err
	}
	if kind == postgresDB {
		return postgres.Open(context.Background(), db, postgres.Options{})
	}
	if _, err := os.Stat(db); err != nil {
		return nil, fmt.Errorf("database %s: %w", db, err)
	}
	return sqlite.Open(db, sqlite.Options{})
}
