//go:build !unix && !windows

package sqlite

import (
	"errors"
	"os"
)

// lockFile: this platform has no file lock runcue knows how to use, so no
// Cue can own a database here (Start returns errors.ErrUnsupported); Cues
// can still open one to submit and inspect work.
func lockFile(f *os.File) error { return errors.ErrUnsupported }

func processAlive(pid int) bool { return true }
