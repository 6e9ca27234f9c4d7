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
	childModes["batch"] = childMode{run: batchChild}
}

// The batch kill test's service: 30,000 tokens and 20 requests in any
// 500ms, 4 calls at once, a 0-5 ms wire (its Margin).
const (
	batchTokens = 30_000
	batchCalls  = 20
	batchWindow = 500 * time.Millisecond
	batchWire   = 5 * time.Millisecond
)

// registerBatched registers the service and the "embed" task, whose
// batches hold at most 100 units or 5,000 tokens, with handler h.
func registerBatched(c *runcue.Cue, h runcue.BatchHandler) {
	must(c.Service("embed", runcue.Service{MaxConcurrent: 4, RateLimit: batchCalls, RateWindow: batchWindow, Margin: batchWire,
		Meters: []runcue.Meter{{Name: "tokens", Limit: batchTokens, Window: batchWindow}}}))
	must(c.Task("embed", runcue.Task{Services: []string{"embed"},
		Retry: runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
		Batch: &runcue.Batch{Max: 100, MaxCost: runcue.Costs{"tokens": 5000}, Wait: 20 * time.Millisecond, Handler: h}}))
}

// batchHash is a hash of parts under the test's salt.
func batchHash(salt string, parts ...any) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, salt)
	fmt.Fprint(h, parts...)
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// batchTokensOf is unit id's cost in tokens: 20 to 100.
func batchTokensOf(salt, id string) int64 { return 20 + int64(batchHash(salt, "tokens/", id)%81) }

// batchChild owns the database and runs "embed" batches: after the
// batch's seeded wire delay it journals the arrival "call <pid> <arrival
// ns> <tokens> <id>,<id>,...", then takes 5-15 ms; one unit in 16 fails
// its first attempt, the others return their ID. Until killed.
func batchChild(c *runcue.Cue) int {
	j := openJournal()
	pid := os.Getpid()
	salt := os.Getenv("RUNCUE_BATCH_SALT")
	registerBatched(c, func(ctx context.Context, ws []*runcue.Work) ([]runcue.Outcome, error) {
		delay := time.Duration(batchHash(salt, "wire/", ws[0].ID, ws[0].Attempt) % uint64(batchWire))
		time.Sleep(delay)
		ids := make([]string, len(ws))
		var tokens int64
		for i, w := range ws {
			ids[i] = w.ID
			tokens += batchTokensOf(salt, w.ID)
		}
		if err := j.line("call %d %d %d %s", pid, ws[0].Started.Add(delay).UnixNano(), tokens, strings.Join(ids, ",")); err != nil {
			return nil, err
		}
		time.Sleep(5*time.Millisecond + time.Duration(rand.IntN(10_000))*time.Microsecond)
		out := make([]runcue.Outcome, len(ws))
		for i, w := range ws {
			if w.Attempt == 1 && batchHash(salt, "fail/", w.ID)%16 == 0 {
				out[i].Err = errors.New("transient")
			} else {
				out[i].Result = w.ID
			}
		}
		return out, nil
	})
	must(c.Start(context.Background()))
	fmt.Println("ready")
	select {}
}

// TestBatchAcrossKills: 10,000 units of 20-100 tokens, in batches of at
// most 100 units or 5,000 tokens, the owner SIGKILLed twice while they
// run. Counted at the service (each batch's arrival, after a 0-5 ms
// wire): no 500ms holds more than 30,000 tokens or 20 calls; no batch
// holds more than 100 units or 5,000 tokens; every unit completes with its
// own result, its completion recorded once (a unit may run again after a
// kill, as any unit whose end was not committed does).
func TestBatchAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	t.Parallel()
	seed := testSeed(t, "RUNCUE_BATCH_SEED")
	rnd := rand.New(rand.NewPCG(seed, seed^11))
	dir := t.TempDir()
	db, jpath := filepath.Join(dir, "runcue.db"), filepath.Join(dir, "journal")
	salt := strconv.FormatUint(seed, 10)
	env := []string{"RUNCUE_JOURNAL=" + jpath, "RUNCUE_BATCH_SALT=" + salt}

	const units = 10_000
	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	registerBatched(c, func(context.Context, []*runcue.Work) ([]runcue.Outcome, error) { return nil, nil })
	subs := make([]runcue.Submission, units)
	for i := range subs {
		id := fmt.Sprintf("u%05d", i)
		subs[i] = runcue.Submission{ID: id, Task: "embed", Cost: runcue.Costs{"tokens": batchTokensOf(salt, id)}}
	}
	ctx := t.Context()
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)

	owner, out := child(t, "batch", db, env...)
	for out.Scan() && out.Text() != "ready" {
	}
	for k := range 2 {
		time.Sleep(time.Duration(1000+rnd.IntN(2000)) * time.Millisecond)
		require.NoError(t, owner.Process.Signal(syscall.SIGKILL))
		_ = owner.Wait()
		t.Logf("owner %d killed", k+1)
		owner, out = child(t, "batch", db, env...)
		for out.Scan() && out.Text() != "ready" {
		}
	}
	defer func() {
		_ = owner.Process.Signal(syscall.SIGKILL)
		_ = owner.Wait()
	}()

	st, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		s, err := c.Stats(ctx)
		require.NoError(t, err)
		if s.States[runcue.StateCompleted] == units {
			break
		}
		require.True(t, time.Now().Before(deadline), "units not completed: %v", s.States)
		time.Sleep(50 * time.Millisecond)
	}

	data, err := os.ReadFile(jpath)
	require.NoError(t, err)
	type call struct {
		at     int64
		tokens int64
	}
	var calls []call
	ran := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var pid, ids string
		var c call
		_, err := fmt.Sscanf(line, "call %s %d %d %s", &pid, &c.at, &c.tokens, &ids)
		require.NoError(t, err, line)
		batch := strings.Split(ids, ",")
		assert.LessOrEqual(t, len(batch), 100, "units in a batch")
		assert.LessOrEqual(t, c.tokens, int64(5000), "tokens in a batch")
		for _, id := range batch {
			ran[id]++
		}
		calls = append(calls, c)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].at < calls[j].at })
	mostCalls, mostTokens := 0, int64(0)
	for i := range calls {
		var sum int64
		n := 0
		for j := i; j < len(calls) && calls[j].at-calls[i].at < int64(batchWindow); j++ {
			sum += calls[j].tokens
			n++
		}
		mostCalls, mostTokens = max(mostCalls, n), max(mostTokens, sum)
	}
	assert.LessOrEqual(t, mostTokens, int64(batchTokens), "tokens arriving in a window")
	assert.LessOrEqual(t, mostCalls, batchCalls, "calls arriving in a window")

	completions := completionsOf(t, ctx, st)
	got, err := st.ListUnits(ctx, store.ListFilter{Limit: units})
	require.NoError(t, err)
	require.Len(t, got, units)
	again := 0
	for _, u := range got {
		assert.Equal(t, 1, completions[u.ID], "%s: completions recorded", u.ID)
		assert.JSONEq(t, strconv.Quote(u.ID), string(u.Result), u.ID)
		if ran[u.ID] > 1 && batchHash(salt, "fail/", u.ID)%16 != 0 {
			again++
		}
		assert.Positive(t, ran[u.ID], u.ID)
	}
	t.Logf("seed %d: %d calls for %d units; at arrival, at most %d tokens (limit %d) and %d calls (limit %d) in any %v; %d units ran again after a kill",
		seed, len(calls), units, mostTokens, batchTokens, mostCalls, batchCalls, batchWindow, again)
}
