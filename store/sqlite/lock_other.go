//go:build !unix

package sqlite

import (
	"errors"

	"github.com/runcue/runcue/store"
)

type fileLock struct{ holder store.Holder }

func acquireLock(path string, h store.Holder) (*fileLock, error) {
	return nil, errors.ErrUnsupported
}

func (l *fileLock) Release() error { return nil }
