//go:build unix

package sqlite

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes an flock(2) lock. flock locks belong to the open file
// description, so a second open of the same file conflicts even inside one
// process (unlike fcntl locks).
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errWouldBlock
	}
	return err
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
