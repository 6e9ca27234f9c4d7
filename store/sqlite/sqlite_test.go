package sqlite_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
	"github.com/runcue/runcue/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, func() store.Store) {
		path := filepath.Join(t.TempDir(), "runcue.db")
		st, err := sqlite.Open(path, sqlite.Options{})
		require.NoError(t, err)
		return st, func() store.Store {
			other, err := sqlite.Open(path, sqlite.Options{})
			require.NoError(t, err)
			return other
		}
	})
}

func TestNotADatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notes.txt")
	require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("this is not a database\n", 200)), 0o644))
	_, err := sqlite.Open(path, sqlite.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "not a SQLite database")
}

func TestSchemaTooNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	require.NoError(t, st.Close())
	// Mark the file as written by a future version.
	raw, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	require.NoError(t, raw.SetUserVersionForTest(sqlite.SchemaVersion+1))
	require.NoError(t, raw.Close())
	_, err = sqlite.Open(path, sqlite.Options{})
	assert.ErrorIs(t, err, store.ErrSchemaTooNew)
	assert.Contains(t, err.Error(), path)
}

func TestReopenKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{Synchronous: sqlite.Full})
	require.NoError(t, err)
	_, err = st.Apply(t.Context(), []store.Op{&store.Insert{Units: []*store.Unit{{ID: "a", Task: "t"}}}})
	require.NoError(t, err)
	require.NoError(t, st.Close())
	st, err = sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	u, err := st.GetUnit(t.Context(), "a")
	require.NoError(t, err)
	assert.Equal(t, "t", u.Task)
}

func TestRejectsNonFilePaths(t *testing.T) {
	for _, p := range []string{"", ":memory:", "file:x.db?mode=memory"} {
		_, err := sqlite.Open(p, sqlite.Options{})
		assert.Error(t, err, p)
	}
}
