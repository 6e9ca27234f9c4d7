package runcue

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
)

// Ready-made DependencySatisfied callbacks: a dependency's output is a file,
// or a row in the application's own database.

// DependencyFile returns a DependencyFunc that reports a dependency as
// satisfied when a file matching pattern exists. In pattern, {id}, {task}
// and {target} stand for the dependency's ID, task type and target (as they
// are: an application whose targets can contain path separators or ".."
// should not use {target}); the result is a filepath.Match pattern, so it
// may hold wildcards:
//
//	runcue.DependencyFile("/data/out/{task}/{id}.json")
//	runcue.DependencyFile("/data/pages/{target}/*.html")
//
// A pattern that is malformed is an error, reported like any callback
// failure.
func DependencyFile(pattern string) DependencyFunc {
	return func(ctx context.Context, dep Dependency) (bool, error) {
		p := strings.NewReplacer("{id}", dep.ID, "{task}", dep.Task, "{target}", dep.Target).Replace(pattern)
		matches, err := filepath.Glob(p)
		if err != nil {
			return false, fmt.Errorf("runcue: DependencyFile %q: %w", pattern, err)
		}
		return len(matches) > 0, nil
	}
}

// DependencyQuery returns a DependencyFunc that reports a dependency as
// satisfied when query, run on db with the dependency's ID as its one
// argument, returns a row:
//
//	runcue.DependencyQuery(db, `SELECT 1 FROM outputs WHERE work_id = ?`)
//
// (use the placeholder your driver expects). The query runs with the
// callback's context, so CallbackTimeout bounds it; a failed query is an
// error, reported like any callback failure.
func DependencyQuery(db *sql.DB, query string) DependencyFunc {
	return func(ctx context.Context, dep Dependency) (bool, error) {
		rows, err := db.QueryContext(ctx, query, dep.ID)
		if err != nil {
			return false, fmt.Errorf("runcue: DependencyQuery: %w", err)
		}
		defer rows.Close()
		found := rows.Next()
		if err := rows.Err(); err != nil {
			return false, fmt.Errorf("runcue: DependencyQuery: %w", err)
		}
		return found, nil
	}
}
