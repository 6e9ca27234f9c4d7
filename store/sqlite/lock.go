package sqlite

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/runcue/runcue/store"
)

// fileLock is an operating-system lock on a file next to the database
// (path+".lock"), which the kernel drops when the holding process dies. The
// holder writes a record of itself (store.Holder, JSON) at the start of the
// file, so that a contender can say who holds it, and clears it when it
// releases the lock. On Windows the lock covers a byte past the record
// (lockOffset), because there a locked range cannot be read.
type fileLock struct {
	f      *os.File
	holder store.Holder
}

// errWouldBlock is what lockFile returns when another holder has the lock.
var errWouldBlock = errors.New("lock held")

func acquireLock(path string, h store.Holder, mode fs.FileMode) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, mode)
	if err != nil {
		return nil, fmt.Errorf("runcue: lock %s: %w", path, err)
	}
	if err := lockFile(f); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, errWouldBlock) {
			return nil, &store.LockedError{Holder: holder}
		}
		return nil, fmt.Errorf("runcue: lock %s: %w", path, err)
	}
	if h.PID == 0 {
		h.PID = os.Getpid()
	}
	if h.Host == "" {
		h.Host = hostname
	}
	if h.Since.IsZero() {
		h.Since = time.Now()
	}
	b, _ := json.Marshal(h)
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt(b, 0)
		_ = f.Sync()
	}
	return &fileLock{f: f, holder: h}, nil
}

// readHolder reads the holder record the current owner wrote. The owner
// writes it just after locking, so a contender may briefly find it empty.
func readHolder(f *os.File) store.Holder {
	var h store.Holder
	for range 20 {
		b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<16))
		if err == nil && len(b) > 0 && json.Unmarshal(b, &h) == nil {
			return h
		}
		time.Sleep(5 * time.Millisecond)
	}
	return h
}

func (l *fileLock) Release() error {
	// The record goes first, while the lock is still held; then closing
	// the descriptor drops the lock. The file stays: removing it would race
	// with a contender that has it open.
	_ = l.f.Truncate(0)
	return l.f.Close()
}

// probeHolder tells, without taking the lock, whether some process holds
// it: a holder record is there and names a live process on this host. A
// record naming another host counts as held (its liveness is unknowable
// from here). A record left by a process that died is not a holder.
func probeHolder(path string) (store.Holder, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(b) == 0) {
		return store.Holder{}, false, nil
	}
	if err != nil {
		// A locked range cannot be read on Windows, but the record lies
		// before it; any other failure is reported.
		return store.Holder{}, false, err
	}
	var h store.Holder
	if err := json.Unmarshal(b[:min(len(b), 1<<16)], &h); err != nil || h.PID == 0 {
		return store.Holder{}, false, nil
	}
	if h.Host != hostname {
		return h, true, nil
	}
	return h, processAlive(h.PID), nil
}
