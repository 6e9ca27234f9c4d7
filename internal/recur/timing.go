// Package recur computes a schedule's periods: when each is due and the
// key that names it on every host. It is pure: it reads no clock.
package recur

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // every host reads the same zones

	"github.com/robfig/cron/v3"

	rt "github.com/runcue/runcue/runcuetype"
)

// Period is one period of a schedule.
type Period struct {
	// Key names the period alike on every host: for Every, its nominal
	// instant in UTC (RFC 3339); for Cron, its local date-time and zone
	// ("2026-03-29T02:30 Europe/Berlin"), with " (2)" after the second
	// occurrence of a local time shown twice. Never a computed UTC instant
	// of a local time, so hosts whose zone data differ agree on it.
	Key string
	// Nominal is the period's instant; Due adds the jitter.
	Nominal, Due time.Time
}

// Cursor is where a schedule stands: the last period it handled. Periods
// are ordered by nominal instant, then key (two local times that fall in
// one gap are due at the same instant). A Cursor with no Key is an
// instant (a schedule's creation, a change of its timing): the periods
// after it are those strictly after the instant.
type Cursor struct {
	Nominal time.Time
	Key     string
}

// Before reports whether p comes after c.
func (c Cursor) Before(p Period) bool {
	if d := p.Nominal.Compare(c.Nominal); d != 0 {
		return d > 0
	}
	return c.Key != "" && p.Key > c.Key
}

// Spec is a compiled Timing.
type Spec struct {
	t    rt.Timing
	name string
	loc  *time.Location
	// anchor is Every's: t.Anchor, or the Unix epoch.
	anchor time.Time
	cron   *cron.SpecSchedule
	// elapsed: the expression names every hour, so the schedule follows
	// the wall clock as shown (see rt.Timing).
	elapsed bool
}

// MinEvery is the shortest Every.
const MinEvery = time.Second

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ErrInvalid wraps every error of Compile.
var ErrInvalid = errors.New("invalid timing")

// Compile checks t and returns its periods' spec; name is the schedule's
// (it seeds the jitter).
func Compile(name string, t rt.Timing) (*Spec, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	s := &Spec{t: t, name: name, loc: time.UTC, anchor: t.Anchor}
	if s.anchor.IsZero() {
		s.anchor = time.Unix(0, 0).UTC()
	}
	switch {
	case (t.Every != 0) == (t.Cron != ""):
		return nil, bad("set exactly one of Every and Cron")
	case t.Every != 0 && t.Every < MinEvery:
		return nil, bad("Every %v is shorter than %v", t.Every, MinEvery)
	case t.Every%time.Millisecond != 0:
		return nil, bad("Every %v is not a whole number of milliseconds", t.Every)
	case t.Jitter < 0 || t.Jitter%time.Millisecond != 0:
		return nil, bad("Jitter %v is negative or not a whole number of milliseconds", t.Jitter)
	case t.Every != 0 && t.Jitter >= t.Every:
		return nil, bad("Jitter %v is not shorter than Every %v", t.Jitter, t.Every)
	case t.Every != 0 && t.Zone != "":
		return nil, bad("Zone applies to Cron only")
	case !t.End.IsZero() && t.End.Before(t.Start):
		return nil, bad("End is before Start")
	}
	if t.Cron == "" {
		return s, nil
	}
	if strings.HasPrefix(t.Cron, "TZ=") || strings.HasPrefix(t.Cron, "CRON_TZ=") {
		return nil, bad("cron %q: give the zone in Zone, not in the expression", t.Cron)
	}
	if t.Zone != "" {
		loc, err := time.LoadLocation(t.Zone)
		if err != nil || t.Zone == "Local" {
			return nil, bad("zone %q is not an IANA time zone name", t.Zone)
		}
		s.loc = loc
	}
	sched, err := parser.Parse(t.Cron)
	if err != nil {
		return nil, bad("cron %q: %v", t.Cron, err)
	}
	cs, ok := sched.(*cron.SpecSchedule)
	if !ok { // @every
		return nil, bad("cron %q: use Every for a fixed interval", t.Cron)
	}
	s.cron = cs
	s.elapsed = cs.Hour&allHours == allHours
	if t.Jitter >= time.Minute {
		return nil, bad("Jitter %v of a cron schedule is a minute or more", t.Jitter)
	}
	return s, nil
}

