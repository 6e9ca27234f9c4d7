package sqlite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

func TestFileModeAndMissingDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	own, err := st.Acquire(t.Context(), store.Holder{Owner: "me"})
	require.NoError(t, err)
	for _, p := range []string{path, path + ".lock"} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s: new files are private by default", p)
	}
	require.NoError(t, own.Release())
	require.NoError(t, st.Close())

	shared := filepath.Join(dir, "shared.db")
	st, err = sqlite.Open(shared, sqlite.Options{FileMode: 0o640})
	require.NoError(t, err)
	require.NoError(t, st.Close())
	fi, err := os.Stat(shared)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), fi.Mode().Perm()&0o640)

	missing := filepath.Join(dir, "no", "such", "dir", "runcue.db")
	_, err = sqlite.Open(missing, sqlite.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the directory "+filepath.Join(dir, "no", "such", "dir")+" does not exist")
}

// TestOwnerProbe: Owner says whether a process holds the database without
// taking the lock; a record left by a dead process does not count.
func TestOwnerProbe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	other, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer other.Close()
	_, owned, err := other.Owner(t.Context())
	require.NoError(t, err)
	assert.False(t, owned, "no lock file yet")
	own, err := st.Acquire(t.Context(), store.Holder{Owner: "me"})
	require.NoError(t, err)
	h, owned, err := other.Owner(t.Context())
	require.NoError(t, err)
	assert.True(t, owned)
	assert.Equal(t, os.Getpid(), h.PID)
	assert.Equal(t, "me", h.Owner)
	// Probing took nothing: the owner can release and another take over.
	require.NoError(t, own.Release())
	_, owned, err = other.Owner(t.Context())
	require.NoError(t, err)
	assert.False(t, owned, "released: the record is cleared")
	own2, err := other.Acquire(t.Context(), store.Holder{Owner: "next"})
	require.NoError(t, err)
	require.NoError(t, own2.Release())

	// A record left by a process that died.
	dead := exec.Command(os.Args[0], "-test.run=^$")
	require.NoError(t, dead.Run())
	b, _ := json.Marshal(store.Holder{Owner: "gone", PID: dead.Process.Pid, Host: hostname(t)})
	require.NoError(t, os.WriteFile(path+".lock", b, 0o600))
	_, owned, err = other.Owner(t.Context())
	require.NoError(t, err)
	assert.False(t, owned, "a dead holder's record does not count")
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	require.NoError(t, err)
	return h
}

