package runcuetype

import (
	"fmt"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// AdaptiveStatus reports a service's adaptive limits (Service.Adaptive)
// now: each limit in force beside its configured value, and the overload
// signals that lowered them, by kind, since they were last all at their
// configured values.
type AdaptiveStatus struct {
	Limits []AdaptiveLimit `json:"limits"`
	// Throttled counts Retry-After answers (429s), Unavailable errors
	// made with Overloaded (503s), Timeouts runs cut off by their
	// timeout.
	Throttled   int `json:"throttled,omitempty"`
	Unavailable int `json:"unavailable,omitempty"`
	Timeouts    int `json:"timeouts,omitempty"`
}

// AdaptiveLimit is one adaptive limit: Limit names it ("concurrency",
// "requests" for the rate window, or a meter's amount such as "tokens");
// Effective is in force, at most Configured; Overloads counts the
// signals it took since it was last at Configured.
type AdaptiveLimit struct {
	Limit      string `json:"limit"`
	Configured int64  `json:"configured"`
	Effective  int64  `json:"effective"`
	Overloads  int    `json:"overloads,omitempty"`
}

// Lowered reports whether a limit is below its configured value.
func (a *AdaptiveStatus) Lowered() bool {
	if a == nil {
		return false
	}
	for _, l := range a.Limits {
		if l.Effective < l.Configured {
			return true
		}
	}
	return false
}

// Describe says, for each limit of a below its configured value, what is
// in force, in the units of the service's limits l: "effective limit
// 42/min (configured 60), lowered after 3 429s".
func (a *AdaptiveStatus) Describe(l Service) []string {
	if a == nil {
		return nil
	}
	var out []string
	for _, lim := range a.Limits {
		if lim.Effective >= lim.Configured {
			continue
		}
		per := ""
		switch lim.Limit {
		case "concurrency":
			per = " at once"
		case store.MeterRequests:
			per = "/" + windowUnit(l.RateWindow)
		default:
			for _, m := range l.Meters {
				if m.Name == lim.Limit {
					per = " " + m.Name + "/" + windowUnit(m.Window)
				}
			}
		}
		s := fmt.Sprintf("effective limit %d%s (configured %d)", lim.Effective, per, lim.Configured)
		if why := a.Signals(); why != "" {
			s += ", lowered after " + why
		}
		out = append(out, s)
	}
	return out
}

// Signals lists the overload signals counted, in words: "3 429s,
// 1 timeout" ("" for none).
func (a *AdaptiveStatus) Signals() string {
	if a == nil {
		return ""
	}
	var parts []string
	add := func(n int, one, many string) {
		switch {
		case n == 1:
			parts = append(parts, "1 "+one)
		case n > 1:
			parts = append(parts, fmt.Sprintf("%d %s", n, many))
		}
	}
	add(a.Throttled, "429", "429s")
	add(a.Unavailable, "503", "503s")
	add(a.Timeouts, "timeout", "timeouts")
	return strings.Join(parts, ", ")
}

// windowUnit names a window: "min" for a minute, "s" for a second, "h"
// for an hour, else its length ("10s").
func windowUnit(d time.Duration) string {
	switch d {
	case time.Second:
		return "s"
	case time.Minute:
		return "min"
	case time.Hour:
		return "h"
	case 24 * time.Hour:
		return "day"
	}
	return d.String()
}
