//go:build unix

package runcue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/store/sqlite"
)

func init() {
	childModes["recurring"] = childMode{run: recurringChild}
}

// recurringChild registers the schedules (as a program does at every
// start), owns the database and journals "<schedule> <period> <unit>
// <attempt>" at each handler's start, until killed, or for RUNCUE_LIFE_MS
// and then stops.
func recurringChild(c *runcue.Cue) int {
	j := openJournal()
	must(hoststest.RegisterRecurring(c, func(ctx context.Context, w *runcue.Work) (any, error) {
		line, err := hoststest.RanLine(ctx, c, w)
		if err != nil {
			return nil, err
		}
		return nil, j.line("%s", line)
	}))
	ctx := context.Background()
	must(c.Start(ctx))
	fmt.Println("ready")
	if ms, err := strconv.Atoi(os.Getenv("RUNCUE_LIFE_MS")); err == nil {
		time.Sleep(time.Duration(ms) * time.Millisecond)
		must(c.Stop(ctx))
		must(c.Close())
		return 0
	}
	select {}
}

// TestSchedulesAcrossKills: three schedules of one period a second, for a
// minute, on an owner SIGKILLed every 3-7 s and replaced after 2-5 s
// without one (SQLite). Counted at the handler and in the events: no
// period has two units; every period is handled once, submitted or
// skipped; the periods due while an owner ran are submitted, and every
// unit submitted runs; the periods due while none ran are missed and
// handled as each schedule's policy says (latest: the last of each run
// of missed periods; skip: none; each: the last three).
func TestSchedulesAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes for a minute")
	}
	t.Parallel()
	seed := testSeed(t, "RUNCUE_RECUR_SEED")
	rnd := rand.New(rand.NewPCG(seed, seed^3))
	dir := t.TempDir()
	db, jpath := filepath.Join(dir, "runcue.db"), filepath.Join(dir, "journal")
	env := []string{"RUNCUE_JOURNAL=" + jpath}
	type life struct{ ready, end time.Time }
	var lives []life
	began := time.Now()
	for time.Since(began) < time.Minute {
		cmd, out := child(t, "recurring", db, env...)
		for out.Scan() && out.Text() != "ready" {
		}
		ready := time.Now()
		time.Sleep(3*time.Second + time.Duration(rnd.Int64N(int64(4*time.Second))))
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		lives = append(lives, life{ready, time.Now()})
		t.Logf("owner %d: ready at %v, killed at %v", len(lives), ready.Sub(began).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
		time.Sleep(2*time.Second + time.Duration(rnd.Int64N(int64(3*time.Second))))
	}
	// A last owner runs what is queued and stops.
	cmd, out := child(t, "recurring", db, append(env, "RUNCUE_LIFE_MS=3000")...)
	for out.Scan() && out.Text() != "ready" {
	}
	ready := time.Now()
	require.NoError(t, cmd.Wait())
	lives = append(lives, life{ready, time.Now()})
	t.Logf("%d owners, %d killed", len(lives), len(lives)-1)

	b, err := os.ReadFile(jpath)
	require.NoError(t, err)
	st, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Task("tick", runcue.Task{Handler: noop}))
	var reigns []hoststest.Reign
	for _, l := range lives {
		reigns = append(reigns, hoststest.Reign{From: l.ready, To: l.end})
	}
	hoststest.CheckSchedules(t, c, hoststest.Ran(strings.Split(string(b), "\n")), reigns, nil)
}