// TestMigrateFromSchema2 opens a database written by schema version 2
// (testdata/schema2.db, committed) and checks that the migration keeps its
// units, dependencies and events, and builds the event ranges that
// filtered reads use from the events already stored.
func TestMigrateFromSchema2(t *testing.T) {
	st := openFixture(t, "schema2.db")
	ctx := t.Context()
	for id, want := range map[string]store.State{"done-1": store.Completed, "done-2": store.Completed, "queued-1": store.Queued, "queued-2": store.Queued} {
		u, err := st.GetUnit(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, want, u.State, id)
	}
	u, err := st.GetUnit(ctx, "queued-2")
	require.NoError(t, err)
	assert.Equal(t, []string{"queued-1"}, u.DependsOn)
	n, err := st.QueuedCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	evs, err := st.MatchingEvents(ctx, store.EventQuery{After: 0, Upto: 1 << 40, Tasks: []string{"a"}, Types: []string{"work_completed"}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.Equal(t, "done-1", evs[0].WorkID)
	version, err := sqlite.SchemaVersionOf(ctx, st)
	require.NoError(t, err)
	assert.Equal(t, sqlite.SchemaVersion, version)
	idx, err := sqlite.IndexesForTest(ctx, st, "event_ranges")
	require.NoError(t, err)
	assert.Subset(t, idx, []string{"event_ranges_type", "event_ranges_task"}, "the ranges of the old events were built")
	none, err := st.MatchingEvents(ctx, store.EventQuery{After: 0, Upto: 1 << 40, Tasks: []string{"nothing"}})
	require.NoError(t, err)
	assert.Empty(t, none)
}

// TestMigrateFromSchema3 opens a database written by schema version 3
// (testdata/schema3.db, committed; testdata/mkschema3 wrote it with the
// runcue of that schema) and checks that the migration to the skipped
// state keeps every unit as it was, and leaves skipped units out of the
// index of open units as it leaves out completed ones.
func TestMigrateFromSchema3(t *testing.T) {
	st := openFixture(t, "schema3.db")
	ctx := t.Context()
	want := map[string]store.State{
		"done-1": store.Completed, "failed-1": store.Failed, "dep-of-failed": store.Failed,
		"queued-1": store.Queued, "queued-2": store.Queued, "cancelled-1": store.Cancelled,
	}
	all, err := st.ListUnits(ctx, store.ListFilter{Limit: 100})
	require.NoError(t, err)
	got := map[string]store.State{}
	for _, u := range all {
		got[u.ID] = u.State
	}
	assert.Equal(t, want, got)
	u, err := st.GetUnit(ctx, "queued-2")
	require.NoError(t, err)
	assert.Equal(t, []string{"queued-1", "done-1"}, u.DependsOn)
	u, err = st.GetUnit(ctx, "dep-of-failed")
	require.NoError(t, err)
	assert.Equal(t, "prerequisite_failed", u.ErrorKind)
	u, err = st.GetUnit(ctx, "done-1")
	require.NoError(t, err)
	assert.JSONEq(t, `{"t":"ok"}`, string(u.Result))
	n, err := st.QueuedCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assertMigrated(t, st, 4)
	q, err := sqlite.IndexSQLForTest(ctx, st, "work_units_open")
	require.NoError(t, err)
	assert.Contains(t, q, "'skipped'")
}

// openFixture opens a copy of the committed database testdata/name (the
// fixture itself stays as the old schema wrote it).
func openFixture(t *testing.T, name string) *sqlite.Store {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// TestMigrateFromSchema4 opens a database written by schema version 4
// (testdata/schema4.db, written by testdata/mkschema4 with the runcue of
// that schema) and checks that the migration to pausable tasks keeps every
// unit, service record and task as it was, with nothing paused but what
// was.
func TestMigrateFromSchema4(t *testing.T) {
	st := openFixture(t, "schema4.db")
	ctx := t.Context()
	all, err := st.ListUnits(ctx, store.ListFilter{Limit: 100})
	require.NoError(t, err)
	got := map[string]store.State{}
	for _, u := range all {
		got[u.ID] = u.State
	}
	assert.Equal(t, map[string]store.State{
		"done-1": store.Completed, "skipped-1": store.Skipped, "failed-1": store.Failed, "dep-of-failed": store.Failed,
		"queued-1": store.Queued, "queued-2": store.Queued, "cancelled-1": store.Cancelled,
	}, got)
	u, err := st.GetUnit(ctx, "queued-2")
	require.NoError(t, err)
	assert.Equal(t, []string{"queued-1", "skipped-1"}, u.DependsOn)
	u, err = st.GetUnit(ctx, "skipped-1")
	require.NoError(t, err)
	assert.Equal(t, "not modified", u.Error)
	n, err := st.QueuedCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	tasks, err := st.Tasks(ctx)
	require.NoError(t, err)
	assert.Len(t, tasks, 2)
	svcs, err := st.Services(ctx)
	require.NoError(t, err)
	paused := map[string]bool{}
	for _, r := range svcs {
		paused[r.Name] = r.Paused
	}
	assert.Equal(t, map[string]bool{"api": false, "api:slow": true}, paused)
	p, err := st.Pauses(ctx)
	require.NoError(t, err)
	assert.Equal(t, store.Pauses{}, p)
	assertMigrated(t, st, 5)
	log, err := st.ServiceLog(ctx, "api", time.Time{})
	require.NoError(t, err)
	assert.Len(t, log, 3, "the budgeted service's dispatches, logged")
}

// TestMigrateFromSchema5 opens a database written by schema version 5
// (testdata/schema5.db, written by testdata/mkschema5 with the runcue of
// that schema) and checks that the migration to kept counts keeps every
// unit and pause, and counts the units already stored.
func TestMigrateFromSchema5(t *testing.T) {
	st := openFixture(t, "schema5.db")
	ctx := t.Context()
	counts, err := st.Counts(ctx)
	require.NoError(t, err)
	assert.ElementsMatch(t, []store.UnitCount{
		{Task: "a", State: store.Cancelled, N: 1}, {Task: "a", State: store.Completed, N: 1}, {Task: "a", State: store.Failed, N: 1},
		{Task: "a", State: store.Queued, N: 1}, {Task: "a", State: store.Skipped, N: 1},
		{Task: "b", State: store.Failed, N: 1}, {Task: "b", State: store.Queued, N: 1},
	}, counts)
	p, err := st.Pauses(ctx)
	require.NoError(t, err)
	assert.Equal(t, store.Pauses{Queue: true, Tasks: []string{"b"}}, p)
	u, err := st.GetUnit(ctx, "queued-2")
	require.NoError(t, err)
	assert.Equal(t, []string{"queued-1", "skipped-1"}, u.DependsOn)
	oldest, ok, err := st.OldestQueued(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, oldest.Equal(u.CreatedAt) || oldest.Before(u.CreatedAt))
	acts, err := st.Activity(ctx, time.Time{})
	require.NoError(t, err)
	assert.Empty(t, acts, "activity starts with the migration")
	assertMigrated(t, st, 6)
}

// TestMigrateFromSchema6 opens a database written by schema version 6
// (testdata/schema6.db, written by testdata/mkschema6 with the runcue of
// that schema) and checks that the migration to durable subscriptions
// keeps every unit, count, pause and event, with no subscription yet.
func TestMigrateFromSchema6(t *testing.T) {
	st := openFixture(t, "schema6.db")
	ctx := t.Context()
	counts, err := st.Counts(ctx)
	require.NoError(t, err)
	n := 0
	for _, c := range counts {
		n += c.N
	}
	assert.Equal(t, 7, n, "the kept counts of the seven units")
	p, err := st.Pauses(ctx)
	require.NoError(t, err)
	assert.Equal(t, store.Pauses{Queue: true, Tasks: []string{"b"}}, p)
	last, err := st.LastSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(18), last)
	subs, err := st.Subscriptions(ctx)
	require.NoError(t, err)
	assert.Empty(t, subs)
	assertMigrated(t, st, 7)
}

// TestMigrateFromSchema7 opens a database written by schema version 7
// (testdata/schema7.db, written by testdata/mkschema7 with the runcue of
// that schema) and checks that the migration to events with targets keeps
// every event (without a target) and the durable subscription.
func TestMigrateFromSchema7(t *testing.T) {
	st := openFixture(t, "schema7.db")
	ctx := t.Context()
	evs, err := st.EventsAfter(ctx, 0, 1000)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	for _, ev := range evs {
		assert.Empty(t, ev.Target, "stored before targets were")
	}
	subs, err := st.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	assert.Equal(t, "follow", subs[0].Name)
	assert.Equal(t, int64(5), subs[0].Acked)
	n, err := st.QueuedCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assertMigrated(t, st, 8)
}

// TestMigrateFromSchema8 opens a database written by schema version 8
// (testdata/schema8.db, written by testdata/mkschema8 with the runcue of
// that schema) and checks that the index of events by unit finds each
// unit's events, in order, after the migration.
func TestMigrateFromSchema8(t *testing.T) {
	st := openFixture(t, "schema8.db")
	ctx := t.Context()
	evs, err := st.MatchingEvents(ctx, store.EventQuery{WorkID: "done-1", Upto: 1 << 62})
	require.NoError(t, err)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.Type+":"+ev.Target)
	}
	assert.Equal(t, []string{"work_queued:ok", "work_started:ok", "work_completed:ok"}, got)
	evs, err = st.MatchingEvents(ctx, store.EventQuery{WorkID: "dep-of-failed", Upto: 1 << 62, Types: []string{"work_failed"}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.Equal(t, int64(11), evs[0].Seq)
	subs, err := st.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	n, err := st.QueuedCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assertMigrated(t, st, 9)
}

// TestMigrateFromSchema9 opens a database written by schema version 9
// (testdata/schema9.db, written by testdata/mkschema9 with the runcue of
// that schema): its durable subscription keeps its position and has no
// filter (it passes nothing), and a filter can be stored on it.
func TestMigrateFromSchema9(t *testing.T) {
	st := openFixture(t, "schema9.db")
	ctx := t.Context()
	subs, err := st.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	assert.Equal(t, "follow", subs[0].Name)
	assert.Equal(t, int64(5), subs[0].Acked)
	assert.Empty(t, subs[0].Types)
	assert.Empty(t, subs[0].Tasks)
	res, err := st.Apply(ctx, []store.Op{&store.Ack{Name: "follow", SetFilter: true, Types: []string{"work_completed"}}})
	require.NoError(t, err)
	require.True(t, res.Results[0].Applied)
	subs, err = st.Subscriptions(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"work_completed"}, subs[0].Types)
	u, err := st.GetUnit(ctx, "long-target")
	require.NoError(t, err)
	assert.Len(t, u.Target, 20<<10, "stored before targets were bounded, read back whole")
	n, err := st.QueuedCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 8, n)
	assertMigrated(t, st, 10)
}

