package sqlite_test

import (
	"testing"

	"github.com/runcue/runcue/store/storetest"
)

// TestMigrateFromSchema14 opens a database written by schema version 14
// (testdata/schema14.db, written by testdata/mkschema14 with the runcue of
// that schema) and checks the migration to the questions table
// (storetest.CheckQuestionsMigrated).
func TestMigrateFromSchema14(t *testing.T) {
	st := openFixture(t, "schema14.db")
	assertMigrated(t, st, 15)
	storetest.CheckQuestionsMigrated(t, st)
}

// TestMigrateFromSchema15 opens a database written by schema version 15
// (testdata/schema15.db, written by testdata/mkschema15 with the runcue of
// that schema) and checks the migration to debounce keys
// (storetest.CheckDebounceMigrated).
func TestMigrateFromSchema15(t *testing.T) {
	st := openFixture(t, "schema15.db")
	assertMigrated(t, st, 16)
	storetest.CheckDebounceMigrated(t, st)
}
