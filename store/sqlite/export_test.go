package sqlite

import (
	"context"
	"errors"
	"strconv"
	"strings"
)

// SetUserVersionForTest sets the schema version recorded in the file.
func (s *Store) SetUserVersionForTest(v int) error {
	_, err := s.wconn.ExecContext(context.Background(), "PRAGMA user_version = "+strconv.Itoa(v))
	return err
}

// SchemaVersionOf reads the schema version recorded in the file.
func SchemaVersionOf(ctx context.Context, s *Store) (int, error) {
	var v int
	err := s.read.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v)
	return v, err
}

// IndexesForTest lists the indexes of table.
func IndexesForTest(ctx context.Context, s *Store, table string) ([]string, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type='index' AND tbl_name=?`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// IndexSQLForTest returns the CREATE statement of index name.
func IndexSQLForTest(ctx context.Context, s *Store, name string) (string, error) {
	var q string
	err := s.read.QueryRowContext(ctx, `SELECT sql FROM sqlite_master WHERE type='index' AND name=?`, name).Scan(&q)
	return q, err
}

// OpenUnitQueries are the queries of active units that must use the
// open-units index, by name.
var OpenUnitQueries = map[string]string{"running (Recover)": runningQuery, "oldest queued (drop-oldest)": oldestQueuedQuery}

// QueryPlanForTest returns SQLite's plan of query (with placeholders bound
// to 1), one detail per line.
func QueryPlanForTest(ctx context.Context, s *Store, query string) (string, error) {
	args := make([]any, strings.Count(query, "?"))
	for i := range args {
		args[i] = 1
	}
	rows, err := s.read.QueryContext(ctx, "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			return "", err
		}
		out = append(out, detail)
	}
	return strings.Join(out, "\n"), rows.Err()
}

// The reads of the event log by key: blocks from a sequence number on, a
// unit's record.
const (
	BlocksFromQuery = blocksFromQuery
	UnitRecordQuery = unitRecordQuery
)

// SetConvertForTest makes the conversion of a schema 11 log move size
// events a transaction and stop with an error after halt chunks (0: never).
func SetConvertForTest(size, halt int) (restore func()) {
	oldSize, oldHalt := convertChunk, convertHalt
	convertChunk = size
	if halt > 0 {
		convertHalt = func(chunks int) error {
			if chunks >= halt {
				return errors.New("halted for the test")
			}
			return nil
		}
	}
	return func() { convertChunk, convertHalt = oldSize, oldHalt }
}

// UnitRecordForTest returns unit id's record of its events.
func UnitRecordForTest(ctx context.Context, s *Store, id string) ([]byte, error) {
	var rec []byte
	err := s.read.QueryRowContext(ctx, unitRecordQuery, id).Scan(&rec)
	return rec, err
}

// ExecForTest runs a statement on the writer's connection.
func ExecForTest(ctx context.Context, s *Store, query string) error {
	_, err := s.wconn.ExecContext(ctx, query)
	return err
}
