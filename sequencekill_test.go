//go:build unix

package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
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
	childModes["sequence"] = childMode{run: sequenceChild}
}

// registerSequenced registers TestSequenceAcrossKills's tasks: "held"
// (HoldOnFailure) and "goes-on", three attempts each, with handler h.
func registerSequenced(c *runcue.Cue, h runcue.Handler) {
	retry := runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond}
	must(c.Task("held", runcue.Task{Sequence: &runcue.Sequence{HoldOnFailure: true}, Retry: retry, Handler: h}))
	must(c.Task("goes-on", runcue.Task{Sequence: &runcue.Sequence{}, Retry: retry, Handler: h}))
}

// seqFails says whether attempt of unit id fails: a quarter of the first
// three attempts do (so about one unit in 64 fails for good); a retried
// unit's later attempts do not.
func seqFails(id string, attempt int) bool {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%d", os.Getenv("RUNCUE_SEQ_SALT"), id, attempt)
	x := h.Sum64() // mixed (splitmix64's finalizer): FNV's last byte reaches few bits
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return attempt <= 3 && x%4 == 0
}

// sequenceChild owns the database and journals "start|end <pid> <key>
// <unit> <attempt>" around each run (5-15 ms), until killed.
func sequenceChild(c *runcue.Cue) int {
	j := openJournal()
	pid := os.Getpid()
	registerSequenced(c, func(ctx context.Context, w *runcue.Work) (any, error) {
		if err := j.line("start %d %s %s %d", pid, w.Target, w.ID, w.Attempt); err != nil {
			return nil, err
		}
		time.Sleep(5*time.Millisecond + time.Duration(rand.IntN(10_000))*time.Microsecond)
		var err error
		if seqFails(w.ID, w.Attempt) {
			err = errors.New("transient")
		}
		return nil, errors.Join(err, j.line("end %d %s %s %d", pid, w.Target, w.ID, w.Attempt))
	})
	must(c.Start(context.Background()))
	fmt.Println("ready")
	select {}
}

// TestSequenceAcrossKills: 20 keys x 50 units, a quarter of the first
// three attempts failing (retried after a backoff; about one unit in 64
// fails for good), the owner SIGKILLed twice while they run. Per key,
// counted at the handlers: the units first start in submission order and
// never two run at once; under HoldOnFailure (keys 0-9) no unit starts
// after a failure of its key until the failed unit is retried (this test
// retries them), and every unit completes; otherwise (keys 10-19) the
// next goes on and every unit ends completed or failed.
func TestSequenceAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	t.Parallel()
	seed := testSeed(t, "RUNCUE_SEQUENCE_SEED")
	rnd := rand.New(rand.NewPCG(seed, seed^7))
	dir := t.TempDir()
	db, jpath := filepath.Join(dir, "runcue.db"), filepath.Join(dir, "journal")
	env := []string{"RUNCUE_JOURNAL=" + jpath, fmt.Sprintf("RUNCUE_SEQ_SALT=%d", seed)}

	const keys, per = 20, 50
	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	registerSequenced(c, noop)
	want := map[string][]string{}
	var subs []runcue.Submission
	for i := range per {
		for k := range keys {
			key, task := fmt.Sprintf("key-%02d", k), "goes-on"
			if k < keys/2 {
				task = "held"
			}
			id := fmt.Sprintf("%s-%02d", key, i)
			subs = append(subs, runcue.Submission{ID: id, Task: task, Target: key})
			want[key] = append(want[key], id)
		}
	}
	ctx := t.Context()
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)

	owner, out := child(t, "sequence", db, env...)
	for out.Scan() && out.Text() != "ready" {
	}
	for k := range 2 {
		time.Sleep(time.Duration(200+rnd.IntN(300)) * time.Millisecond)
		require.NoError(t, owner.Process.Signal(syscall.SIGKILL))
		_ = owner.Wait()
		t.Logf("owner %d killed", k+1)
		owner, out = child(t, "sequence", db, env...)
		for out.Scan() && out.Text() != "ready" {
		}
	}
	defer func() {
		_ = owner.Process.Signal(syscall.SIGKILL)
		_ = owner.Wait()
	}()

	// Until every held key's units completed and every other unit ended:
	// retry the held keys' failures as they come.
	st, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	retried := map[string]bool{}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		units, err := st.ListUnits(ctx, store.ListFilter{Limit: 10_000})
		require.NoError(t, err)
		done := true
		for _, u := range units {
			switch {
			case u.State == store.Failed && u.Task == "held" && !retried[u.ID]:
				retried[u.ID] = true
				require.NoError(t, c.Retry(ctx, u.ID))
				done = false
			case u.State == store.Failed && u.Task == "held":
				t.Fatalf("%s failed again after its retry: %s", u.ID, u.Error)
			case !u.State.Terminal():
				done = false
			}
		}
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "units not ended")
		time.Sleep(50 * time.Millisecond)
	}

	data, err := os.ReadFile(jpath)
	require.NoError(t, err)
	// Per owner life (a PID), per key: never two runs at once, and once a
	// unit started after another, the other does not start again (runs
	// repeat only after a kill: a unit whose end was not committed).
	running := map[string]string{} // key -> the unit running, in the current life
	lastOf := map[string]string{}  // key -> the unit started last, in the current life
	before := map[string]bool{}    // unit -> a later unit of its key started after it, in the current life
	firsts := map[string][]string{}
	firstAt, lastAt := map[string]int{}, map[string]int{}
	keyOf := map[string]string{}
	lastPID := ""
	overlaps, starts := 0, 0
	for n, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var kind, pid, key, id string
		var attempt int
		_, err := fmt.Sscan(line, &kind, &pid, &key, &id, &attempt)
		require.NoError(t, err, line)
		if pid != lastPID {
			clear(running) // the previous owner died with its runs
			clear(lastOf)
			clear(before)
			lastPID = pid
		}
		if kind == "end" {
			if running[key] == id {
				delete(running, key)
			}
			continue
		}
		starts++
		if r, ok := running[key]; ok {
			overlaps++
			t.Errorf("%s: %s started while %s ran", key, id, r)
		}
		running[key] = id
		if before[id] {
			t.Errorf("%s: %s started again after a later unit of its key", key, id)
		}
		if l, ok := lastOf[key]; ok && l != id {
			before[l] = true
		}
		lastOf[key] = id
		if _, ok := firstAt[id]; !ok {
			firstAt[id] = n
			firsts[key] = append(firsts[key], id)
		}
		lastAt[id], keyOf[id] = n, key
	}
	// A held key's failure, retried here, kept every other unit of the
	// key from starting until its retry did.
	for f := range retried {
		for _, g := range want[keyOf[f]] {
			if g != f && firstAt[g] > firstAt[f] && firstAt[g] < lastAt[f] {
				t.Errorf("%s started while %s had failed and held its key", g, f)
			}
		}
	}
	assert.Zero(t, overlaps)
	for key, ids := range want {
		assert.Equal(t, ids, firsts[key], "%s: first starts in submission order", key)
	}
	units, err := st.ListUnits(ctx, store.ListFilter{Limit: 10_000})
	require.NoError(t, err)
	failed := 0
	for _, u := range units {
		if u.Task == "held" {
			assert.Equal(t, store.Completed, u.State, u.ID)
		} else if u.State == store.Failed {
			failed++
		}
	}
	t.Logf("%d starts; %d held failures retried; %d units of the other keys failed for good", starts, len(retried), failed)
}
