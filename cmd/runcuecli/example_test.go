package runcuecli_test

import (
	"context"
	"os"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/cmd/runcuecli"
)

// An application embeds the command tree with its own Open, which
// registers its services and tasks: `myapp queue run --drain` runs its
// work with its handlers, and every other command works as runcue's.
func ExampleNew() {
	open := func(path string) (*runcue.Cue, error) {
		c, err := runcue.Open(path, runcue.Config{})
		if err != nil {
			return nil, err
		}
		if err := c.Service("llm", runcue.Service{MaxConcurrent: 4}); err != nil {
			c.Close()
			return nil, err
		}
		if err := c.Task("summarize", runcue.Task{Services: []string{"llm"},
			Handler: func(ctx context.Context, w *runcue.Work) (any, error) { return "a summary", nil }}); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	queue := runcuecli.New(runcuecli.Options{Name: "queue", Open: open})
	_ = queue // add it under the application's own root command: root.AddCommand(queue)
	if len(os.Args) > 1 && os.Args[1] == "queue" {
		os.Exit(runcuecli.Main(runcuecli.Options{Name: "queue", Open: open}, os.Args[2:]))
	}
}