// TestMigrateFromSchema10 opens a database written by schema version 10
// (testdata/schema10.db, written by testdata/mkschema10 with the runcue of
// that schema; its owner died mid-run): the starts logged before count one
// request each, the keyed instance's circuit is its circuit meter's state,
// the unit left running has epoch 0 (older than any owner's), and the
// first Acquire takes epoch 1.
func TestMigrateFromSchema10(t *testing.T) {
	st := openFixture(t, "schema10.db")
	ctx := t.Context()
	log, err := st.ServiceLog(ctx, "api", time.Time{})
	require.NoError(t, err)
	require.Len(t, log, 4, "done-1, done-2, failed-1, running-1")
	for _, l := range log {
		assert.Equal(t, store.MeterRequests, l.Meter)
		assert.Equal(t, int64(1), l.Amount)
		assert.False(t, l.Reconciled)
	}
	svcs, err := st.Services(ctx)
	require.NoError(t, err)
	byName := map[string]store.ServiceRecord{}
	for _, r := range svcs {
		byName[r.Name] = r
	}
	cr, ok := store.DecodeCircuitRecord(byName["host:example.org"].Meters[store.MeterCircuit])
	require.True(t, ok, "the circuit_state row moved to meter_state: %v", byName)
	assert.Equal(t, "open", cr.State)
	assert.NotEmpty(t, byName["api"].Def)
	running, err := st.GetUnit(ctx, "running-1")
	require.NoError(t, err)
	assert.Equal(t, store.Running, running.State)
	assert.Zero(t, running.Epoch)
	assert.Nil(t, running.Costs)
	own, err := st.Acquire(ctx, store.Holder{Owner: "next"})
	require.NoError(t, err)
	defer own.Release()
	assert.Equal(t, int64(1), own.Epoch())
	assert.True(t, own.PreviousDead(), "the lock was free: its holder is dead")
	b, err := st.Apply(ctx, []store.Op{&store.Recover{Epoch: own.Epoch(), At: time.Now(), PreviousDead: true}})
	require.NoError(t, err)
	assert.Equal(t, []string{"running-1"}, b.Results[0].IDs)
	assertMigrated(t, st, 11)
}

