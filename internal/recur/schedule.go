package recur

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
)

// Def is a schedule's definition as stored (store.ScheduleRecord.Def).
type Def struct {
	Template      Template  `json:"template"`
	Timing        rt.Timing `json:"timing"`
	Missed        rt.Missed `json:"missed,omitempty"`
	MaxMissed     int       `json:"max_missed,omitempty"`
	SkipIfRunning bool      `json:"skip_if_running,omitempty"`
}

// Template is what each period's unit is made of.
type Template struct {
	Task      string           `json:"task"`
	Target    string           `json:"target,omitempty"`
	Params    json.RawMessage  `json:"params,omitempty"`
	TimeoutMS int64            `json:"timeout_ms,omitempty"`
	Retry     json.RawMessage  `json:"retry,omitempty"`
	Cost      map[string]int64 `json:"cost,omitempty"`
}

// DefaultMaxMissed is MaxMissed's default: how many missed periods
// MissedEach submits at most.
const DefaultMaxMissed = 10

// KeyPrefix starts the idempotency key of every unit a schedule submits;
// the key is KeyPrefix, the schedule's name, ":" and the period's key.
const KeyPrefix = "schedule:"

// UnitKey is the idempotency key of schedule name's unit for period.
func UnitKey(name, period string) string { return KeyPrefix + name + ":" + period }

// ParseUnitKey returns the schedule and period an idempotency key names
// (ok false: it is not a schedule's).
func ParseUnitKey(key string) (name, period string, ok bool) {
	rest, ok := strings.CutPrefix(key, KeyPrefix)
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, ":")
}

// Sched is a stored schedule, decoded.
type Sched struct {
	Name string
	Def  Def
	// Spec is the timing in effect: the run-time one (Retimed), else
	// Def's.
	Spec     *Spec
	Retimed  bool
	Paused   bool
	Cursor   Cursor
	LastUnit string
}

// Decode reads a stored schedule.
func Decode(rec store.ScheduleRecord) (*Sched, error) {
	s := &Sched{Name: rec.Name, Paused: rec.Paused, Cursor: Cursor{rec.LastAt, rec.LastKey}, LastUnit: rec.LastUnit}
	if err := json.Unmarshal(rec.Def, &s.Def); err != nil {
		return nil, fmt.Errorf("schedule %q: its stored definition: %w", rec.Name, err)
	}
	timing := s.Def.Timing
	if rec.Timing != nil {
		s.Retimed = true
		if err := json.Unmarshal(rec.Timing, &timing); err != nil {
			return nil, fmt.Errorf("schedule %q: its stored timing: %w", rec.Name, err)
		}
	}
	spec, err := Compile(rec.Name, timing)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", rec.Name, err)
	}
	s.Spec = spec
	if s.Def.Missed == "" {
		s.Def.Missed = rt.MissedLatest
	}
	if s.Def.MaxMissed <= 0 {
		s.Def.MaxMissed = DefaultMaxMissed
	}
	return s, nil
}

// Status is s as runcue reports it.
func (s *Sched) Status() rt.ScheduleStatus {
	st := rt.ScheduleStatus{Name: s.Name, Task: s.Def.Template.Task, Timing: s.Spec.Timing(), Retimed: s.Retimed,
		Missed: s.Def.Missed, SkipIfRunning: s.Def.SkipIfRunning, Paused: s.Paused, Last: s.Cursor.Key, LastUnit: s.LastUnit}
	if p, ok := s.Spec.After(s.Cursor); ok {
		st.Next, st.NextAt = p.Key, p.Due
	}
	return st
}

// Firing is one record the loop makes: a period it submits (Submit), or
// periods it skips: Skipped of them, from FirstSkipped to Period.
type Firing struct {
	Schedule *Sched
	Period   Period
	Submit   bool
	// Reason is "missed" for periods that fell due while no owner ran
	// the schedule (or while it was paused), submitted or skipped.
	Reason       string
	Skipped      int
	FirstSkipped string
}

// maxOnTime bounds the periods one Plan submits on time.
const maxOnTime = 1000

// Plan returns the firings that bring s up to now: the periods due at or
// before now after its cursor, those due before since (missed: they fell
// due while no owner ran s, or while it was paused) handled as s's Missed
// says, the others submitted. Skipped periods come as one firing before
// the submissions that follow them.
func Plan(s *Sched, since, now time.Time) []Firing {
	first, ok := s.Spec.After(s.Cursor)
	if !ok || first.Due.After(now) {
		return nil
	}
	var out []Firing
	cursor := s.Cursor
	// skip records the periods after cursor up to and including last,
	// n of them, as skipped.
	skip := func(n int, last Period) {
		p, _ := s.Spec.After(cursor)
		out = append(out, Firing{Schedule: s, Period: last, Reason: "missed", Skipped: n, FirstSkipped: p.Key})
		cursor = Cursor{last.Nominal, last.Key}
	}
	cut := since.Add(-time.Nanosecond)
	if cut.After(now) {
		cut = now
	}
	run := 1
	switch s.Def.Missed {
	case rt.MissedSkip:
		run = 0
	case rt.MissedEach:
		run = s.Def.MaxMissed
	}
	// The latest run+1 missed periods: the one before the first to run
	// ends the skipped ones.
	missed, n, _ := s.Spec.Due(cursor, cut, run+1, 1<<30)
	if n > 0 {
		run = min(run, n)
		if n > run {
			skip(n-run, missed[len(missed)-run-1])
		}
		for _, p := range missed[len(missed)-run:] {
			out = append(out, Firing{Schedule: s, Period: p, Submit: true, Reason: "missed"})
			cursor = Cursor{p.Nominal, p.Key}
		}
	}
	// Periods due since are on time, however late the loop is; of a
	// backlog (a host that slept, a loop held up), the latest maxOnTime
	// are submitted and the older ones count as missed.
	onTime, n2, _ := s.Spec.Due(cursor, now, maxOnTime+1, 1<<30)
	if n2 > maxOnTime {
		skip(n2-maxOnTime, onTime[len(onTime)-maxOnTime-1])
		onTime = onTime[len(onTime)-maxOnTime:]
	}
	for _, p := range onTime {
		out = append(out, Firing{Schedule: s, Period: p, Submit: true})
	}
	return out
}
