package engine

import (
	"fmt"
	"strings"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

// The reasons both the engine (from its live state) and runcue (from the
// database) give, worded once.

// QueuePausedReason says the queue is paused.
func QueuePausedReason() rt.Reason {
	return rt.Reason{Kind: rt.ReasonQueuePaused, Detail: "the queue is paused (PauseQueue)"}
}

// TaskPausedReason says task type task is paused.
func TaskPausedReason(task string) rt.Reason {
	return rt.Reason{Kind: rt.ReasonTaskPaused, Detail: fmt.Sprintf("task type %q is paused (PauseTask)", task)}
}

// SkippedReason notes that the skipped dependencies deps count as
// satisfied.
func SkippedReason(deps []string) rt.Reason {
	return rt.Reason{Kind: rt.ReasonDependenciesSkipped, Dependencies: deps,
		Detail: "skipped, and counted as satisfied: " + strings.Join(deps, ", ")}
}

// TimeReason says a unit waits until at: why is "retry_after" (deferred by
// a Retry-After), "backoff" (after a failure) or anything else (RunAt).
func TimeReason(why string, at time.Time) rt.Reason {
	switch why {
	case "retry_after":
		return rt.Reason{Kind: rt.ReasonRetryAfter, Until: at, Detail: "deferred by a Retry-After until " + at.Format(time.RFC3339)}
	case "backoff":
		return rt.Reason{Kind: rt.ReasonBackoff, Until: at, Detail: "retrying after a failure at " + at.Format(time.RFC3339)}
	}
	return rt.Reason{Kind: rt.ReasonRunAt, Until: at, Detail: "submitted to run at " + at.Format(time.RFC3339)}
}
