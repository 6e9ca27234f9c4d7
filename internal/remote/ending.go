package remote

import (
	"encoding/json"
	"errors"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/call"
	"github.com/runcue/runcue/internal/engine"
)

// endingOf decodes an executor's report of a run's end (call.Report).
func endingOf(b []byte, at time.Time) engine.Ending {
	var r call.Report
	if err := json.Unmarshal(b, &r); err != nil {
		return engine.Ending{Err: rt.Permanent(errors.New("runcue: an executor's report could not be read: " + err.Error())), At: at}
	}
	for name, n := range r.Used { // an executor of another version may not bound them
		r.Used[name] = call.BoundUsed(n)
	}
	e := engine.Ending{Result: r.Result, NotStarted: r.NotStarted, Used: r.Used, Permanent: r.Permanent, Overload: r.Overload, At: at}
	if r.Error != "" {
		e.Err = errors.New(r.Error)
	}
	switch {
	case r.Late:
		e.Class = engine.ClassLateStart
	case r.Lost:
		e.Class = engine.ClassLost
	case r.Skip != nil:
		e.Class, e.SkipReason = engine.ClassSkip, *r.Skip
	case r.RetryAfter != nil:
		e.Class, e.Delay, e.Services = engine.ClassRetryAfter, time.Duration(*r.RetryAfter)*time.Millisecond, r.Services
	case r.Timeout:
		e.Class = engine.ClassTimeout
	case r.Panic:
		e.Class = engine.ClassPanic
	}
	return e
}

// observedOf decodes what a run's handler observed of its services'
// limits from its executor's report (none from an unreadable one, or one
// an older executor wrote).
func observedOf(b []byte) []call.Observed {
	var r struct {
		Observations []call.Observed `json:"observations"`
	}
	if json.Unmarshal(b, &r) != nil || len(r.Observations) > call.MaxObservations {
		return nil
	}
	return r.Observations
}
