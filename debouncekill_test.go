//go:build unix

package runcue_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

func init() {
	childModes["debounce-owner"] = childMode{run: debounceOwner}
	childModes["debounce-submit"] = childMode{run: debounceSubmitter}
}

// edit is a debounced submission's params: its key and its number in the
// key's burst.
type edit struct {
	Key string
	Rev int
}

// registerDebounced registers the debounced task "index" (2 s after a
// key's last submission, keyed by Target) with handler h, as every
// process of TestDebounceAcrossKills does.
func registerDebounced(c *runcue.Cue, h runcue.Handler) {
	must(c.Task("index", runcue.Task{Debounce: &runcue.Debounce{Period: 2 * time.Second}, Handler: h}))
}

// debounceOwner owns the database and journals "<key> <unit> <rev>" at
// each handler's start, until killed.
func debounceOwner(c *runcue.Cue) int {
	j := openJournal()
	registerDebounced(c, runcue.Handle(func(ctx context.Context, w *runcue.Work, p edit) (any, error) {
		return nil, j.line("%s %s %d", p.Key, w.ID, p.Rev)
	}))
	must(c.Start(context.Background()))
	fmt.Println("ready")
	select {}
}

// debounceSubmitter submits the plan in RUNCUE_PLAN ("<ms> <key> <rev>"
// lines) at RUNCUE_T0 (Unix ns) plus each line's offset, then exits.
func debounceSubmitter(c *runcue.Cue) int {
	registerDebounced(c, noop)
	t0, err := strconv.ParseInt(os.Getenv("RUNCUE_T0"), 10, 64)
	must(err)
	f, err := os.Open(os.Getenv("RUNCUE_PLAN"))
	must(err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ms, rev int
		var key string
		_, err := fmt.Sscan(sc.Text(), &ms, &key, &rev)
		must(err)
		time.Sleep(time.Until(time.Unix(0, t0).Add(time.Duration(ms) * time.Millisecond)))
		_, err = c.Submit(context.Background(), runcue.Submission{Task: "index", Target: key, Params: edit{key, rev}})
		must(err)
	}
	must(c.Close())
	return 0
}

