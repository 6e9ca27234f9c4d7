package hoststest

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// Fault is a fault of the database (or of the network to it) that
// RunFaults makes while the units run.
type Fault struct {
	// Name describes it in the log.
	Name string
	// After is the share of the units completed (0 to 1) before it is
	// made.
	After float64
	// Do makes the fault and returns once the database answers again.
	Do func(t *testing.T)
	// Short: the outage is shorter than LeaseTTL/4: it cancels no
	// handler and repeats no run.
	Short bool
}

// FaultOptions sizes RunFaults.
type FaultOptions struct {
	// Env is what a child needs to reach the database (through the
	// faults' proxy).
	Env []string
	// Units is how many units run; Seed fixes them.
	Units int
	Seed  uint64
	// LeaseTTL is the schedulers' lease: dispatch must resume within
	// LeaseTTL + 5 s of the database answering after each fault.
	LeaseTTL time.Duration
	// Faults are made in order.
	Faults []Fault
	// DuplicateID starts a third executor under the first one's ID, as a
	// second host deployed with one --id would be.
	DuplicateID bool
}

// RunFaults runs a scheduler and a standby, two executors (and a
// duplicate of the first, with DuplicateID), each in a process of its
// own, all keeping runcue's default Timeout, while the faults happen; open
// is the test's own view of the database (not through the faults), for
// submitting and checking. It checks what Run checks (no window, meter or
// cap exceeded at arrival, each unit completed once, dependencies
// respected), that no run number arrived twice at the service, that no
// process exited, that dispatch resumed within LeaseTTL + 5 s of the
// database answering after each fault, that a Short fault repeated no
// run, and that every run repeated was one a fault cut (uncut); it logs
// how many were.
func RunFaults(t *testing.T, open Opener, o FaultOptions) {
	ctx := context.Background()
	_, c, deps := submitUnits(t, open, o.Units, o.Seed, 3)

	m := newMock()
	srv := httptest.NewServer(m)
	defer srv.Close()
	env := append(slices.Clone(o.Env), envMock+"="+srv.URL, envDefaults+"=1")
	var children []*exec.Cmd
	children = append(children, startChild(t, env, "scheduler"), startChild(t, env, "scheduler"))
	for i := range 2 {
		children = append(children, startChild(t, env, "executor", envID+"=ex-"+strconv.Itoa(i)))
	}
	if o.DuplicateID {
		children = append(children, startChild(t, env, "executor", envID+"=ex-0"))
	}

	completed := func() int {
		s, err := c.Stats(ctx)
		if err != nil {
			return -1 // the test's own view waits too
		}
		return s.States[runcue.StateCompleted]
	}
	deadline := time.Now().Add(5 * time.Minute)
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
			time.Sleep(5 * time.Millisecond)
		}
	}
	stalls.reset()
	leaseLost.reset()
	var resumes []string
	var windows [][2]time.Time // each fault, from when it began to when the database answered
	for _, f := range o.Faults {
		waitUntil(fmt.Sprintf("%.0f%% of the units completed before %s", 100*f.After, f.Name), func() bool {
			return float64(completed()) >= f.After*float64(o.Units)
		})
		repeatsBefore := m.repeats()
		began := time.Now()
		f.Do(t)
		back := time.Now()
		windows = append(windows, [2]time.Time{began, back})
		waitUntil("dispatch to resume after "+f.Name, func() bool { return m.arrivedAfter(back) })
		// The database answers the processes once they stop reporting
		// stalls (a loaded server may still time them out after the
		// fault's end): dispatch resumes within LeaseTTL + 5 s of that.
		first := m.firstAfter(back)
		answered := back
		for _, at := range stalls.times() {
			if at.After(answered) && at.Before(first) {
				answered = at
			}
		}
		resumed := first.Sub(answered)
		resumes = append(resumes, fmt.Sprintf("%s: %v (outage %v, stalls reported for %v after it)", f.Name, resumed.Round(time.Millisecond),
			back.Sub(began).Round(time.Millisecond), answered.Sub(back).Round(time.Millisecond)))
		assert.LessOrEqual(t, resumed, o.LeaseTTL+5*time.Second, "dispatch resumed after %s (from the last stall a process reported after it)", f.Name)
		if f.Short {
			time.Sleep(o.LeaseTTL) // a cut run would have run again by now
			// An owner that reported its lease not renewed meanwhile (a
			// loaded server answered its renewal too late) stepped down and
			// cut its runs: the fault was not short for it.
			stalled := 0
			for _, at := range leaseLost.times() {
				if !at.Before(began) && !at.After(back.Add(o.LeaseTTL)) {
					stalled++
				}
			}
			if stalled == 0 {
				assert.Equal(t, repeatsBefore, m.repeats(), "a run repeated after %s, shorter than LeaseTTL/4", f.Name)
			} else {
				t.Logf("%s: %d owners reported their lease not renewed around it: not checked as short (%d runs repeated)", f.Name, stalled, m.repeats()-repeatsBefore)
			}
		}
	}
	waitUntil("every unit completed", func() bool { return completed() == o.Units })
	for _, cmd := range children {
		assert.True(t, alive(cmd.Process.Pid), "process %d (%s) exited; the end of its standard error:\n%s",
			cmd.Process.Pid, strings.Join(cmd.Env[len(cmd.Env)-2:], " "), saidLast(cmd))
	}
	for _, cmd := range children {
		kill(cmd)
	}
	m.check(t, deps, c)
	m.mu.Lock()
	twice := m.twice()
	m.mu.Unlock()
	assert.Empty(t, twice, "runs that arrived twice at the service under one run number")
	// A stall no fault made (a starved machine's database answering a
	// process later than its transaction's timeout) cuts runs as a fault
	// does: the processes say so when it happens (stallWatch).
	seen := stalls.times()
	for _, at := range seen {
		windows = append(windows, [2]time.Time{at, at})
	}
	assert.Empty(t, m.uncut(windows, o.LeaseTTL), "units that ran again though no fault cut their run (%d stalls the processes reported)", len(seen))
	t.Logf("%d units; %s; %d runs repeated (cut by the faults); %d stalls reported by the processes; dispatch resumed after: %s",
		o.Units, m.summary(), m.repeats(), len(seen), strings.Join(resumes, "; "))
}