const (
	allHours = 1<<24 - 1
	starBit  = 1 << 63 // the parser's mark of a field given as * or ?
)

// Timing returns the timing s was compiled from.
func (s *Spec) Timing() rt.Timing { return s.t }

// After returns the first period after c (false: none, the schedule has
// ended).
func (s *Spec) After(c Cursor) (Period, bool) {
	if s.cron == nil {
		k := s.everyIndex(c.Nominal, true) // the first at or after c
		if s.nominalEvery(k).Equal(c.Nominal) && (c.Key == "" || s.keyEvery(k) <= c.Key) {
			k++
		}
		if !s.t.Start.IsZero() && s.nominalEvery(k).Before(s.t.Start) {
			k = s.everyIndex(s.t.Start, true)
		}
		p := s.periodEvery(k)
		if !s.t.End.IsZero() && p.Nominal.After(s.t.End) {
			return Period{}, false
		}
		return p, true
	}
	from := c.Nominal
	if !s.t.Start.IsZero() && from.Before(s.t.Start) {
		from = s.t.Start.Add(-time.Nanosecond)
	}
	day := localDate(from.In(s.loc)).AddDate(0, 0, -1)
	for range 366*9 + 2 { // a 29 February on a given weekday comes within 28 years; a plain 29 February within 8
		for _, p := range s.day(day) {
			if !c.Before(p) || p.Nominal.Before(s.t.Start) {
				continue
			}
			if !s.t.End.IsZero() && p.Nominal.After(s.t.End) {
				return Period{}, false
			}
			return p, true
		}
		day = day.AddDate(0, 0, 1)
	}
	return Period{}, false
}

// Due returns the periods after c due at or before now: the latest keep
// of them (oldest first; at least one is kept when any is due), and how
// many there are. Counting stops at limit: more is then true.
func (s *Spec) Due(c Cursor, now time.Time, keep, limit int) (latest []Period, n int, more bool) {
	keep = max(keep, 1)
	if s.cron == nil {
		first, ok := s.After(c)
		if !ok || first.Due.After(now) {
			return nil, 0, false
		}
		k0 := s.everyIndex(first.Nominal, false)
		for s.nominalEvery(k0).Before(first.Nominal) {
			k0++
		}
		// The last period due by now, at or before End: the jitter is
		// below Every, so at most two steps back.
		last := s.everyIndex(now, false) + 1
		if !s.t.End.IsZero() {
			last = min(last, s.everyIndex(s.t.End, false))
		}
		for last > k0 && s.periodEvery(last).Due.After(now) {
			last--
		}
		total := last - k0 + 1
		for k := max(k0, last-int64(keep)+1); k <= last; k++ {
			latest = append(latest, s.periodEvery(k))
		}
		if total > int64(limit) {
			return latest, limit, true
		}
		return latest, int(total), false
	}
	for {
		p, ok := s.After(c)
		if !ok || p.Due.After(now) {
			return latest, n, false
		}
		if n == limit {
			return latest, n, true
		}
		n++
		latest = append(latest, p)
		if len(latest) > keep {
			latest = latest[1:]
		}
		c = Cursor{p.Nominal, p.Key}
	}
}

// everyIndex returns the index k of the last period whose nominal
// instant is at or before t (up: the first at or after t).
func (s *Spec) everyIndex(t time.Time, up bool) int64 {
	d := t.Sub(s.anchor) // saturates beyond ±292 years from the anchor
	k := int64(d / s.t.Every)
	if d%s.t.Every != 0 {
		if d < 0 && !up {
			k--
		} else if d > 0 && up {
			k++
		}
	}
	return k
}

func (s *Spec) nominalEvery(k int64) time.Time {
	return s.anchor.Add(time.Duration(k) * s.t.Every)
}

