// Package sqlite is runcue's SQLite backend, built on modernc.org/sqlite (pure
// Go, no cgo).
//
// A Store keeps one writer connection, which runs every Apply in a single
// BEGIN IMMEDIATE transaction, and a separate pool of read-only connections.
// The database is in WAL mode, so reads never wait for the writer. Several
// processes may open the same file; SQLite serializes their writes.
//
// runcue.Open uses it with the default Options. Open a Store yourself for
// other options, and hand it to runcue.New:
//
//	st, err := sqlite.Open("work.db", sqlite.Options{Synchronous: sqlite.Full})
//	...
//	cue, err := runcue.New(st, runcue.Config{})
//	...
//	defer st.Close() // after cue.Close
//
// Options is the type to read first. Errors are classified for the Cue by
// Store.Fault (see store.Classifier): SQLITE_BUSY is transient,
// SQLITE_IOERR flaky, a full disk or a corrupt file fatal.
package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Synchronous is SQLite's synchronous setting for the WAL.
type Synchronous uint8

const (
	// Normal syncs the WAL only at checkpoints. A committed transaction
	// survives the crash of the process but may be lost if the operating
	// system crashes or the machine loses power before the next checkpoint.
	// The database is never corrupted.
	Normal Synchronous = iota
	// Full syncs the WAL at every commit: a committed transaction survives
	// power loss. Commits cost one fsync each (group commit shares it).
	Full
)

func (s Synchronous) pragma() string {
	if s == Full {
		return "FULL"
	}
	return "NORMAL"
}

// Options configure a Store. The zero value is valid.
type Options struct {
	// Synchronous is the durability setting. Default Normal.
	Synchronous Synchronous
	// ReadConns is the size of the read pool. Default 4.
	ReadConns int
	// BusyTimeout is how long a connection waits for another process's lock
	// before failing. Default 10s.
	BusyTimeout time.Duration
	// FileMode is the permission of a database file Open creates, and of
	// its lock file (SQLite gives its -wal and -shm files the database
	// file's). An existing file keeps its own. The process's umask applies.
	// Default 0600: work units carry their params and results.
	FileMode fs.FileMode
}

// Store is a store.Store on a SQLite file.
type Store struct {
	path  string
	mode  fs.FileMode
	write *sql.DB   // exactly one connection, pinned by wconn
	wconn *sql.Conn // the writer connection, used through Raw
	read  *sql.DB

	// stmts are prepared on the writer's driver connection and live as long
	// as it does; only the writer goroutine uses them (inside wconn.Raw).
	stmts map[string]driver.Stmt
	// boxes holds the strings that repeat from statement to statement
	// (event types, task names, states) as interface values, so that
	// binding them does not allocate each time (see txn.box). Writer-owned,
	// like stmts.
	boxes map[string]any
	// pending is the writer's buffer of the transaction's events, written
	// at commit as blocks (flushEvents) by enc; recorded says, by pending's
	// index, which are in their unit's record already; records gathers the
	// others' entries (see unitRecords). All reused from transaction to
	// transaction; writer-owned, like stmts.
	pending  []store.Event
	recorded []bool
	enc      store.BlockEncoder
	records  unitRecords
	// finishStmts and insertStmts are a Finish's and a unit's INSERT's
	// statements by form (finishSQL, insertSQL).
	finishStmts map[finishForm]string
	insertStmts map[insertForm]string

	dataVersion int64

	lockMu sync.Mutex
	lock   *fileLock
}

// SchemaVersion is the schema version this package writes.
var SchemaVersion = sqlcommon.SchemaVersion(migrations)

