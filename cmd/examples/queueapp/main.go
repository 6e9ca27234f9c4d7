// Command queueapp is an application that embeds runcue's command tree
// under its own "queue" command, with its handlers registered:
//
//	queueapp queue --db app.db enqueue summarize --target doc-1
//	queueapp queue --db app.db run --drain     # runs it with the handler below
//	queueapp queue --db app.db stats
//
// Its own commands would sit beside "queue" on the same root.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/cmd/runcuecli"
	"github.com/spf13/cobra"
)

// open opens the application's database with its services and tasks.
func open(path string) (*runcue.Cue, error) {
	c, err := runcue.Open(path, runcue.Config{})
	if err != nil {
		return nil, err
	}
	if err := c.Service("llm", runcue.Service{MaxConcurrent: 4}); err != nil {
		c.Close()
		return nil, err
	}
	err = c.Task("summarize", runcue.Task{Services: []string{"llm"},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			return "summary of " + strings.ToUpper(w.Target), nil
		}})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func main() {
	root := &cobra.Command{Use: "queueapp", Short: "An application with a work queue", SilenceUsage: true}
	root.AddCommand(&cobra.Command{Use: "hello", Short: "One of the application's own commands",
		Run: func(*cobra.Command, []string) { fmt.Println("hello") }})
	if len(os.Args) > 1 && os.Args[1] == "queue" {
		// runcuecli.Main maps its errors to exit codes (1 error, 2 usage).
		os.Exit(runcuecli.Main(runcuecli.Options{Name: "queueapp queue", Open: open}, os.Args[2:]))
	}
	root.AddCommand(runcuecli.New(runcuecli.Options{Name: "queue", Open: open}))
	if err := root.Execute(); err != nil {
		os.Exit(1)
	}
}
