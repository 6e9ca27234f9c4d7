package store

import (
	"encoding/json"
	"slices"
)

// Rules every backend applies the same way, written once here: the pure
// ones (cycles, topological order) and the payloads of the events a backend
// derives itself. A backend implements storage, not these.

// CheckCycles finds a cycle among the dependencies of a batch of units
// (inBatch maps each unit's ID to its index) and returns a *CycleError
// naming its members, or nil. Dependencies outside the batch are ignored.
func CheckCycles(units []*Unit, inBatch map[string]int) error {
	const (
		white = iota
		grey
		black
	)
	color := make([]uint8, len(units))
	var stack []int
	var visit func(i int) []string
	visit = func(i int) []string {
		color[i] = grey
		stack = append(stack, i)
		for _, d := range units[i].DependsOn {
			j, ok := inBatch[d]
			if !ok {
				continue
			}
			switch color[j] {
			case grey:
				k := slices.Index(stack, j)
				var members []string
				for _, m := range stack[k:] {
					members = append(members, units[m].ID)
				}
				return members
			case white:
				if c := visit(j); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[i] = black
		return nil
	}
	for i := range units {
		if color[i] == white {
			if c := visit(i); c != nil {
				return &CycleError{Members: c}
			}
		}
	}
	return nil
}

// TopoOrder lists the batch so that every unit comes after the batch units
// it depends on (the batch is acyclic), keeping submission order otherwise.
func TopoOrder(units []*Unit, inBatch map[string]int) []int {
	hasDeps := false
	for _, u := range units {
		if len(u.DependsOn) > 0 {
			hasDeps = true
			break
		}
	}
	order := make([]int, 0, len(units))
	if !hasDeps {
		for i := range units {
			order = append(order, i)
		}
		return order
	}
	done := make([]bool, len(units))
	var visit func(i int)
	visit = func(i int) {
		done[i] = true
		for _, d := range units[i].DependsOn {
			if j, ok := inBatch[d]; ok && !done[j] {
				visit(j)
			}
		}
		order = append(order, i)
	}
	for i := range units {
		if !done[i] {
			visit(i)
		}
	}
	return order
}

// PrerequisiteFailedData is the data of the work_failed event of a unit
// failed because its dependency failed or was cancelled (kind is
// prerequisite_failed or prerequisite_cancelled; prerequisite the
// dependency's ID, or "" when the unit was failed on insert).
func PrerequisiteFailedData(kind, prerequisite string) []byte {
	m := map[string]any{"error": kind, "error_kind": kind, "will_retry": false}
	if prerequisite != "" {
		m["prerequisite"] = prerequisite
	}
	b, _ := json.Marshal(m)
	return b
}

// CascadeCancelledData is the data of the work_cancelled event of a unit
// cancelled with its dependency (Cancel with Cascade).
func CascadeCancelledData(kind, prerequisite string) []byte {
	b, _ := json.Marshal(map[string]any{"error": kind, "error_kind": kind, "prerequisite": prerequisite, "reason": "cascade"})
	return b
}

// CancelRequestedData is the data of a work_cancel_requested event.
func CancelRequestedData(cascade bool, reason string) []byte {
	b, _ := json.Marshal(map[string]any{"cascade": cascade, "reason": reason})
	return b
}
