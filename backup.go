package runcue

import (
	"context"
	"fmt"
	"os"

	"github.com/runcue/runcue/store"
)

// Backup writes a consistent copy of the database to path, which must not
// exist yet, while the owner (in this process or another) goes on working.
// The copy opens as a database of its own.
func (c *Cue) Backup(ctx context.Context, path string) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	b, ok := c.st.(store.Backuper)
	if !ok {
		return fmt.Errorf("%w: this store cannot back itself up: use its database's own backup (pg_dump for PostgreSQL)", ErrInvalid)
	}
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%w: %s exists", ErrInvalid, path)
	}
	if err := b.Backup(ctx, path); err != nil {
		return fmt.Errorf("runcue: backup to %s: %w", path, err)
	}
	return nil
}
