//go:build unix

package runcue_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/sqlite"
)

func init() {
	childModes["tokens"] = childMode{config: func(cfg *runcue.Config) { cfg.PollInterval = 20 * time.Millisecond }, run: tokensChild}
}

// Token meters as the service counts them, across kills: each call
// reserves its estimate (stored with the unit at submit), uses a part of
// it, and reports what it used when it returns.
const (
	tokenLimit  = 3000
	tokenWindow = time.Second
)

// tokensUsed is what a call of unit id uses of its estimate est: from
// half of it to all of it, fixed by the unit.
func tokensUsed(id string, est int64) int64 {
	h := fnv.New64a()
	fmt.Fprint(h, id)
	return est/2 + int64(h.Sum64()%uint64(est/2+1))
}

func registerTokenService(c *runcue.Cue) {
	must(c.Service("llm", runcue.Service{MaxConcurrent: 8, Meters: []runcue.Meter{{Name: "tokens", Limit: tokenLimit, Window: tokenWindow}}}))
}

// tokensChild owns the database and runs "gen" units, journalling
// "llm <start ns> <id> <attempt>" before each request is "sent" and
// "used <id> <attempt> <tokens>" when it returns, until drained.
func tokensChild(c *runcue.Cue) int {
	j := openJournal()
	registerTokenService(c)
	must(c.Task("gen", runcue.Task{Services: []string{"llm"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		if err := j.line("llm %d %s %d", w.Started.UnixNano(), w.ID, w.Attempt); err != nil {
			return nil, err
		}
		time.Sleep(time.Duration(20+rand.IntN(180)) * time.Millisecond) // the response streams
		var est struct {
			Est int64 `json:"est"`
		}
		must(w.Bind(&est))
		used := tokensUsed(w.ID, est.Est)
		if err := j.line("used %s %d %d", w.ID, w.Attempt, used); err != nil {
			return nil, err
		}
		w.Used(runcue.Costs{"tokens": used})
		return nil, nil
	}}))
	return runToDrain(c)
}

// TestTokenMeterAcrossKills: a meter of 3,000 tokens per second, 160 calls
// estimated at 50-400 tokens each (stored at submit) that use half to all
// of it and report it, submitted in one batch; the owner killed with
// SIGKILL four times. At the service, which counts each call at its
// arrival (start plus a seeded 0-5 ms) at what it used (its estimate if
// the kill came first: the call was sent, its use unknown), no second holds
// more than 3,000 tokens, and every unit completes once.
func TestTokenMeterAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	// Waits on rate windows mostly (a quarter of a core): it runs beside
	// the suite's other kill tests.
	t.Parallel()
	seed := testSeed(t, "RUNCUE_TOKENS_SEED")
	rnd := rand.New(rand.NewPCG(seed, seed^11))
	dir := t.TempDir()
	db, jpath := filepath.Join(dir, "runcue.db"), filepath.Join(dir, "journal")
	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	registerTokenService(c)
	require.NoError(t, c.Task("gen", runcue.Task{Services: []string{"llm"}, Handler: noop}))
	est := map[string]int64{}
	subs := make([]runcue.Submission, 160)
	for i := range subs {
		id := fmt.Sprintf("g%03d", i)
		est[id] = 50 + rnd.Int64N(351)
		subs[i] = runcue.Submission{ID: id, Task: "gen", Params: map[string]int64{"est": est[id]}, Cost: runcue.Costs{"tokens": est[id]}}
	}
	_, err = c.SubmitBatch(context.Background(), subs)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	env := []string{"RUNCUE_JOURNAL=" + jpath}
	killLoop(t, rnd, "tokens", db, 0, 4, 800*time.Millisecond, 1500*time.Millisecond, 0, env...)
	runToEnd(t, "tokens", db, 3*time.Minute, env...)

	type key struct {
		id      string
		attempt int
	}
	used := map[key]int64{}
	var sent []key
	starts := map[key]time.Time{}
	for _, f := range readJournal(t, jpath) {
		switch {
		case len(f) == 4 && f[0] == "llm":
			ns, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			a, err := strconv.Atoi(f[3])
			require.NoError(t, err)
			k := key{f[2], a}
			sent = append(sent, k)
			starts[k] = time.Unix(0, ns)
		case len(f) == 4 && f[0] == "used":
			a, err := strconv.Atoi(f[2])
			require.NoError(t, err)
			n, err := strconv.ParseInt(f[3], 10, 64)
			require.NoError(t, err)
			used[key{f[1], a}] = n
		}
	}
	var calls []call
	interrupted := 0
	for _, k := range sent {
		n, ok := used[k]
		if !ok {
			n, interrupted = est[k.id], interrupted+1
		}
		calls = append(calls, call{arrival(seed, k.id, k.attempt, starts[k]), n, k.id})
	}
	busiest, at := busiestWindowOf(calls, tokenWindow)
	t.Logf("%d calls (%d cut by a kill), busiest %v at the service: %d tokens from %v", len(calls), interrupted, tokenWindow,
		busiest, at.Format("15:04:05.000"))
	assert.LessOrEqual(t, busiest, int64(tokenLimit))

	st, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	ids := make([]string, len(subs))
	for i, s := range subs {
		ids[i] = s.ID
	}
	assert.Equal(t, len(ids), completedOnce(t, st, ids), "every unit completed once")
}
