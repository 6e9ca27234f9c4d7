//go:build unix

package postgres_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/store/postgres"
)

// A schedules failover test's process runs recurringMain instead of the
// tests.
func init() {
	if os.Getenv("RUNCUE_PG_CHILD") == "recurring" {
		recurringMain() // never returns
	}
}

// recurringMain is a standby Cue (LeaseTTL failoverTTL) that registers
// the schedules of hoststest.RecurPolicies and prints each handler's
// hoststest.RanLine and its takeovers' hoststest.TakenLine, until killed
// or sent SIGTERM.
func recurringMain() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("RUNCUE_PG_URL"), postgres.Options{LeaseTTL: failoverTTL})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		os.Exit(2)
	}
	c, err := runcue.New(st, runcue.Config{Standby: true, PollInterval: 20 * time.Millisecond, LeaseBuffer: 500 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: new:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	err = hoststest.RegisterRecurring(c, func(ctx context.Context, w *runcue.Work) (any, error) {
		line, err := hoststest.RanLine(ctx, c, w)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(out, line)
		return nil, out.Flush()
	})
	// Its takeovers, as it sees them: a loaded owner may lose its lease
	// and an owner take it again, unseen by the test.
	var taken <-chan runcue.Event
	if err == nil {
		taken, _, err = c.Subscribe(ctx, runcue.SubscribeOptions{After: runcue.SeqNow, Types: []runcue.EventType{runcue.EventOwnershipTaken}})
	}
	if err == nil {
		go func() {
			for ev := range taken {
				mu.Lock()
				fmt.Fprintln(out, hoststest.TakenLine(ev.Time))
				_ = out.Flush()
				mu.Unlock()
			}
		}()
		err = c.Start(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	c.Close()
	st.Close()
	os.Exit(0)
}

// recurChild is a recurringMain process and the lines it printed.
type recurChild struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func startRecurring(t *testing.T, url string) *recurChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RUNCUE_PG_CHILD=recurring", "RUNCUE_PG_URL="+url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	ch := &recurChild{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(ch.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.mu.Lock()
			ch.lines = append(ch.lines, sc.Text())
			ch.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return ch
}

// TestSchedulesAcrossFailover: three schedules of one period a second,
// for a minute, run by an owner and a standby in other processes; the
// owner is SIGKILLed every 3-7 s after it took over, and a new standby
// started each time. The standby takes over once the dead owner's lease
// (1 s) ends. hoststest.CheckSchedules checks, in the events and at the
// handlers: no period has two units or records; the periods due while an
// owner ran were submitted on time and ran (the owners print their
// takeovers: one the test did not cause, a loaded owner's lease lost and
// taken again, may make a period missed); the periods due between two
// owners are missed and handled as each schedule's policy says.
func TestSchedulesAcrossFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: kills schedulers for a minute")
	}
	t.Parallel()
	seed := rand.Uint64()
	if s := os.Getenv("RUNCUE_RECUR_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (RUNCUE_RECUR_SEED repeats it)", seed)
	rnd := rand.New(rand.NewPCG(seed, 11))
	url := schemaURL(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, url, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()

	children := []*recurChild{startRecurring(t, url), startRecurring(t, url)}
	var reigns []hoststest.Reign
	began := time.Now()
	for time.Since(began) < time.Minute {
		var pid int
		waitFor(t, "an owner", func() bool { pid = ownerPID(t, st); return pid != 0 })
		reigns = append(reigns, hoststest.Reign{From: time.Now()})
		time.Sleep(3*time.Second + time.Duration(rnd.Int64N(int64(4*time.Second))))
		for _, ch := range children {
			if ch.cmd.Process.Pid == pid {
				require.NoError(t, ch.cmd.Process.Signal(syscall.SIGKILL))
				_ = ch.cmd.Wait()
			}
		}
		reigns[len(reigns)-1].To = time.Now()
		children = append(children, startRecurring(t, url))
		waitFor(t, "the dead owner's lease to end", func() bool { p := ownerPID(t, st); return p != 0 && p != pid })
	}
	// The last owner runs on for 3 s and stops with the others.
	waitFor(t, "an owner", func() bool { return ownerPID(t, st) != 0 })
	reigns = append(reigns, hoststest.Reign{From: time.Now()})
	time.Sleep(3 * time.Second)
	reigns[len(reigns)-1].To = time.Now()
	var lines []string
	for _, ch := range children {
		_ = ch.cmd.Process.Signal(syscall.SIGTERM)
		_ = ch.cmd.Wait()
		<-ch.done
		lines = append(lines, ch.lines...)
	}
	t.Logf("%d owners, %d killed", len(reigns), len(reigns)-1)
	for i, rg := range reigns {
		t.Logf("owner %d from %v to %v", i+1, rg.From.Sub(began).Round(time.Millisecond), rg.To.Sub(began).Round(time.Millisecond))
	}

	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Task("tick", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}))
	takeovers := hoststest.Takeovers(lines)
	t.Logf("%d takeovers seen by the owners", len(takeovers))
	// Each owner the test saw printed its takeover: else the check below
	// would exempt nothing it should, and split no run it should.
	require.GreaterOrEqual(t, len(takeovers), len(reigns), "every owner printed its takeover")
	hoststest.CheckSchedules(t, c, hoststest.Ran(lines), reigns, takeovers)
}