// Open opens or creates the database at path and migrates its schema. A file
// that is not a SQLite database gives an error naming path; a schema newer
// than this package knows gives store.ErrSchemaTooNew.
func Open(path string, opts Options) (*Store, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, fmt.Errorf("runcue: sqlite: %q: a plain file path is required", path)
	}
	if opts.ReadConns <= 0 {
		opts.ReadConns = 4
	}
	if opts.BusyTimeout <= 0 {
		opts.BusyTimeout = 10 * time.Second
	}
	if opts.FileMode == 0 {
		opts.FileMode = 0o600
	}
	if opts.FileMode&^fs.ModePerm != 0 {
		return nil, fmt.Errorf("runcue: sqlite: FileMode %v has bits other than permissions", opts.FileMode)
	}
	// Create a new database file with its mode (SQLite would use 0644), and
	// say plainly when its directory is missing.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, opts.FileMode)
	switch {
	case err == nil:
		f.Close()
	case errors.Is(err, fs.ErrExist):
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("runcue: open %s: the directory %s does not exist", path, filepath.Dir(path))
	default:
		return nil, fmt.Errorf("runcue: open %s: %w", path, err)
	}
	s := &Store{path: path, mode: opts.FileMode, stmts: make(map[string]driver.Stmt), boxes: make(map[string]any)}
	s.write, err = sql.Open("sqlite", dsn(path, opts, false))
	if err != nil {
		return nil, fmt.Errorf("runcue: open %s: %w", path, err)
	}
	s.write.SetMaxOpenConns(1)
	s.write.SetMaxIdleConns(1)
	s.write.SetConnMaxLifetime(0)
	s.write.SetConnMaxIdleTime(0)
	if err := s.migrate(context.Background()); err != nil {
		s.write.Close()
		if errors.Is(err, store.ErrSchemaTooNew) {
			return nil, fmt.Errorf("runcue: open %s: %w", path, err)
		}
		return nil, fmt.Errorf("runcue: open %s: %w", path, describe(err))
	}
	if s.wconn, err = s.write.Conn(context.Background()); err != nil {
		s.write.Close()
		return nil, fmt.Errorf("runcue: open %s: %w", path, err)
	}
	s.read, err = sql.Open("sqlite", dsn(path, opts, true))
	if err != nil {
		s.wconn.Close()
		s.write.Close()
		return nil, fmt.Errorf("runcue: open %s: %w", path, err)
	}
	s.read.SetMaxOpenConns(opts.ReadConns)
	s.read.SetMaxIdleConns(opts.ReadConns)
	if _, err := s.Changed(context.Background()); err != nil { // prime data_version
		s.Close()
		return nil, fmt.Errorf("runcue: open %s: %w", path, err)
	}
	return s, nil
}

func dsn(path string, opts Options, readOnly bool) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(opts.BusyTimeout.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+opts.Synchronous.pragma()+")")
	q.Add("_pragma", "foreign_keys(0)")
	if readOnly {
		q.Add("_pragma", "query_only(1)")
	} else {
		q.Set("_txlock", "immediate")
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// describe turns SQLite's "file is not a database" into a clearer message.
func describe(err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_NOTADB {
		return fmt.Errorf("not a SQLite database: %w", err)
	}
	return err
}

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.write.BeginTx(ctx, nil) // BEGIN IMMEDIATE: one migrator at a time
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var version int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return err
	}
	err = sqlcommon.Migrate(migrations, version, func(v int, _, body string) error {
		if _, err := tx.ExecContext(ctx, body); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "PRAGMA user_version = "+strconv.Itoa(v))
		return err
	})
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	return s.convertEvents(ctx)
}

// Path returns the database file's path.
func (s *Store) Path() string { return s.path }

// Close closes the database. It releases ownership if held.
func (s *Store) Close() error {
	s.lockMu.Lock()
	if s.lock != nil {
		s.lock.Release()
		s.lock = nil
	}
	s.lockMu.Unlock()
	var errs []error
	if s.wconn != nil {
		errs = append(errs, s.wconn.Raw(func(any) error {
			for _, st := range s.stmts {
				st.Close()
			}
			s.stmts = nil
			return nil
		}))
		errs = append(errs, s.wconn.Close())
	}
	if s.read != nil {
		errs = append(errs, s.read.Close())
	}
	errs = append(errs, s.write.Close())
	return errors.Join(errs...)
}

// Changed reports whether another connection committed since the last call,
// using PRAGMA data_version on the writer connection.
func (s *Store) Changed(ctx context.Context) (bool, error) {
	var v int64
	err := s.wconn.Raw(func(dc any) error {
		t := &txn{s: s, ctx: ctx, dc: dc.(driverConn)}
		row, ok, err := t.one("PRAGMA data_version")
		if err == nil && ok {
			v = asInt(row[0])
		}
		return err
	})
	if err != nil {
		return false, err
	}
	changed := v != s.dataVersion
	s.dataVersion = v
	return changed, nil
}

