//go:build unix

package sqlite

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/runcue/runcue/store"
)

// fileLock is an flock(2) lock on a file next to the database. flock locks
// belong to the open file description, so a second open of the same file
// conflicts even inside one process (unlike fcntl locks), and the kernel
// drops the lock when the process dies.
type fileLock struct {
	f      *os.File
	holder store.Holder
}

func acquireLock(path string, h store.Holder) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("runcue: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
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
	// Closing the descriptor drops the flock. The file stays: removing it
	// would race with a contender that has it open.
	return l.f.Close()
}
