// Package postgres is runcue's PostgreSQL backend, built on pgx. It lives
// in a module of its own: programs that use SQLite never download pgx.
//
//	st, err := postgres.Open(ctx, "postgres://runcue@db.internal/runcue", postgres.Options{})
//	c, err := runcue.New(st, cfg)
//
// # Sequence numbers in commit order
//
// PostgreSQL assigns a sequence's values before commit, so two
// transactions may commit in the opposite order of their numbers, and a
// reader could pass a number that commits later. The event log's numbers
// come instead from a counter row (meta 'events_last') that a
// transaction locks and moves on when it appends its first event, and
// holds until it commits: the transactions that append events commit one
// at a time, in the order of their numbers, and a reader that sees a
// number sees every lower one (a commit is visible before its row locks
// are released). Every transaction that changes units appends events, so
// writes to one database are serialized as SQLite serializes them; the
// reads are not.
//
// # Schemas
//
// The tables live in the connection's current schema (the first of its
// search_path): several runcue databases may share a PostgreSQL database,
// one schema each, by setting search_path in the URL
// (postgres://.../db?search_path=billing).
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Options configure a Store. The zero value is valid.
type Options struct {
	// MaxConns is the size of the connection pool. Default 10.
	MaxConns int32
	// PollOnly opens no LISTEN connection: for a pooler that pools
	// transactions (PgBouncer in transaction mode), where a session's
	// LISTEN does not work. Commits of other processes are then found by
	// polling alone (runcue.Config.PollInterval). Commits still NOTIFY,
	// once each, for listeners elsewhere.
	PollOnly bool
	// LeaseTTL is how long an owner's lease lasts without renewal: the
	// lease of a Cue that dies (or loses its network) is free LeaseTTL
	// after its last renewal, by the database's clock. Renewals come every
	// LeaseTTL/4; an owner stops trusting its lease after LeaseTTL/2
	// without a renewal. It is also the connections'
	// idle_in_transaction_session_timeout (unless the URL sets one): a
	// frozen client's transaction, and its locks, end after it. Default
	// 15s.
	LeaseTTL time.Duration

	// tracer, set by tests (export_test.go), traces the statements.
	tracer pgx.QueryTracer
	// noCopy, set by benchmarks (export_test.go), writes units with
	// INSERT only (see flushInserts).
	noCopy bool
}

// Store is a store.Store on a PostgreSQL database.
type Store struct {
	pool *pgxpool.Pool
	opts Options
	// schema is the connection's current schema, which holds the tables;
	// channel is its change notification channel.
	schema, channel string
	// execChannel carries the executors' notifications (remote.go).
	execChannel string

	// seenMu guards seen, the log's last number as this handle last saw
	// it, and other, which says that a commit of another handle came
	// before one of this handle's since Changed last ran.
	seenMu sync.Mutex
	seen   int64
	other  bool

	ownMu sync.Mutex
	own   *ownership // held by this handle, if any

	vac vacuumState // the assignments' vacuum (vacuum.go)
	// careful counts the one-segment transactions still to be written with
	// the read of which ops apply, after a misprediction (see Apply).
	careful atomic.Int32
}

// SchemaVersion is the schema version this package writes.
var SchemaVersion = sqlcommon.SchemaVersion(migrations)

// Open connects to the database at url (a PostgreSQL URL or DSN, as pgx
// takes it) and migrates its schema. A schema newer than this package
// knows gives store.ErrSchemaTooNew.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	if opts.MaxConns <= 0 {
		opts.MaxConns = 10
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = 15 * time.Second
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("runcue: postgres: %w", err)
	}
	cfg.MaxConns = opts.MaxConns
	// A client that stops in the middle of a transaction (a process
	// frozen, a host cut off) would hold its row locks, the log's counter
	// and the lease row among them, until TCP noticed; the server ends
	// such a session after LeaseTTL, so that a standby can take over soon
	// after the lease expires. runcue's own transactions never wait on
	// their client that long.
	if _, ok := cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !ok {
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(opts.LeaseTTL.Milliseconds(), 10)
	}
	if opts.tracer != nil {
		cfg.ConnConfig.Tracer = opts.tracer
	}
	// A connection cut off without a word (a blackhole, a host gone) is
	// found in seconds, not when TCP gives up: keepalives probe an idle
	// one every LeaseTTL/4 and give up after three unanswered probes, and
	// a connection attempt lasts at most LeaseTTL/2 unless the URL says
	// (connect_timeout). Transactions have their deadline too (TxTimeout).
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = opts.LeaseTTL / 2
	}
	dialer := &net.Dialer{Timeout: cfg.ConnConfig.ConnectTimeout, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: max(opts.LeaseTTL/4, time.Second), Interval: max(opts.LeaseTTL/8, time.Second), Count: 3}}
	cfg.ConnConfig.DialFunc = dialer.DialContext
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("runcue: postgres: %w", err)
	}
	s := &Store{pool: pool, opts: opts}
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&s.schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("runcue: postgres: %w", err)
	}
	s.channel, s.execChannel = channelName("runcue_", s.schema), channelName("runcue_x_", s.schema)
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("runcue: postgres: %w", err)
	}
	if _, err := s.Changed(ctx); err != nil { // the log's end as it is now
		pool.Close()
		return nil, fmt.Errorf("runcue: postgres: %w", err)
	}
	return s, nil
}

// migrationLock is the advisory lock key that makes one process at a time
// migrate a schema (with the schema's name: see migrate).
const migrationLock = 0x72756e637565 // "runcue"

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))`, int32(migrationLock&0x7fffffff)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS runcue_schema (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	version := 0
	switch err := tx.QueryRow(ctx, `SELECT version FROM runcue_schema`).Scan(&version); {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := tx.Exec(ctx, `INSERT INTO runcue_schema(version) VALUES (0)`); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	err = sqlcommon.Migrate(migrations, version, func(v int, _, body string) error {
		if _, err := tx.Exec(ctx, body); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE runcue_schema SET version = $1`, v)
		return err
	})
	if err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Close closes the pool. It releases ownership if held.
func (s *Store) Close() error {
	s.ownMu.Lock()
	o := s.own
	s.ownMu.Unlock()
	var err error
	if o != nil {
		err = o.Release()
	}
	s.pool.Close()
	return err
}

// Changed reports whether another handle committed events since the
// previous call: the log's counter moved past what this handle wrote, or
// one of this handle's commits followed another's.
func (s *Store) Changed(ctx context.Context) (bool, error) {
	last, err := s.LastSeq(ctx)
	if err != nil {
		return false, err
	}
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	changed := last > s.seen || s.other
	s.seen, s.other = max(s.seen, last), false
	return changed, nil
}

// noteCommit records a commit of this handle whose events follow follows
// and end at last (see Changed).
func (s *Store) noteCommit(follows, last int64) {
	if last == 0 {
		return
	}
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	if follows > s.seen {
		s.other = true
	}
	s.seen = max(s.seen, last)
}

var _ store.Store = (*Store)(nil)

// The conversions every statement uses.
var ns, tm, nullStr, nullBytes = sqlcommon.Nanos, sqlcommon.Time, sqlcommon.NullString, sqlcommon.NullBytes

// channelName is prefix and schema as a notification channel's name: a
// name is at most 63 bytes (with room for execChannelOf's 9), so a long
// schema's is its hash.
func channelName(prefix, schema string) string {
	if len(prefix)+len(schema) <= 63-9 {
		return prefix + schema
	}
	h := fnv.New64a()
	h.Write([]byte(schema))
	return fmt.Sprintf("%s%016x", prefix, h.Sum64())
}
