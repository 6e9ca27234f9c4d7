package runcuecli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestClassifyDB: keyword connection strings and postgres schemes in any
// case name PostgreSQL; a mistyped scheme is refused, not taken for a
// file's path; a password is never printed.
func TestClassifyDB(t *testing.T) {
	for _, tc := range []struct {
		db   string
		kind dbKind
		as   string
		bad  bool
	}{
		{db: "runcue.db", kind: sqliteFile, as: "runcue.db"},
		{db: "/var/lib/app/runcue.db", kind: sqliteFile, as: "/var/lib/app/runcue.db"},
		{db: "file:runcue.db?mode=ro", kind: sqliteFile, as: "file:runcue.db?mode=ro"},
		{db: "postgres://app:pw@db/app", kind: postgresDB, as: "postgres://app:pw@db/app"},
		{db: "postgresql://db/app", kind: postgresDB, as: "postgresql://db/app"},
		{db: "POSTGRES://app@db/app", kind: postgresDB, as: "postgres://app@db/app"},
		{db: "PostgreSQL://db/app", kind: postgresDB, as: "postgresql://db/app"},
		{db: "host=db user=app password=s3cret dbname=app", kind: postgresDB, as: "host=db user=app password=s3cret dbname=app"},
		{db: " dbname=app", kind: postgresDB, as: " dbname=app"},
		{db: "postgress://app:s3cret@db/app", bad: true},
		{db: "mysql://db/app", bad: true},
	} {
		kind, as, err := classifyDB(tc.db)
		if tc.bad {
			assert.Error(t, err, tc.db)
			if err != nil {
				assert.NotContains(t, err.Error(), "s3cret", "the error prints no password")
			}
			continue
		}
		assert.NoError(t, err, tc.db)
		assert.Equal(t, tc.kind, kind, tc.db)
		assert.Equal(t, tc.as, as, tc.db)
	}
}

// TestPasswordNeverPrinted: whatever fails, the command's error names no
// password of the connection string it was given.
func TestPasswordNeverPrinted(t *testing.T) {
	for _, db := range []string{
		"postgress://app:s3cret@127.0.0.1:1/app",
		"host=127.0.0.1 port=1 user=app password=s3cret dbname=app connect_timeout=1",
		"postgres://app:s3cret@127.0.0.1:1/app?connect_timeout=1",
	} {
		var out, errw bytes.Buffer
		code := Main(Options{Stdout: &out, Stderr: &errw}, []string{"--db", db, "stats"})
		assert.NotZero(t, code, db)
		assert.NotContains(t, errw.String()+out.String(), "s3cret", "%s: %s", db, errw.String())
		assert.True(t, strings.TrimSpace(errw.String()) != "", db)
	}
}