func (s *Spec) keyEvery(k int64) string {
	return s.nominalEvery(k).UTC().Format(time.RFC3339Nano)
}

func (s *Spec) periodEvery(k int64) Period {
	n := s.nominalEvery(k)
	key := s.keyEvery(k)
	return Period{Key: key, Nominal: n, Due: n.Add(s.jitter(key))}
}

// jitter is the period's delay: the same on every host.
func (s *Spec) jitter(key string) time.Duration {
	if s.t.Jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(s.name))
	h.Write([]byte{0})
	h.Write([]byte(key))
	ms := int64(s.t.Jitter / time.Millisecond)
	return time.Duration(int64(h.Sum64()%uint64(ms))) * time.Millisecond
}

// localDate is t's date at midnight, as a naive date (in UTC).
func localDate(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// day returns the periods whose local times fall on the naive date d,
// ordered.
func (s *Spec) day(d time.Time) []Period {
	cs := s.cron
	if cs.Month&(1<<uint(d.Month())) == 0 || !dayMatches(cs, d) {
		return nil
	}
	var ps []Period
	for h := range 24 {
		if cs.Hour&(1<<uint(h)) == 0 {
			continue
		}
		for m := range 60 {
			if cs.Minute&(1<<uint(m)) == 0 {
				continue
			}
			naive := d.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)
			key := naive.Format("2006-01-02T15:04") + " " + s.loc.String()
			occ, gapEnd := s.instants(naive)
			switch {
			case len(occ) == 0 && !s.elapsed:
				ps = append(ps, s.period(key, gapEnd))
			case len(occ) == 0:
			case s.elapsed:
				for i, t := range occ {
					k := key
					if i > 0 {
						k += fmt.Sprintf(" (%d)", i+1)
					}
					ps = append(ps, s.period(k, t))
				}
			default:
				ps = append(ps, s.period(key, occ[0]))
			}
		}
	}
	slices.SortFunc(ps, func(a, b Period) int {
		return cmp.Or(a.Nominal.Compare(b.Nominal), cmp.Compare(a.Key, b.Key))
	})
	return ps
}

func (s *Spec) period(key string, t time.Time) Period {
	return Period{Key: key, Nominal: t, Due: t.Add(s.jitter(key))}
}

func dayMatches(cs *cron.SpecSchedule, d time.Time) bool {
	dom := cs.Dom&(1<<uint(d.Day())) != 0
	dow := cs.Dow&(1<<uint(d.Weekday())) != 0
	if cs.Dom&starBit != 0 || cs.Dow&starBit != 0 {
		return dom && dow
	}
	return dom || dow
}

// instants returns the instants at which s's zone shows the naive local
// time n, in order (two in a fold, none in a gap); for a gap, gapEnd is
// the first instant after it.
func (s *Spec) instants(n time.Time) (occ []time.Time, gapEnd time.Time) {
	// The offsets in effect within a day either side of n.
	var offsets []int
	t := n.Add(-26 * time.Hour).In(s.loc)
	for {
		_, off := t.Zone()
		if !slices.Contains(offsets, off) {
			offsets = append(offsets, off)
		}
		_, end := t.ZoneBounds()
		if end.IsZero() || end.After(n.Add(26*time.Hour)) {
			break
		}
		t = end.In(s.loc)
	}
	for _, off := range offsets {
		u := n.Add(-time.Duration(off) * time.Second)
		if _, actual := u.In(s.loc).Zone(); actual == off {
			occ = append(occ, u)
		}
	}
	slices.SortFunc(occ, time.Time.Compare)
	occ = slices.CompactFunc(occ, time.Time.Equal)
	if len(occ) > 0 {
		return occ, time.Time{}
	}
	// In a gap: read n with the smallest offset (the one before the
	// change); that instant lies after the change, which starts its zone.
	u := n.Add(-time.Duration(slices.Min(offsets)) * time.Second)
	start, _ := u.In(s.loc).ZoneBounds()
	return nil, start
}
