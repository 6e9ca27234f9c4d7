package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/runcue/runcue/store"
)

// Fault implements store.Classifier: what a PostgreSQL error means for
// the Cue (see the table in docs/resilience.md).
//
// Transient: the connection could not be made or was lost (SQLSTATE class
// 08, a dial or read error, an unexpected EOF), the server is shutting
// down or starting (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
// cannot_connect_now), it is a replica (25006 read_only_sql_transaction:
// a primary that became a standby, or a URL that reached the wrong host),
// a serialization failure or a deadlock (40001, 40P01), too many
// connections (53300), a statement or lock timeout (57014, 55P03), an
// idle-in-transaction timeout (25P03), and a pool's acquire that timed
// out. Fatal: a full disk (53100), out of memory (53200), corruption
// (class XX), a permission refused (42501), a missing table or schema
// (42P01, 3F000: someone dropped it), authentication refused (28000,
// 28P01), an unknown database (3D000), a schema newer than this binary.
func (s *Store) Fault(err error) (store.Fault, bool) {
	return classify(err)
}

func classify(err error) (store.Fault, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", // shutting down, starting
			pe.Code == "25006",                     // read-only: a replica
			pe.Code == "40001", pe.Code == "40P01", // serialization failure, deadlock
			pe.Code == "53300",                     // too many connections
			pe.Code == "57014", pe.Code == "55P03", // query cancelled (a timeout), lock not available
			pe.Code == "25P03": // idle_in_transaction_session_timeout
			return store.Transient, true
		}
		return store.Fatal, true
	}
	if errors.Is(err, store.ErrSchemaTooNew) || errors.Is(err, store.ErrRewound) {
		return store.Fatal, true
	}
	if errors.Is(err, errInProgress) {
		return store.Transient, true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		// The server refused or could not be reached, or it answered
		// with an error while connecting (classified above when it is a
		// PgError, such as 57P03 while it starts).
		return store.Transient, true
	}
	if pgconn.Timeout(err) || pgconn.SafeToRetry(err) {
		return store.Transient, true
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "conn closed"), strings.Contains(msg, "conn busy"),
		strings.Contains(msg, "unexpected EOF"),
		strings.Contains(msg, "broken pipe"), strings.Contains(msg, "connection reset"),
		strings.Contains(msg, "failed to deallocate cached statement"):
		// pgx reports a connection it closed after a network error
		// with these words, without wrapping the cause.
		return store.Transient, true
	}
	return 0, false
}

// isReadOnly reports a 25006: the server is a replica (a failover made the
// old primary a standby, or the URL's host is one). The connection that
// got it is discarded, so that the pool connects again, to the primary
// when the URL names several hosts with target_session_attrs=read-write.
func isReadOnly(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25006"
}

// commitUnknown reports whether err, a COMMIT's, leaves its outcome
// unknown: any failure but an answer of the server's (a PgError, or a
// ROLLBACK: it did not commit). pgx's own words cannot be trusted to say
// that nothing was sent: a COMMIT whose connection was cut as the server
// received it fails with "conn closed", which pgconn.SafeToRetry calls
// safe.
func commitUnknown(err error) bool {
	var pe *pgconn.PgError
	return !errors.As(err, &pe) && !errors.Is(err, pgx.ErrTxCommitRollback)
}

// errInProgress: a transaction whose COMMIT's answer was lost is still in
// progress at the server (it has not noticed its connection's end yet).
var errInProgress = errors.New("runcue: postgres: the transaction is still in progress")

// xact is a transaction whose COMMIT's answer may be lost: its ID, the
// start of the server that ran it (pg_postmaster_start_time), and the
// last event it appended (0 for none).
type xact struct {
	id     int64
	server time.Time
	last   int64
}

// xactCommitted asks the server whether transaction x committed.
//
// A server that crashed as the COMMIT was sent (or a replica promoted
// since) may have kept nothing of the transaction, not even its ID: it
// then hands the ID out again. An ID in the server's future is therefore
// one that never committed, not a rewind (a rewind, the loss of commits
// this process saw answered, is found by the event log's numbers). Once
// the server hands the ID to another transaction, txid_status tells of
// that one: when the server restarted since x began, a transaction that
// appended events is judged by its last event's block, which it wrote
// (its xmin is x's ID) only if it committed. Without events (a heartbeat,
// a lease's renewal, a registration: writes that are made again at their
// next period), the status is taken as the server gives it.
func (s *Store) xactCommitted(ctx context.Context, x xact) (bool, error) {
	var status *string
	var server time.Time
	err := s.pool.QueryRow(ctx, `SELECT txid_status($1), pg_postmaster_start_time()`, x.id).Scan(&status, &server)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "22023" && strings.Contains(pe.Message, "in the future"):
		return false, nil
	case err != nil:
		return false, err
	case status == nil:
		// Too old for the server to know: not one it just ran.
		return false, fmt.Errorf("%w: transaction %d is unknown to the server", store.ErrRewound, x.id)
	}
	if !server.Equal(x.server) && x.last > 0 {
		var xmin int64
		err := s.pool.QueryRow(ctx, `SELECT xmin::text::bigint FROM event_blocks WHERE last = $1`, x.last).Scan(&xmin)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return uint32(xmin) == uint32(x.id), nil
	}
	switch *status {
	case "committed":
		return true, nil
	case "aborted":
		return false, nil
	}
	return false, errInProgress
}
