package engine

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Callback errors: a priority function, a DependencySatisfied or a
// ServiceKeys callback that panics, times out or returns an invalid value
// is not fatal (runcue falls back to a default), but it is never silent:
// each failure counts in the runcue.callback.errors metric, and the log
// gets one line per callback and reason per callbackLogEvery, saying how
// many failures it stands for.

// callbackLogEvery is the least time between two log lines about failures
// of one callback for one reason.
const callbackLogEvery = 10 * time.Second

// callbackErrors counts and logs callback failures. It is safe for
// simultaneous use: the scorer, the dependency checker and the dispatcher
// report to it.
type callbackErrors struct {
	log   *slog.Logger
	stats *Counters
	tel   *Telemetry
	mu    sync.Mutex
	// last and suppressed are per callback and reason: when a line was last
	// logged, and how many failures happened since without one.
	last       map[[2]string]time.Time
	suppressed map[[2]string]int
}

// report records one failure of callback ("priority", "dependency",
// "service_keys") for reason ("panic", "nan", "out_of_range", "timeout", "error"),
// with detail (the panic value, the returned value) and attributes for the
// log line.
func (ce *callbackErrors) report(callback, reason, detail string, args ...any) {
	ce.stats.CallbackErrors.Add(1)
	ce.tel.callbackErrs.Add(bg, 1, metric.WithAttributes(attribute.String("callback", callback), attribute.String("reason", reason)))
	k := [2]string{callback, reason}
	now := time.Now() // real time: log throttling, not scheduling
	ce.mu.Lock()
	if ce.last == nil {
		ce.last, ce.suppressed = map[[2]string]time.Time{}, map[[2]string]int{}
	}
	if t, ok := ce.last[k]; ok && now.Sub(t) < callbackLogEvery {
		ce.suppressed[k]++
		ce.mu.Unlock()
		return
	}
	n := ce.suppressed[k] + 1
	ce.last[k], ce.suppressed[k] = now, 0
	ce.mu.Unlock()
	args = append(args, "callback", callback, "reason", reason, "detail", detail, "failures", n)
	ce.log.Log(bg, slog.LevelWarn, "runcue: a "+callback+" callback failed; using the default (further failures in the next "+
		callbackLogEvery.String()+" are counted in runcue.callback.errors, not logged)", args...)
}

// errCallbackPanic marks a callback that panicked.
var errCallbackPanic = errors.New("panic")