// Acquire takes ownership with an advisory lock on path+".lock", which the
// operating system releases when the process dies, and moves the owner
// epoch on. The lock being free proves every earlier holder's process dead
// (Ownership.PreviousDead).
func (s *Store) Acquire(ctx context.Context, h store.Holder) (store.Ownership, error) {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	if s.lock != nil {
		return nil, &store.LockedError{Holder: s.lock.holder}
	}
	l, err := acquireLock(s.path+".lock", h, s.mode)
	if err != nil {
		return nil, err
	}
	epoch, err := s.nextEpoch(ctx, h)
	if err != nil {
		l.Release()
		return nil, err
	}
	s.lock = l
	return &ownership{s: s, l: l, epoch: epoch, dead: true}, nil
}

// TakeOver takes ownership whether or not another holder has it: it moves
// the owner epoch on, so that every later write of the previous owner
// fails with store.ErrNotOwner, and that owner's runs are recovered only
// once their leases expire (it may still be alive: PreviousDead is
// false). It is for an operator who knows the holder is stuck, and for
// tests of fencing. It takes the lock file too when it is free.
func (s *Store) TakeOver(ctx context.Context, h store.Holder) (store.Ownership, error) {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	var l *fileLock
	if s.lock == nil {
		l, _ = acquireLock(s.path+".lock", h, s.mode)
	}
	epoch, err := s.nextEpoch(ctx, h)
	if err != nil {
		if l != nil {
			l.Release()
		}
		return nil, err
	}
	if l != nil {
		s.lock = l
	}
	return &ownership{s: s, l: l, epoch: epoch}, nil
}

// nextEpoch moves the stored owner epoch on for h and returns it.
func (s *Store) nextEpoch(ctx context.Context, h store.Holder) (int64, error) {
	// Through the writer's own statements, inside Raw and read to their
	// end: read through database/sql's QueryRow, the RETURNING statement's
	// rows stayed open between calls, a transaction of the writer could
	// start on the connection meanwhile, and its SAVEPOINT or COMMIT failed
	// with "SQL statements in progress" (TestAcquireBesideWrites).
	var epoch int64
	err := s.wconn.Raw(func(dc any) error {
		t := &txn{s: s, ctx: ctx, dc: dc.(driverConn)}
		row, ok, err := t.one(`UPDATE owner_epoch SET epoch = epoch + 1, holder = ? WHERE id = 1 RETURNING epoch`, h.Owner)
		if err == nil && !ok {
			err = errors.New("no owner_epoch row")
		}
		if err == nil {
			epoch = asInt(row[0])
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("runcue: take ownership: %w", err)
	}
	return epoch, nil
}

// Owner reports, without taking the lock, whether a process owns the
// database, and its holder record. Taking the lock to find out, even
// briefly, could make a concurrent Acquire fail. A record left by a process
// that died does not count; one naming another host does.
func (s *Store) Owner(ctx context.Context) (store.Holder, bool, error) {
	s.lockMu.Lock()
	l := s.lock
	s.lockMu.Unlock()
	if l != nil {
		return l.holder, true, nil
	}
	return probeHolder(s.path + ".lock")
}

type ownership struct {
	s     *Store
	l     *fileLock // nil: a TakeOver without the lock
	epoch int64
	dead  bool
	once  sync.Once
}

func (o *ownership) Epoch() int64       { return o.epoch }
func (o *ownership) PreviousDead() bool { return o.dead }

func (o *ownership) Release() error {
	var err error
	o.once.Do(func() {
		if o.l == nil {
			return
		}
		o.s.lockMu.Lock()
		if o.s.lock == o.l {
			o.s.lock = nil
		}
		o.s.lockMu.Unlock()
		err = o.l.Release()
	})
	return err
}

// driverConn is what the writer needs of modernc's connection.
type driverConn interface {
	driver.ConnPrepareContext
	driver.ConnBeginTx
}

// prepare returns query prepared on dc, preparing it on first use.
func (s *Store) prepare(ctx context.Context, dc driverConn, query string) (driver.Stmt, error) {
	if st, ok := s.stmts[query]; ok {
		return st, nil
	}
	if s.stmts == nil {
		return nil, errors.New("runcue: sqlite: store closed")
	}
	st, err := dc.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.stmts[query] = st
	return st, nil
}

var _ store.Store = (*Store)(nil)

// The conversions every statement uses.
var ns, tm, nullStr, nullBytes = sqlcommon.Nanos, sqlcommon.Time, sqlcommon.NullString, sqlcommon.NullBytes

func isUnique(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && (se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
}

// hostname is cached for lock holder records.
var hostname = func() string {
	h, _ := os.Hostname()
	return h
}()
