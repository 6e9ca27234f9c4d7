package sqlite_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// schema11Golden is testdata/schema11-events.json: the event log of
// testdata/schema11.db as schema 11 read it back (mkschema11).
type schema11Golden struct {
	First, Last int64
	Events      []store.Event
}

func loadSchema11Golden(t *testing.T) schema11Golden {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "schema11-events.json"))
	require.NoError(t, err)
	var g schema11Golden
	require.NoError(t, json.Unmarshal(b, &g))
	require.NotEmpty(t, g.Events)
	return g
}

// assertSameEvents compares events read back with the golden ones, field
// by field (times by instant).
func assertSameEvents(t *testing.T, want, got []store.Event, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		w, g := want[i], got[i]
		assert.True(t, w.Time.Equal(g.Time), "%s: event %d (seq %d): time %v, want %v", what, i, w.Seq, g.Time, w.Time)
		w.Time, g.Time = time.Time{}, time.Time{}
		assert.Equal(t, w, g, "%s: event %d", what, i)
	}
}

func filterEvents(evs []store.Event, keep func(store.Event) bool) []store.Event {
	var out []store.Event
	for _, e := range evs {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// checkSchema11Log checks that st's log is the fixture's, read every way:
// the whole log, a cursor in the middle, a filtered subscription's read, a
// unit's events (one with hundreds of runs), the last event of a type, the sequence numbers' ends,
// and numbering after them.
func checkSchema11Log(t *testing.T, st *sqlite.Store, g schema11Golden) {
	t.Helper()
	ctx := t.Context()
	all, err := st.EventsAfter(ctx, 0, 1<<20)
	require.NoError(t, err)
	assertSameEvents(t, g.Events, all, "EventsAfter(0)")
	mid := g.Events[len(g.Events)/2].Seq
	evs, err := st.EventsAfter(ctx, mid, 25)
	require.NoError(t, err)
	assertSameEvents(t, filterEvents(g.Events, func(e store.Event) bool { return e.Seq > mid })[:25], evs, "EventsAfter(mid)")
	evs, err = st.MatchingEvents(ctx, store.EventQuery{Upto: g.Last, Types: []string{"work_completed"}, Tasks: []string{"a"}})
	require.NoError(t, err)
	assertSameEvents(t, filterEvents(g.Events, func(e store.Event) bool { return e.Type == "work_completed" && e.Task == "a" }), evs, "completed a")
	for _, id := range []string{"done-07", "flaky-1", "after-bad"} {
		evs, err = st.MatchingEvents(ctx, store.EventQuery{Upto: g.Last, WorkID: id, Limit: 10000})
		require.NoError(t, err)
		assertSameEvents(t, filterEvents(g.Events, func(e store.Event) bool { return e.WorkID == id }), evs, id)
	}
	last, ok, err := st.LastOfTypes(ctx, []string{"work_failed"})
	require.NoError(t, err)
	require.True(t, ok)
	fails := filterEvents(g.Events, func(e store.Event) bool { return e.Type == "work_failed" })
	assertSameEvents(t, fails[len(fails)-1:], []store.Event{last}, "LastOfTypes")
	first, err := st.FirstSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, g.First, first)
	lastSeq, err := st.LastSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, g.Last, lastSeq)
	b, err := st.Apply(ctx, []store.Op{&store.AppendEvent{Event: store.Event{Type: "note", Time: time.Now()}}})
	require.NoError(t, err)
	assert.Equal(t, g.Last+1, b.Results[0].Events[0].Seq, "numbers continue after the converted log's")
	subs, err := st.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	assert.Equal(t, []string{"work_completed"}, subs[0].Types)
}

// TestMigrateFromSchema11 opens a database written by schema version 11
// (testdata/schema11.db, written by testdata/mkschema11 with the runcue of
// that schema, with the log it read back in testdata/schema11-events.json):
// its events, converted into blocks, read back as they did, every way.
func TestMigrateFromSchema11(t *testing.T) {
	st := openFixture(t, "schema11.db")
	checkSchema11Log(t, st, loadSchema11Golden(t))
	assertMigrated(t, st, 12)
}

// TestMigrateFromSchema11Resumes stops the conversion after a few chunks,
// as a kill would, then opens the database again: the conversion resumes
// where it stopped and the log is the fixture's, nothing lost or doubled.
func TestMigrateFromSchema11Resumes(t *testing.T) {
	g := loadSchema11Golden(t)
	b, err := os.ReadFile(filepath.Join("testdata", "schema11.db"))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "schema11.db")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	restore := sqlite.SetConvertForTest(50, 3)
	_, err = sqlite.Open(path, sqlite.Options{})
	restore()
	require.ErrorContains(t, err, "halted for the test")
	restore = sqlite.SetConvertForTest(70, 0)
	defer restore()
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	checkSchema11Log(t, st, g)
}

