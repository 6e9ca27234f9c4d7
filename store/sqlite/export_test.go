package sqlite

import (
	"context"
	"strconv"
)

// SetUserVersionForTest sets the schema version recorded in the file.
func (s *Store) SetUserVersionForTest(v int) error {
	_, err := s.wconn.ExecContext(context.Background(), "PRAGMA user_version = "+strconv.Itoa(v))
	return err
}
