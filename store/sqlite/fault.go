package sqlite

import (
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/runcue/runcue/store"
)

// Fault implements store.Classifier: what a SQLite error means for the
// Cue (see the table in docs/resilience.md).
//
// Transient: SQLITE_BUSY and SQLITE_LOCKED past the busy timeout (another
// process holds the write lock: a long transaction, a backup, a shell),
// SQLITE_PROTOCOL (a lock race in WAL mode). Flaky, retried a bounded
// number of times: SQLITE_IOERR (a network file system's hiccup, or a
// failing disk). Fatal: SQLITE_FULL (disk full), SQLITE_CORRUPT and
// SQLITE_NOTADB, SQLITE_PERM, SQLITE_READONLY and SQLITE_CANTOPEN (the
// file's permissions or its directory changed), and everything else.
func (s *Store) Fault(err error) (store.Fault, bool) {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return 0, false
	}
	switch se.Code() & 0xff { // the primary code of an extended one
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_PROTOCOL:
		return store.Transient, true
	case sqlite3.SQLITE_IOERR:
		return store.Flaky, true
	}
	return store.Fatal, true
}
