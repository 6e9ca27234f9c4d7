package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// Sequences (TaskSpec.Sequence): the units of one key of a task start one
// at a time, in submission order (their store Seq), retries included.
// Each key's known, unfinished units are its line's members, in that
// order; only the first may be eligible (in its lane, waiting for its
// runAt or its dependencies, or running); the others wait in state
// uSequenced. A unit that leaves (finished) gives the turn to the next,
// unless it failed under HoldOnFailure: its key is then held until it is
// retried. Owned by the dispatcher goroutine.

// seqLine is one sequence key's units.
type seqLine struct {
	key     string
	members []*unit
	// heldBy is the failed unit that holds the key (HoldOnFailure), "" if
	// none.
	heldBy string
}

// turn reports whether u may be eligible: it is its line's first member
// and no failed unit holds the key.
func (l *seqLine) turn(u *unit) bool {
	return l.heldBy == "" && len(l.members) > 0 && l.members[0] == u
}

// joinSequence puts u in its key's line, if its task is sequenced: in
// submission order, but never before a member that is running or in its
// lane (a failed unit retried after the next one went ahead waits for
// it). A failed unit that held the key and comes back releases it.
func (x *unitIndex) joinSequence(u *unit, t *taskRT) {
	if t.spec.Sequence == nil {
		return
	}
	l := x.lineOf(t, u.target)
	if l == nil {
		return
	}
	if l.heldBy == u.id {
		l.heldBy = ""
	}
	i := len(l.members)
	for i > 0 && l.members[i-1].seq > u.seq && l.members[i-1].state != uRunning && l.members[i-1].state != uReady {
		i--
	}
	l.members = append(l.members, nil)
	copy(l.members[i+1:], l.members[i:])
	l.members[i] = u
	u.ext().line = l
}

// lineOf returns (making) the line of the key task t gives target, nil
// when it gives none.
func (x *unitIndex) lineOf(t *taskRT, target string) *seqLine {
	key := t.spec.Sequence(target)
	if key == "" {
		return nil
	}
	key = t.name + " " + key
	l := x.seqs[key]
	if l == nil {
		if x.seqs == nil {
			x.seqs = make(map[string]*seqLine)
		}
		l = &seqLine{key: key}
		x.seqs[key] = l
	}
	return l
}

// sequenced reports whether u must wait for its turn in its key's line;
// it then waits in state uSequenced.
func (x *unitIndex) sequenced(u *unit) bool {
	m := u.more
	if m == nil || m.line == nil || (m.line.turn(u) && !x.seqReading[u.task]) {
		return false
	}
	u.state = uSequenced
	return true
}

// leaveSequence takes u, which leaves the dispatcher, out of its key's
// line, and gives the turn to the next member unless hold (u failed under
// HoldOnFailure) keeps the key.
func (x *unitIndex) leaveSequence(u *unit, hold bool) {
	m := u.more
	if m == nil || m.line == nil {
		return
	}
	l := m.line
	m.line = nil
	for i, v := range l.members {
		if v == u {
			l.members = append(l.members[:i], l.members[i+1:]...)
			break
		}
	}
	if hold {
		l.heldBy = u.id
	}
	if len(l.members) == 0 {
		if l.heldBy == "" {
			delete(x.seqs, l.key)
		}
		return
	}
	if next := l.members[0]; l.heldBy == "" && next.state == uSequenced {
		x.makeEligible(next)
	}
}

// holdFailed records that failed unit id of task t, with target target,
// holds its key (a new owner's look at the failures of a HoldOnFailure
// task): the key's units wait until it is retried.
func (x *unitIndex) holdFailed(t *taskRT, id, target string) {
	if l := x.lineOf(t, target); l != nil && l.heldBy == "" {
		l.heldBy = id
	}
}

// sequenceReason says why u waits in its key's line.
func (x *unitIndex) sequenceReason(u *unit) rt.Reason {
	l := u.more.line
	_, key, _ := cutTask(l.key)
	if x.seqReading[u.task] {
		return rt.Reason{Kind: rt.ReasonSequence, Detail: fmt.Sprintf("waits in sequence %q: the owner is reading which failed units hold their keys", key)}
	}
	if l.heldBy != "" {
		return rt.Reason{Kind: rt.ReasonSequence, Dependencies: []string{l.heldBy},
			Detail: fmt.Sprintf("waits in sequence %q: %s failed and holds it until it is retried", key, l.heldBy)}
	}
	first := l.members[0]
	return rt.Reason{Kind: rt.ReasonSequence, Dependencies: []string{first.id},
		Detail: fmt.Sprintf("waits for %s in sequence %q (%d before it)", first.id, key, position(l, u))}
}

func position(l *seqLine, u *unit) int {
	for i, v := range l.members {
		if v == u {
			return i
		}
	}
	return len(l.members)
}

// cutTask splits a line's key into its task and the task's own key (a
// task's name holds no space).
func cutTask(key string) (task, own string, ok bool) { return strings.Cut(key, " ") }

// readHolders reads, for task t (HoldOnFailure), the failed units an
// earlier owner left: each holds its key here too. Until the read is
// applied the task's sequenced units wait (seqReading).
func (d *Engine) readHolders(t *taskRT) {
	if d.seqReading == nil {
		d.seqReading = make(map[string]bool)
	}
	d.seqReading[t.name] = true
	st, log := d.st, d.log
	d.read(func(ctx context.Context) func(*Engine) {
		// Tried until it succeeds or the engine ends: until then the
		// task's sequenced units wait.
		var failed []*store.Unit
		for {
			var err error
			failed, err = st.ListUnits(ctx, store.ListFilter{States: []store.State{store.Failed}, Tasks: []string{t.name}, Limit: 1 << 30})
			if err == nil {
				break
			}
			log.Error("runcue: read a sequenced task's failed units; trying again in a second", "task", t.name, "error", err)
			select {
			case <-ctx.Done():
				return func(*Engine) {}
			case <-time.After(time.Second):
			}
		}
		return func(d *Engine) {
			for _, u := range failed {
				d.holdFailed(t, u.ID, u.Target)
			}
			delete(d.seqReading, t.name)
			for _, l := range d.seqs {
				if task, _, _ := cutTask(l.key); task == t.name && len(l.members) > 0 && l.heldBy == "" && l.members[0].state == uSequenced {
					d.makeEligible(l.members[0])
				}
			}
		}
	})
}

// sequenceStats counts the sequence keys with units waiting for their
// turn or held by a failure, the units waiting, and the held keys.
func (x *unitIndex) sequenceStats() rt.PatternStats {
	var p rt.PatternStats
	for _, l := range x.seqs {
		waiting := 0
		for _, u := range l.members {
			if u.state == uSequenced {
				waiting++
			}
		}
		if waiting > 0 || l.heldBy != "" {
			p.Sequences++
		}
		if l.heldBy != "" {
			p.SequencesHeld++
		}
		p.SequenceWaiting += waiting
	}
	p.Live = true
	return p
}