// TestUnitEventsPastRecord: a unit with more events than its record holds
// (store.MaxUnitRecord) has them all read back, in order, among other
// units' events, from any cursor, filtered, limited, and after retention
// cut its oldest.
func TestUnitEventsPastRecord(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "r.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	ctx := t.Context()
	at := time.Unix(1_700_000_000, 0)
	var mine []store.Event
	for batch := range 60 {
		var ops []store.Op
		for i := range 12 {
			typ := "tick"
			if i%3 == 0 {
				typ = "tock"
			}
			ops = append(ops, &store.AppendEvent{Event: store.Event{Type: typ, WorkID: "busy", Task: "t", Time: at}},
				&store.AppendEvent{Event: store.Event{Type: "tick", WorkID: "other", Task: "t", Time: at}})
		}
		if batch == 0 {
			ops = append(ops, &store.Insert{At: at, Units: []*store.Unit{{ID: "busy", Task: "t"}}})
		}
		b, err := st.Apply(ctx, ops)
		require.NoError(t, err)
		for _, r := range b.Results {
			for _, e := range r.Events {
				if e.WorkID == "busy" {
					mine = append(mine, e)
				}
			}
		}
		at = at.Add(time.Second)
	}
	rec, err := sqlite.UnitRecordForTest(ctx, st, "busy")
	require.NoError(t, err)
	require.True(t, store.UnitRecordFull(len(rec)), "the record is full (%d bytes for %d events)", len(rec), len(mine))
	last, err := st.LastSeq(ctx)
	require.NoError(t, err)
	read := func(q store.EventQuery) []store.Event {
		q.WorkID, q.Upto = "busy", last
		evs, err := st.MatchingEvents(ctx, q)
		require.NoError(t, err)
		return evs
	}
	for i := range mine {
		mine[i].Detail = nil
	}
	assertSameEvents(t, mine, read(store.EventQuery{Limit: 10000}), "all")
	assertSameEvents(t, mine[500:], read(store.EventQuery{After: mine[499].Seq, Limit: 10000}), "after 500")
	assertSameEvents(t, mine[100:130], read(store.EventQuery{After: mine[99].Seq, Limit: 30}), "30 after 100")
	assertSameEvents(t, filterEvents(mine, func(e store.Event) bool { return e.Type == "tock" }),
		read(store.EventQuery{Types: []string{"tock"}, Limit: 10000}), "tocks")
	// Retention cuts the log in the middle of a commit's block.
	cut := mine[300].Seq
	_, err = st.Apply(ctx, []store.Op{&store.Prune{EventsBefore: mine[300].Time.Add(time.Nanosecond)}})
	require.NoError(t, err)
	first, err := st.FirstSeq(ctx)
	require.NoError(t, err)
	require.Greater(t, first, cut)
	assertSameEvents(t, filterEvents(mine, func(e store.Event) bool { return e.Seq >= first }), read(store.EventQuery{Limit: 10000}), "after retention")
}

// TestLastOfTypesAcrossBlocks: the last event of a type is found when its
// range spans many blocks (as a log migrated from before per-commit
// ranges has) and the later blocks of the range hold none of it.
func TestLastOfTypesAcrossBlocks(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "r.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	ctx := t.Context()
	at := time.Unix(1_700_000_000, 0)
	var want store.Event
	for i := range 50 {
		typ := "tick"
		if i == 10 {
			typ = "rare"
		}
		b, err := st.Apply(ctx, []store.Op{&store.AppendEvent{Event: store.Event{Type: typ, Time: at}},
			&store.AppendEvent{Event: store.Event{Type: "tock", Time: at}}})
		require.NoError(t, err)
		if i == 10 {
			want = b.Results[0].Events[0]
		}
	}
	// One range over the whole log, as migration 0003 wrote for old logs.
	require.NoError(t, sqlite.ExecForTest(ctx, st, `DELETE FROM event_ranges WHERE type = 'rare'`))
	require.NoError(t, sqlite.ExecForTest(ctx, st, `INSERT INTO event_ranges(task, type, first, last) VALUES('', 'rare', 1, 100)`))
	got, ok, err := st.LastOfTypes(ctx, []string{"rare"})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, want.Seq, got.Seq)
	assert.Equal(t, "rare", got.Type)
}

// TestPruneEventsLimitSaysMore: a retention pass limited to fewer events
// than are due says so (More), and passes repeated while it does delete
// every block due: one-event blocks, and a commit too large for one block
// (two blocks under one event range, so the ranges' own limit does not
// say More for it).
func TestPruneEventsLimitSaysMore(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "r.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	ctx := t.Context()
	at := time.Unix(1_700_000_000, 0)
	total := 0
	for _, n := range []int{1, store.MaxBlockEvents + 1, 1} {
		ops := make([]store.Op, n)
		for i := range ops {
			ops[i] = &store.AppendEvent{Event: store.Event{Type: "tick", Time: at}}
		}
		_, err := st.Apply(ctx, ops)
		require.NoError(t, err)
		total += n
		at = at.Add(time.Second)
	}
	passes := 0
	for {
		b, err := st.Apply(ctx, []store.Op{&store.Prune{EventsBefore: at, Limit: 2}})
		require.NoError(t, err)
		passes++
		if !b.Results[0].More {
			break
		}
		require.Less(t, passes, 10)
	}
	first, err := st.FirstSeq(ctx)
	require.NoError(t, err)
	assert.Zero(t, first, "every event was due")
	last, err := st.LastSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(total), last, "numbers continue after the pruned ones")
}
