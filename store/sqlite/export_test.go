package sqlite

import "strconv"

// SetUserVersionForTest sets the schema version recorded in the file.
func (s *Store) SetUserVersionForTest(v int) error {
	_, err := s.write.Exec("PRAGMA user_version = " + strconv.Itoa(v))
	return err
}
