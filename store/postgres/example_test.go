package postgres_test

import (
	"context"
	"log"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/postgres"
)

// A Cue on PostgreSQL: open the store, then the Cue on it; close the Cue,
// then the store.
func ExampleOpen() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, "postgres://runcue@db.internal/runcue", postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	cue, err := runcue.New(st, runcue.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()
	if err := cue.Task("resize", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		return nil, nil
	}}); err != nil {
		log.Fatal(err)
	}
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer cue.Stop(ctx)
}
