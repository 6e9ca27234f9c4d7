//go:build unix

package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

func init() {
	childModes["adapt"] = childMode{run: adaptChild}
}

// adaptService is an API limited to 100 requests a second, adaptively.
var adaptService = runcue.Service{RateLimit: 100, RateWindow: time.Second, MaxConcurrent: 8, Adaptive: &runcue.Adaptive{}}

// adaptChild owns the database and runs "call" units that the service
// answers 429 to; it prints "cut <effective rate limit>" for each
// limit_adapted event it receives (events are delivered once stored),
// until killed.
func adaptChild(c *runcue.Cue) int {
	must(c.Service("api", adaptService))
	must(c.Task("call", runcue.Task{Services: []string{"api"}, MaxDeferrals: 1000,
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			time.Sleep(2 * time.Millisecond)
			return nil, runcue.RetryAfter(time.Millisecond, errors.New("429 Too Many Requests"))
		}}))
	ctx := context.Background()
	events := c.Events(ctx)
	must(c.Start(ctx))
	fmt.Println("ready")
	for ev := range events {
		if ev.Type != runcue.EventLimitAdapted || ev.Service == nil || ev.Service.Adaptive == nil {
			continue
		}
		for _, l := range ev.Service.Adaptive.Limits {
			if l.Limit == "requests" {
				fmt.Println("cut", l.Effective)
			}
		}
	}
	return 0
}

// TestAdaptiveLimitAcrossKill: an owner whose service answers 429 cuts
// its adaptive limit, is SIGKILLed after the third cut it announced, and
// the next owner goes on from the limit last stored (at least as low as
// the last announced), not from the configured 100.
func TestAdaptiveLimitAcrossKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a child process")
	}
	db := filepath.Join(t.TempDir(), "runcue.db")
	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	require.NoError(t, c.Service("api", adaptService))
	require.NoError(t, c.Task("call", runcue.Task{Services: []string{"api"}, Handler: noop}))
	_, err = c.SubmitBatch(context.Background(), batchOf("call", 20))
	require.NoError(t, err)
	require.NoError(t, c.Close())

	cmd, out := child(t, "adapt", db)
	var cuts []int64
	for len(cuts) < 3 && out.Scan() {
		if f := strings.Fields(out.Text()); len(f) == 2 && f[0] == "cut" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			cuts = append(cuts, n)
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.Len(t, cuts, 3, "the child announced three cuts")
	t.Logf("cuts announced before the kill: %v", cuts)

	c, err = runcue.Open(db, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("api", adaptService))
	require.NoError(t, c.Task("call", runcue.Task{Services: []string{"api"}, Handler: noop}))
	require.NoError(t, c.PauseQueue(context.Background()))
	require.NoError(t, c.Start(context.Background()))
	l, st := adaptiveLimit(t, c, "api", "requests")
	t.Logf("after the kill: %d of %d, %d 429s", l.Effective, l.Configured, st.Throttled)
	assert.LessOrEqual(t, l.Effective, cuts[2], "restored at or below the last limit announced")
	assert.Less(t, l.Effective, int64(100), "not reset to the ceiling")
	assert.GreaterOrEqual(t, st.Throttled, 3)
}