// assertMigrated checks that st was migrated to this package's schema,
// which is at least version atLeast.
func assertMigrated(t *testing.T, st *sqlite.Store, atLeast int) {
	t.Helper()
	version, err := sqlite.SchemaVersionOf(t.Context(), st)
	require.NoError(t, err)
	assert.Equal(t, sqlite.SchemaVersion, version)
	assert.GreaterOrEqual(t, version, atLeast)
}

// TestEventReadsUseKeys: blocks are read from a sequence number on
// through the table's key, and a unit's record through its ID, never by
// walking the log.
func TestEventReadsUseKeys(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "plan.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	plan, err := sqlite.QueryPlanForTest(t.Context(), st, sqlite.BlocksFromQuery)
	require.NoError(t, err)
	assert.Contains(t, plan, "SEARCH event_blocks USING INTEGER PRIMARY KEY (rowid>?)", plan)
	plan, err = sqlite.QueryPlanForTest(t.Context(), st, sqlite.UnitRecordQuery)
	require.NoError(t, err)
	assert.Contains(t, plan, "work_units_id", plan)
}

// TestOpenUnitQueriesUseIndex: the queries of active units that run at a
// start or on the submit path find them through the open-units partial
// index, so a long history of finished units is never walked.
func TestOpenUnitQueriesUseIndex(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "plan.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	for name, q := range sqlite.OpenUnitQueries {
		plan, err := sqlite.QueryPlanForTest(context.Background(), st, q)
		require.NoError(t, err, name)
		assert.Contains(t, plan, "work_units_open", "%s: %s", name, plan)
	}
}

// TestAcquireBesideWrites: moving the owner epoch while the writer
// applies batches leaves no statement open between them. (The epoch's
// UPDATE ... RETURNING was read through database/sql's QueryRow, whose open
// rows let a transaction of the writer start on the same connection
// meanwhile, and fail with "SQL statements in progress":
// TestFollowUpsAcrossKills' children, about 1 run in 30.)
func TestAcquireBesideWrites(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "r.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	stop := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, err := st.Apply(t.Context(), []store.Op{&store.Insert{At: time.Now(), Units: []*store.Unit{
				{ID: fmt.Sprintf("u%d", i), Task: "t", IdempotencyKey: fmt.Sprintf("k%d", i)}}}})
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	for range 300 {
		own, err := st.Acquire(t.Context(), store.Holder{Owner: "me"})
		require.NoError(t, err)
		own.Release()
	}
	close(stop)
	require.NoError(t, <-errs)
}
