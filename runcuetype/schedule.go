package runcuetype

import (
	"encoding/json"
	"time"
)

// Timing says when a schedule's periods are due: every Every since Anchor,
// or at the local times a cron expression names in Zone. Exactly one of
// Every and Cron is set.
//
// A cron schedule's periods are local times, so daylight saving time
// moves them against elapsed time. The rule: a schedule whose expression
// names every hour of the day (hourly, every 15 minutes) follows the wall
// clock as it is shown, so it runs 23 or 25 times an hour's worth on the
// days of a one-hour change: a local time shown twice runs twice, one
// never shown does not run. Any other schedule (daily at 02:30, 09:00 and
// 17:00, weekly) runs once per local time it names: a local time shown
// twice runs at its first occurrence, and one never shown runs at the
// first instant after the gap.
type Timing struct {
	// Every is the time between periods, at least a second. Periods are
	// due at Anchor plus whole multiples of Every.
	Every time.Duration
	// Anchor places Every's periods; the zero Anchor is the Unix epoch
	// (an hourly schedule is due on the hour, UTC).
	Anchor time.Time
	// Cron is a cron expression of five fields (minute, hour, day of
	// month, month, day of week) or a descriptor (@hourly, @daily,
	// @weekly, @monthly, @yearly).
	Cron string
	// Zone is the IANA time zone the Cron expression's local times are
	// in (default UTC). runcue embeds the time zone database, so every
	// host reads the same zones.
	Zone string
	// Jitter delays each period by up to this much, the same delay on
	// every host for a given period (derived from the schedule's name and
	// the period). It is less than the time between periods.
	Jitter time.Duration
	// Start and End, when set, bound the periods: none is due before
	// Start or after End.
	Start time.Time
	End   time.Time
}

type timingJSON struct {
	EveryMS  int64     `json:"every_ms,omitempty"`
	Anchor   time.Time `json:"anchor,omitzero"`
	Cron     string    `json:"cron,omitempty"`
	Zone     string    `json:"zone,omitempty"`
	JitterMS int64     `json:"jitter_ms,omitempty"`
	Start    time.Time `json:"start,omitzero"`
	End      time.Time `json:"end,omitzero"`
}

// MarshalJSON writes t in runcue's JSON convention (durations in integer
// milliseconds, in fields named *_ms).
func (t Timing) MarshalJSON() ([]byte, error) {
	return json.Marshal(timingJSON{t.Every.Milliseconds(), t.Anchor, t.Cron, t.Zone, t.Jitter.Milliseconds(), t.Start, t.End})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (t *Timing) UnmarshalJSON(b []byte) error {
	var j timingJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*t = Timing{Every: time.Duration(j.EveryMS) * time.Millisecond, Anchor: j.Anchor, Cron: j.Cron, Zone: j.Zone,
		Jitter: time.Duration(j.JitterMS) * time.Millisecond, Start: j.Start, End: j.End}
	return nil
}

// Missed says what a schedule does with the periods that fell due while
// no owner ran it (a stop, a crash before a takeover) or while it was
// paused.
type Missed string

const (
	// MissedLatest submits the latest missed period's unit, once, and
	// skips the others. The default.
	MissedLatest Missed = "latest"
	// MissedSkip submits none of them.
	MissedSkip Missed = "skip"
	// MissedEach submits a unit for each missed period, the latest
	// MaxMissed of them at most, and skips the older ones.
	MissedEach Missed = "each"
)

// ScheduleStatus is a schedule as stored, with its next period.
type ScheduleStatus struct {
	Name string `json:"name"`
	// Task is the task of the units it submits.
	Task string `json:"task"`
	// Timing is the timing in effect: the registered one, or the one set
	// at run time (Retimed).
	Timing  Timing `json:"timing"`
	Retimed bool   `json:"retimed,omitempty"`
	Missed  Missed `json:"missed"`
	// SkipIfRunning: a period whose previous unit is still queued or
	// running is skipped.
	SkipIfRunning bool `json:"skip_if_running,omitempty"`
	Paused        bool `json:"paused,omitempty"`
	// Last is the last period the schedule handled (submitted or
	// skipped), LastUnit the last unit it submitted.
	Last     string `json:"last,omitempty"`
	LastUnit string `json:"last_unit,omitempty"`
	// Next is the next period and NextAt when it is due (zero: none,
	// the schedule has ended).
	Next   string    `json:"next,omitempty"`
	NextAt time.Time `json:"next_at,omitzero"`
	// Error, when set, says why this runcue cannot run the stored
	// schedule (a definition written by a newer version, say): the owner
	// leaves it alone, and the fields above but Name, Paused, Last and
	// LastUnit are empty.
	Error string `json:"error,omitempty"`
}