// TestDebounceAcrossKills: 1,000 submissions over 10 s across 50 keys, a
// burst of 20 per key about 50 ms apart, alternately from this process
// and a child, while the owner (another child) is SIGKILLed in the middle
// and replaced. Per key, exactly one unit runs: the one stored last (the
// highest Seq), with its params; every other ends skipped, replaced by
// the unit stored after it, unless that one was stored only after it had
// started (a submitter stalled for the Period, as on a loaded machine:
// the burst had ended, and the unit rightly ran).
func TestDebounceAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	t.Parallel()
	seed := testSeed(t, "RUNCUE_DEBOUNCE_SEED")
	rnd := rand.New(rand.NewPCG(seed, seed^5))
	dir := t.TempDir()
	db, jpath, plan := filepath.Join(dir, "runcue.db"), filepath.Join(dir, "journal"), filepath.Join(dir, "plan")

	type sub struct {
		ms, rev int
		key     string
	}
	var mine, theirs []sub
	const keys, burst = 50, 20
	for k := range keys {
		key := fmt.Sprintf("doc-%02d", k)
		at := rnd.IntN(8000)
		for i := range burst {
			s := sub{ms: at + i*50 + rnd.IntN(20), rev: i, key: key}
			if i%2 == 0 {
				mine = append(mine, s)
			} else {
				theirs = append(theirs, s)
			}
		}
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i].ms < mine[j].ms })
	sort.Slice(theirs, func(i, j int) bool { return theirs[i].ms < theirs[j].ms })
	var b strings.Builder
	for _, s := range theirs {
		fmt.Fprintf(&b, "%d %s %d\n", s.ms, s.key, s.rev)
	}
	require.NoError(t, os.WriteFile(plan, []byte(b.String()), 0o644))

	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	registerDebounced(c, noop)
	env := []string{"RUNCUE_JOURNAL=" + jpath}
	owner, out := child(t, "debounce-owner", db, env...)
	for out.Scan() && out.Text() != "ready" {
	}
	t0 := time.Now().Add(300 * time.Millisecond)
	submitter, _ := child(t, "debounce-submit", db, "RUNCUE_PLAN="+plan, fmt.Sprintf("RUNCUE_T0=%d", t0.UnixNano()))
	killAt := t0.Add(time.Duration(4000+rnd.IntN(2000)) * time.Millisecond)
	killed := false
	ctx := t.Context()
	for _, s := range mine {
		at := t0.Add(time.Duration(s.ms) * time.Millisecond)
		if !killed && at.After(killAt) {
			time.Sleep(time.Until(killAt))
			require.NoError(t, owner.Process.Signal(syscall.SIGKILL))
			_ = owner.Wait()
			owner, _ = child(t, "debounce-owner", db, env...)
			killed = true
			t.Logf("owner killed %v into the submissions", killAt.Sub(t0).Round(time.Millisecond))
		}
		time.Sleep(time.Until(at))
		_, err := c.Submit(ctx, runcue.Submission{Task: "index", Target: s.key, Params: edit{s.key, s.rev}})
		require.NoError(t, err)
	}
	require.NoError(t, submitter.Wait(), "the second submitter")
	defer func() {
		_ = owner.Process.Signal(syscall.SIGKILL)
		_ = owner.Wait()
	}()

	st, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	deadline := time.Now().Add(time.Minute)
	var units []*store.Unit
	for {
		units, err = st.ListUnits(ctx, store.ListFilter{Tasks: []string{"index"}, Limit: 10_000})
		require.NoError(t, err)
		open := 0
		for _, u := range units {
			if !u.State.Terminal() {
				open++
			}
		}
		if open == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d units not ended", open)
		time.Sleep(100 * time.Millisecond)
	}
	require.Len(t, units, keys*burst)

	byKey := map[string][]*store.Unit{}
	for _, u := range units {
		byKey[u.Target] = append(byKey[u.Target], u)
	}
	ranUnits := map[string]map[string]int{} // key -> unit -> runs journaled
	revOf := map[string]int{}
	data, err := os.ReadFile(jpath)
	require.NoError(t, err)
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var key, id string
		var rev int
		_, err := fmt.Sscan(line, &key, &id, &rev)
		require.NoError(t, err, line)
		if ranUnits[key] == nil {
			ranUnits[key] = map[string]int{}
		}
		ranUnits[key][id]++
		revOf[id] = rev
	}
	// The log's order is the commit order: a unit whose claim (its first
	// work_started) committed before the next submission of its key was
	// stored (its work_queued) was not the holder that insert replaced.
	startedAt, queuedAt := map[string]int64{}, map[string]int64{}
	for _, ev := range storedEvents(t, st) {
		switch ev.Type {
		case store.TypeWorkStarted:
			if _, ok := startedAt[ev.WorkID]; !ok {
				startedAt[ev.WorkID] = ev.Seq
			}
		case store.TypeWorkQueued:
			if _, ok := queuedAt[ev.WorkID]; !ok {
				queuedAt[ev.WorkID] = ev.Seq
			}
		}
	}
	repeats, split := 0, 0
	for key, us := range byKey {
		require.Len(t, us, burst, key)
		sort.Slice(us, func(i, j int) bool { return us[i].Seq < us[j].Seq })
		last := us[len(us)-1]
		ran := map[string]int{last.ID: ranUnits[key][last.ID]}
		for i, u := range us[:len(us)-1] {
			next := us[i+1]
			if s, ok := startedAt[u.ID]; ok && u.State == store.Completed && s < queuedAt[next.ID] {
				// The next submission was stored only after this unit was
				// claimed, a Period after its own submission (the submitter
				// stalled that long, or its insert waited that long for
				// the database, as on a loaded machine around the kill):
				// its burst had ended, and it rightly ran.
				split++
				ran[u.ID] = ranUnits[key][u.ID]
				continue
			}
			assert.Equal(t, store.Skipped, u.State, "%s: %s, stored %d of %d, %v before the next", key, u.ID, i+1, burst,
				next.CreatedAt.Sub(u.CreatedAt))
			assert.Equal(t, "replaced by "+next.ID, u.Error, "%s: %s", key, u.ID)
		}
		assert.Equal(t, store.Completed, last.State, "%s: the last stored runs", key)
		var p edit
		require.NoError(t, json.Unmarshal(last.Params, &p))
		assert.Equal(t, ran, ranUnits[key], "%s: only the last stored ran (and the last of a burst a stall ended)", key)
		assert.Equal(t, p.Rev, revOf[last.ID], "%s: with its params", key)
		if n := ranUnits[key][last.ID]; n > 1 {
			repeats += n - 1 // a run the kill interrupted ran again: at least once
		}
	}
	t.Logf("%d keys, %d units, %d runs repeated after the kill, %d bursts a stall of the submitters split", len(byKey), len(units), repeats, split)
	assert.True(t, killed)
}
