package runcue_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/runcue/runcue"
)

// A dependency's output is a file: the dependent runs only once the file
// named after the dependency exists.
func ExampleDependencyFile() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	out := filepath.Join(dir, "{task}-{id}.html")

	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{
		Logger:              slog.New(slog.DiscardHandler),
		DependencySatisfied: runcue.DependencyFile(out),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()
	_ = cue.Task("fetch", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		return nil, os.WriteFile(filepath.Join(dir, "fetch-"+w.ID+".html"), []byte("<html>"), 0o600)
	}})
	_ = cue.Task("parse", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		_, err := os.Stat(filepath.Join(dir, "fetch-page-1.html"))
		fmt.Println("parse runs; the page is there:", err == nil)
		return nil, nil
	}})
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = cue.SubmitBatch(ctx, []runcue.Submission{
		{Task: "parse", DependsOn: []string{"page-1"}},
		{Task: "fetch", ID: "page-1"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := cue.Drain(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: parse runs; the page is there: true
}

// A dependency's output is a row in the application's own database: the
// handler records it, and the dependent runs only once the row exists.
func ExampleDependencyQuery() {
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	// The application's database (SQLite here; any database/sql driver).
	db, err := sql.Open("sqlite", filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE outputs(work_id TEXT PRIMARY KEY, body TEXT)`); err != nil {
		log.Fatal(err)
	}

	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{
		Logger:              slog.New(slog.DiscardHandler),
		DependencySatisfied: runcue.DependencyQuery(db, `SELECT 1 FROM outputs WHERE work_id = ?`),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()
	_ = cue.Task("extract", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		_, err := db.ExecContext(ctx, `INSERT INTO outputs VALUES(?, ?)`, w.ID, "text")
		return nil, err
	}})
	_ = cue.Task("summarize", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		var body string
		err := db.QueryRowContext(ctx, `SELECT body FROM outputs WHERE work_id = 'doc-1'`).Scan(&body)
		fmt.Println("summarize reads:", body, err)
		return nil, nil
	}})
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = cue.SubmitBatch(ctx, []runcue.Submission{
		{Task: "extract", ID: "doc-1"},
		{Task: "summarize", DependsOn: []string{"doc-1"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := cue.Drain(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: summarize reads: text <nil>
}
