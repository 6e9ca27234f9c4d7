package engine

import (
	rt "github.com/runcue/runcue/runcuetype"
)

// What the engine reports: the status of services, the queue, Explain's
// reasons, the live statistics. runcue turns each into its public type of
// the same name (whose documentation says what the fields mean).

// BudgetEvent is the data of a budget_exhausted event: a budget of Service
// (of class Class) spent.
type BudgetEvent struct {
	Service, Class string
	Budget         rt.BudgetStatus
}
