package recur

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

var rewrite = flag.Bool("rewrite", false, "write testdata/dst.txt from what the code computes")

var zones = []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago"}

// year returns every period of s in 2026 (local dates), in order.
func year(t *testing.T, s *Spec, loc *time.Location) []Period {
	t.Helper()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
	end := time.Date(2027, 1, 1, 0, 0, 0, 0, loc)
	c := Cursor{Nominal: start.Add(-time.Nanosecond)}
	var ps []Period
	for {
		p, ok := s.After(c)
		if !ok {
			t.Fatal("the schedule ended")
		}
		if !p.Nominal.Before(end) {
			return ps
		}
		if len(ps) > 0 && !Cursor(Cursor{ps[len(ps)-1].Nominal, ps[len(ps)-1].Key}).Before(p) {
			t.Fatalf("%v does not come after %v", p, ps[len(ps)-1])
		}
		ps = append(ps, p)
		c = Cursor{p.Nominal, p.Key}
	}
}

// TestHourlyFollowsTheWallClock: an hourly cron schedule is due at every
// instant of the year at which the zone's wall clock shows a whole hour,
// and at no other: 23 or 25 periods on the days of a one-hour change.
// The oracle scans the year minute by minute.
func TestHourlyFollowsTheWallClock(t *testing.T) {
	for _, zone := range zones {
		t.Run(zone, func(t *testing.T) {
			loc, _ := time.LoadLocation(zone)
			s, err := Compile("h", rt.Timing{Cron: "0 * * * *", Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			var want []time.Time
			for u := time.Date(2026, 1, 1, 0, 0, 0, 0, loc).UTC(); u.Before(time.Date(2027, 1, 1, 0, 0, 0, 0, loc)); u = u.Add(time.Minute) {
				if u.In(loc).Minute() == 0 {
					want = append(want, u)
				}
			}
			got := year(t, s, loc)
			if len(got) != len(want) {
				t.Fatalf("%d periods, want %d", len(got), len(want))
			}
			for i := range got {
				if !got[i].Nominal.Equal(want[i]) {
					t.Fatalf("period %d (%s) at %v, want %v", i, got[i].Key, got[i].Nominal, want[i])
				}
			}
		})
	}
}

// TestDailyRunsOncePerLocalDate: a daily 02:30 cron schedule is due once
// per local date: at the first instant the wall clock shows 02:30, or,
// on a date that never shows it, at the first instant after the gap. The
// oracle scans each date minute by minute.
func TestDailyRunsOncePerLocalDate(t *testing.T) {
	for _, zone := range zones {
		t.Run(zone, func(t *testing.T) {
			loc, _ := time.LoadLocation(zone)
			s, err := Compile("d", rt.Timing{Cron: "30 2 * * *", Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			got := year(t, s, loc)
			if len(got) != 365 {
				t.Fatalf("%d periods, want 365", len(got))
			}
			for i, p := range got {
				date := time.Date(2026, 1, 1+i, 0, 0, 0, 0, time.UTC)
				var want time.Time
				for u := time.Date(date.Year(), date.Month(), date.Day(), 0, 0, 0, 0, loc).Add(-3 * time.Hour); ; u = u.Add(time.Minute) {
					l := u.In(loc)
					if l.Year() == date.Year() && l.YearDay() == date.YearDay() && l.Hour()*60+l.Minute() >= 150 {
						want = u
						break
					}
				}
				if !p.Nominal.Equal(want) {
					t.Errorf("%s at %v, want %v", p.Key, p.Nominal.In(loc), want.In(loc))
				}
				if wantKey := date.Format("2006-01-02") + "T02:30 " + zone; p.Key != wantKey {
					t.Errorf("key %q, want %q", p.Key, wantKey)
				}
			}
		})
	}
}

// TestDSTTable writes, for each zone, the periods of the daily 02:30 and
// hourly schedules on the dates of 2026 whose periods are not the plain
// ones (a period's local time is not its key's, or the hourly count is
// not 24), into testdata/dst.txt, and checks it (-rewrite writes it).
// The file is for reading: the two tests above are its proof.
func TestDSTTable(t *testing.T) {
	var b strings.Builder
	b.WriteString("# Periods of 2026 on the dates where daylight saving time moves them\n")
	b.WriteString("# (written by TestDSTTable; the rule is runcuetype.Timing's).\n")
	for _, zone := range zones {
		loc, _ := time.LoadLocation(zone)
		fmt.Fprintf(&b, "\n%s\n", zone)
		for _, spec := range []string{"30 2 * * *", "0 * * * *"} {
			s, err := Compile("t", rt.Timing{Cron: spec, Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			byDate := map[string][]Period{}
			var dates []string
			for _, p := range year(t, s, loc) {
				d := p.Key[:10]
				if byDate[d] == nil {
					dates = append(dates, d)
				}
				byDate[d] = append(byDate[d], p)
			}
			total := 0
			for _, d := range dates {
				ps := byDate[d]
				total += len(ps)
				odd := spec == "0 * * * *" && len(ps) != 24
				for _, p := range ps {
					odd = odd || p.Nominal.In(loc).Format("2006-01-02T15:04") != p.Key[:16]
				}
				if !odd {
					continue
				}
				fmt.Fprintf(&b, "  %-10s %s: %d periods\n", spec, d, len(ps))
				for _, p := range ps {
					l := p.Nominal.In(loc)
					if l.Format("2006-01-02T15:04") != p.Key[:16] || strings.HasSuffix(p.Key, ")") || spec != "0 * * * *" || l.Hour() < 4 || (l.Hour() >= 22) {
						fmt.Fprintf(&b, "    %-40s due %s (%s)\n", p.Key, l.Format("2006-01-02 15:04 -07:00"), p.Nominal.UTC().Format("15:04Z"))
					}
				}
			}
			fmt.Fprintf(&b, "  %-10s the year: %d periods\n", spec, total)
		}
	}
	const path = "testdata/dst.txt"
	if *rewrite {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != b.String() {
		t.Errorf("%s differs from what the code computes (run with -rewrite and read the diff):\n%s", path, b.String())
	}
}

// TestEvery: periods at the anchor plus multiples of Every, keyed by
// their UTC instant; Start and End bound them; the jitter is the same for
// a period whatever asks, and below Every.
func TestEvery(t *testing.T) {
	anchor := time.Date(2026, 3, 1, 0, 0, 10, 0, time.UTC)
	s, err := Compile("e", rt.Timing{Every: time.Minute, Anchor: anchor, Jitter: 30 * time.Second,
		Start: anchor.Add(time.Hour), End: anchor.Add(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	p, ok := s.After(Cursor{Nominal: anchor})
	if !ok || !p.Nominal.Equal(anchor.Add(time.Hour)) || p.Key != "2026-03-01T01:00:10Z" {
		t.Fatalf("first period %+v %v, want the Start", p, ok)
	}
	if d := p.Due.Sub(p.Nominal); d < 0 || d >= 30*time.Second {
		t.Errorf("jitter %v", d)
	}
	again, _ := Compile("e", s.Timing())
	if q, _ := again.After(Cursor{Nominal: anchor}); q != p {
		t.Errorf("the same period's jitter differs: %v, %v", p.Due, q.Due)
	}
	p, _ = s.After(Cursor{Nominal: anchor.Add(90*time.Minute + time.Second)})
	if !p.Nominal.Equal(anchor.Add(91 * time.Minute)) {
		t.Errorf("after 1:30:11, %v", p.Nominal)
	}
	if p, ok := s.After(Cursor{Nominal: anchor.Add(2 * time.Hour), Key: "2026-03-01T02:00:10Z"}); ok {
		t.Errorf("a period after End: %v", p)
	}
	// Due: 61 periods from the Start to the End, the latest 3 kept.
	latest, n, more := s.Due(Cursor{Nominal: anchor}, anchor.Add(5*time.Hour), 3, 1000)
	if n != 61 || more || len(latest) != 3 || !latest[2].Nominal.Equal(anchor.Add(2*time.Hour)) {
		t.Errorf("Due: %d %v %+v", n, more, latest)
	}
	// Years after the End: the same 61, counted without walking back.
	_, n, _ = s.Due(Cursor{Nominal: anchor}, anchor.Add(5*365*24*time.Hour), 1, 1000)
	if n != 61 {
		t.Errorf("Due five years on: %d", n)
	}
	_, n, more = s.Due(Cursor{Nominal: anchor}, anchor.Add(5*time.Hour), 1, 10)
	if n != 10 || !more {
		t.Errorf("Due with a limit of 10: %d %v", n, more)
	}
	// A cursor without a key is an instant: a period on it is not after
	// it (a schedule created at that instant starts with the next).
	p, _ = s.After(Cursor{Nominal: anchor.Add(time.Hour)})
	if !p.Nominal.Equal(anchor.Add(time.Hour + time.Minute)) {
		t.Errorf("after the instant 1:00:10: %v", p.Nominal)
	}
}

// TestCronDue counts a cron schedule's missed periods and keeps the
// latest; the cursor (10:00, "") is a schedule created at 10:00: its
// periods are those after 10:00.
func TestCronDue(t *testing.T) {
	s, err := Compile("c", rt.Timing{Cron: "*/15 * * * *"})
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	latest, n, more := s.Due(Cursor{Nominal: from}, from.Add(2*time.Hour), 2, 100)
	if n != 8 || more || len(latest) != 2 || latest[1].Key != "2026-05-01T12:00 UTC" || latest[0].Key != "2026-05-01T11:45 UTC" {
		t.Errorf("%d %v %+v", n, more, latest)
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, tm := range []rt.Timing{
		{},
		{Every: time.Minute, Cron: "@daily"},
		{Every: time.Millisecond},
		{Every: time.Minute, Jitter: time.Minute},
		{Every: time.Minute, Zone: "Europe/Berlin"},
		{Cron: "61 * * * *"},
		{Cron: "@every 1m"},
		{Cron: "TZ=Europe/Berlin 0 * * * *"},
		{Cron: "@daily", Zone: "Mars/Olympus"},
		{Cron: "@daily", Zone: "Local"},
		{Cron: "@daily", Jitter: time.Hour},
		{Every: time.Minute, Start: time.Unix(100, 0), End: time.Unix(50, 0)},
	} {
		if _, err := Compile("x", tm); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", tm, err)
		}
	}
}

// TestEveryZeroAnchor: without an Anchor, periods are whole multiples of
// Every since the Unix epoch (hourly: on the hour, UTC).
func TestEveryZeroAnchor(t *testing.T) {
	s, err := Compile("z", rt.Timing{Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 5, 1, 10, 30, 0, 0, time.UTC)
	if p, _ := s.After(Cursor{Nominal: at}); !p.Nominal.Equal(time.Date(2026, 5, 1, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("after 10:30: %v", p.Nominal)
	}
}