// uncut lists the units that arrived again although their previous
// arrival was in no fault's reach: a run repeats only when a fault cut it,
// so the previous arrival came at most a run's length (a few seconds, with
// the executors' hold) before a fault began, or during it, or within the
// lease's and an executor's TTL after the database answered (the runs the
// fault cut are found then).
func (m *mock) uncut(windows [][2]time.Time, ttl time.Duration) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := slices.Clone(m.arrivals)
	slices.SortFunc(a, func(x, y arrival) int { return x.at.Compare(y.at) })
	last := map[string]time.Time{}
	var out []string
	for _, x := range a {
		prev, seen := last[x.id]
		last[x.id] = x.at
		if !seen {
			continue
		}
		cut := false
		for _, w := range windows {
			if !prev.Before(w[0].Add(-5*time.Second)) && !prev.After(w[1].Add(ttl+5*time.Second)) {
				cut = true
				break
			}
		}
		if !cut {
			out = append(out, fmt.Sprintf("%s run %d at %v (its previous arrival at %v)", x.id, x.attempt, x.at.Format(time.StampMicro), prev.Format(time.StampMicro)))
		}
	}
	return out
}

// repeats counts the arrivals of runs after a unit's first.
func (m *mock) repeats() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	n := 0
	for _, a := range m.arrivals {
		if seen[a.id] {
			n++
		}
		seen[a.id] = true
	}
	return n
}

// twice lists the runs (unit and run number) that arrived more than once.
// m.mu is held.
func (m *mock) twice() []string {
	count := map[run]int{}
	var out []string
	for _, a := range m.arrivals {
		k := run{id: a.id, attempt: a.attempt}
		if count[k]++; count[k] == 2 {
			out = append(out, fmt.Sprintf("%s run %d", a.id, a.attempt))
		}
	}
	return out
}

// arrivedAfter reports whether a run arrived after t.
func (m *mock) arrivedAfter(t time.Time) bool { return !m.firstAfter(t).IsZero() }

// firstAfter returns the first arrival after t (zero if none).
func (m *mock) firstAfter(t time.Time) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	var first time.Time
	for _, a := range m.arrivals {
		if a.at.After(t) && (first.IsZero() || a.at.Before(first)) {
			first = a.at
		}
	}
	return first
}

// alive reports whether process pid is still running (not exited): on
// Linux from /proc (an exited child not yet reaped is a zombie there);
// elsewhere it is assumed.
func alive(pid int) bool {
	if runtime.GOOS != "linux" {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// stalls holds when the children reported the database unavailable, their
// ownership not renewed, or a write's outcome unknown (stallWatch): the
// instants a fault, made or not, reached them.
var stalls stallTimes

// leaseLost holds when an owner reported its lease not renewed in time.
var leaseLost stallTimes

type stallTimes struct {
	mu sync.Mutex
	at []time.Time
}

func (s *stallTimes) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = nil
}

func (s *stallTimes) add(at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = append(s.at, at)
}

func (s *stallTimes) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.at)
}

// stallSigns are the children's log messages that say a fault reached
// them: the store did not answer a write, a read or a lease renewal in
// time.
var stallSigns = []string{"the store is unavailable", "the outcome is unknown", leaseSign, "retrying at every poll"}

// leaseSign is an owner's report that its lease was not renewed in time.
const leaseSign = "lease was not renewed"

// stallWatch reads a child's standard error and records in stalls when a
// line says a fault reached it.
type stallWatch struct{ part []byte }

func (w *stallWatch) Write(p []byte) (int, error) {
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		line := string(w.part[:i])
		w.part = w.part[i+1:]
		for _, sign := range stallSigns {
			if strings.Contains(line, sign) {
				stalls.add(time.Now())
				if sign == leaseSign {
					leaseLost.add(time.Now())
				}
				break
			}
		}
	}
	if len(w.part) > 64<<10 {
		w.part = w.part[:0]
	}
	return len(p), nil
}
