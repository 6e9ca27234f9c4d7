package runcue

import (
	"context"
	"time"
)

// Scheduling options: dependencies, dynamic priority, backpressure and
// feeders. They are set in Config; this file holds their types.

// OverflowPolicy says what Submit does when the queue is full.
type OverflowPolicy uint8

const (
	// OverflowReject makes Submit return ErrBackpressure. The default.
	OverflowReject OverflowPolicy = iota
	// OverflowDropOldest makes room by cancelling the oldest queued units
	// (ErrorKind and reason "dropped", with a work_cancelled event each).
	OverflowDropOldest
	// OverflowBlock makes Submit wait until there is room or its context
	// ends (then it returns ErrBackpressure wrapping the context's error).
	OverflowBlock
)

// PriorityContext is what a priority function sees of a unit.
type PriorityContext struct {
	// Work is the unit: ID, task, target, params and next attempt number.
	Work *Work
	// QueueDepth is the number of queued units: those the owner holds and
	// those of a deep stored queue it has not loaded yet (Config.LoadAhead).
	QueueDepth int
	// ServicePressure maps each of the unit's services to its load: active
	// over MaxConcurrent, 0 for a service without a concurrency limit.
	ServicePressure map[string]float64
	// WaitTime is how long ago the unit was submitted.
	WaitTime time.Duration
}

// PriorityFunc scores a unit for dispatch, from 0 (lowest) to 1 (highest).
// It must be fast and must not block; see Config.Priority.
type PriorityFunc func(PriorityContext) float64

// PriorityConstant scores every unit x: dispatch stays in submission order.
func PriorityConstant(x float64) PriorityFunc {
	return func(PriorityContext) float64 { return x }
}

// PriorityByWaitTime scores a unit by how long it has waited, reaching 1 at
// horizon: the oldest work goes first, and no unit starves. Combine it with
// your own score to keep low-priority work moving under a stream of urgent
// work:
//
//	func(pc runcue.PriorityContext) float64 {
//		return max(myScore(pc), byWait(pc)) // byWait := runcue.PriorityByWaitTime(time.Hour)
//	}
func PriorityByWaitTime(horizon time.Duration) PriorityFunc {
	if horizon <= 0 {
		horizon = time.Hour
	}
	return func(pc PriorityContext) float64 {
		return min(1, float64(pc.WaitTime)/float64(horizon))
	}
}

// FeedFunc supplies work when the queue runs low (see Config.Feed). It is
// asked for about want submissions; it returns them (possibly none, for
// now), or ErrFeedExhausted when there will never be more.
type FeedFunc func(ctx context.Context, want int) ([]Submission, error)

// DependencyFunc reports whether a completed dependency's output is usable
// (see Config.DependencySatisfied). An error counts as not satisfied, and
// is counted and logged like a panic or a timeout of the callback.
// DependencyFile and DependencyQuery are ready-made ones.
type DependencyFunc func(ctx context.Context, dep Dependency) (bool, error)
