package store

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"
)

// Fault says what a store error means for the Cue that got it.
type Fault int

// The faults, from the most to the least severe.
const (
	// Fatal: retrying cannot help (a full disk, a corrupt file, a schema
	// newer than this binary, a permission refused). The Cue stops
	// dispatching and reports the error by its name.
	Fatal Fault = iota
	// Flaky: an error that usually clears (SQLite's SQLITE_IOERR) but may
	// also be a failing disk. It is retried a bounded number of times in
	// a row, then taken as Fatal.
	Flaky
	// Transient: the database is unreachable or busy for now (a refused,
	// reset or dropped connection, a server shutting down or starting,
	// a primary that became a replica, a serialization failure, a lock
	// held elsewhere). It is retried until it clears.
	Transient
)

func (f Fault) String() string {
	switch f {
	case Transient:
		return "transient"
	case Flaky:
		return "flaky"
	}
	return "fatal"
}

// Classifier is implemented by a store that can tell its own errors apart
// (its driver's codes). FaultOf asks it first.
type Classifier interface {
	// Fault classifies err, an error of one of the store's methods. ok
	// false leaves err to the generic rules of FaultOf.
	Fault(err error) (f Fault, ok bool)
}

// FaultOf classifies err, an error returned by a method of st: st's own
// rules first (Classifier), then the rules every backend shares: a
// deadline or a network error (refused, reset, broken pipe, timed out, an
// unexpected end of the stream) is Transient; ErrSchemaTooNew, and
// anything else, Fatal.
func FaultOf(st Store, err error) Fault {
	if err == nil {
		return Transient
	}
	if c, ok := st.(Classifier); ok {
		if f, ok := c.Fault(err); ok {
			return f
		}
	}
	return GenericFault(err)
}

// GenericFault is FaultOf's rules shared by every backend (see FaultOf).
func GenericFault(err error) Fault {
	var unknown *UnknownCommitError
	switch {
	case errors.As(err, &unknown):
		return Transient
	case errors.Is(err, ErrSchemaTooNew), errors.Is(err, ErrRewound):
		return Fatal
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH):
		return Transient
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Transient
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return Transient // dial, read or write on the network failed
	}
	return Fatal
}

// UnknownCommitError is Apply's error when the transaction's COMMIT was
// sent but its answer lost (the connection dropped): the batch may or may
// not be stored. Nothing of the batch may be applied again until Resolve
// says it was not stored.
type UnknownCommitError struct {
	// Err is the error that cut the connection.
	Err error
	// Batch is what Apply would have returned had the COMMIT's answer
	// arrived: the results, event numbers included, of a transaction that
	// did commit.
	Batch Batch
	// Resolve asks the database whether the transaction committed. It
	// answers committed or not, or an error when the database could not
	// tell yet (unreachable: ask again later); a database that proves it
	// lost committed history (a rewind) gives an error of Fault Fatal
	// (ErrRewound).
	Resolve func(ctx context.Context) (committed bool, err error)
}

func (e *UnknownCommitError) Error() string {
	return "runcue: the commit's outcome is unknown (the connection was lost after COMMIT): " + e.Err.Error()
}

func (e *UnknownCommitError) Unwrap() error { return e.Err }

// ErrRewound: the database is behind what this process already saw
// committed (restored from a backup, or a lagging asynchronous replica
// promoted). Ownership epochs and event numbers may then be handed out
// twice; runcue refuses to go on. Its Fault is Fatal.
var ErrRewound = errors.New("runcue: the database went back in time (a lossy failover or a restore): it lost commits this process saw")

// TxTimeouter is implemented by a store whose transactions the Cue's
// writer bounds: a connection cut off without a word (a blackhole) then
// fails the transaction in TxTimeout, not when TCP gives up minutes later.
// Transactions that time out in a row get twice the time each, up to 8
// times TxTimeout, so that a slow database still makes progress.
type TxTimeouter interface {
	TxTimeout() time.Duration
}
