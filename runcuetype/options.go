package runcuetype

// Backpressure marks: backpressure_active is reported when the queued units
// reach HighWater of Config.MaxQueued, backpressure_cleared when they fall
// back to LowWater of it, so the signal does not flap at the limit.
const (
	HighWater = 0.9
	LowWater  = 0.7
)

// Dependency is a completed dependency as a DependencyFunc sees it. Task
// and Target are empty if the unit is no longer stored (pruned).
type Dependency struct {
	ID     string
	Task   string
	Target string
}

// CancelOptions qualify a cancellation.
type CancelOptions struct {
	// Cascade cancels the unit's dependents too. Without it they fail with
	// ErrorKind "prerequisite_cancelled".
	Cascade bool
	// Reason is recorded as the unit's error. Default "cancelled".
	Reason string
}
