package postgres_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store/postgres"
	"github.com/runcue/runcue/store/storetest"
)

// TestMigrateFromSchema4 loads a database written by schema version 4
// (testdata/schema4.sql, dumped by testdata/mkschema4 with the runcue of
// that schema) and checks the migration to the questions table
// (storetest.CheckQuestionsMigrated).
func TestMigrateFromSchema4(t *testing.T) {
	u := loadFixture(t, "schema4.sql")
	st, err := postgres.Open(t.Context(), u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	assert.GreaterOrEqual(t, postgres.SchemaVersion, 5)
	storetest.CheckQuestionsMigrated(t, st)
}

// TestMigrateFromSchema5 loads a database written by schema version 5
// (testdata/schema5.sql, dumped by testdata/mkschema5 with the runcue of
// that schema) and checks the migration to debounce keys
// (storetest.CheckDebounceMigrated).
func TestMigrateFromSchema5(t *testing.T) {
	u := loadFixture(t, "schema5.sql")
	st, err := postgres.Open(t.Context(), u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	assert.GreaterOrEqual(t, postgres.SchemaVersion, 6)
	storetest.CheckDebounceMigrated(t, st)
}
