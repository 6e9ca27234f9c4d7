package main

import "time"

// PatternReport counts what the patterns (Workload.Keys with Debounce or
// Sequence) did, and what their checks found, counted at the handlers.
type PatternReport struct {
	Keys int `json:"keys"`
	// Ran counts the units that ran; Replaced the debounced units a later
	// submission of their key replaced (skipped).
	Ran      int `json:"ran"`
	Replaced int `json:"replaced,omitempty"`
	// Debounce: LateReplacements counts the units that ran although a
	// later submission of their key came before their first start;
	// Unreplaced the units skipped with no later submission of their key
	// before they ended; LastNotRun the keys whose last submission did
	// not run.
	LateReplacements int `json:"late_replacements,omitempty"`
	Unreplaced       int `json:"unreplaced,omitempty"`
	LastNotRun       int `json:"last_not_run,omitempty"`
	// Sequence: OutOfTurn counts the units that started before a unit of
	// their key submitted earlier had ended its last run (out of order, or
	// two at once).
	OutOfTurn int `json:"out_of_turn,omitempty"`
	// Batch (Workload.Batch): the batches' calls, the units in them,
	// the largest batch and the most estimated tokens one held.
	Batches      int   `json:"batches,omitempty"`
	BatchedUnits int   `json:"batched_units,omitempty"`
	LargestBatch int   `json:"largest_batch,omitempty"`
	BatchTokens  int64 `json:"batch_tokens,omitempty"`
}

// patterns checks the units (in submission order) of a run with
// Workload.Keys, and adds its invariants.
func (e *engine) patterns(r *Report, units []*unitRec, add func(name string, pass bool, format string, args ...any)) {
	w := e.cfg.Workload
	if w.Batch == nil && (w.Keys == 0 || (w.Debounce == 0 && !w.Sequence)) {
		return
	}
	p := &PatternReport{Keys: w.Keys}
	r.Patterns = p
	if b := w.Batch; b != nil {
		l := &e.batches
		l.mu.Lock()
		p.Batches, p.BatchedUnits, p.LargestBatch, p.BatchTokens = l.calls, l.units, l.largest, l.maxTokens
		l.mu.Unlock()
		add("batch_size", p.LargestBatch <= b.Max, "%d calls for %d unit runs, the largest of %d units (at most %d)", p.Batches, p.BatchedUnits, p.LargestBatch, b.Max)
		if b.MaxTokens > 0 {
			add("batch_tokens", p.BatchTokens <= b.MaxTokens, "a batch held at most %d estimated tokens (at most %d)", p.BatchTokens, b.MaxTokens)
		}
	}
	byKey := map[string][]*unitRec{}
	for _, u := range units {
		if u == nil || u.spec.target == "" {
			continue
		}
		byKey[u.spec.target] = append(byKey[u.spec.target], u)
		if len(u.runs) > 0 {
			p.Ran++
		}
	}
	never := r.Ended.D() + time.Hour
	for _, us := range byKey {
		if w.Debounce > 0 {
			for i, u := range us {
				if u.final == "skipped" && len(u.runs) == 0 {
					p.Replaced++
					if i == len(us)-1 || us[i+1].submitted > u.finalAt {
						p.Unreplaced++
					}
				}
				if len(u.runs) > 0 && i < len(us)-1 && us[i+1].submitted < u.runs[0].start {
					p.LateReplacements++
				}
			}
			if last := us[len(us)-1]; len(last.runs) == 0 {
				p.LastNotRun++
			}
		}
		if w.Sequence {
			var ended time.Duration // the end of the last run of the units before
			for _, u := range us {
				if len(u.runs) == 0 {
					continue
				}
				if u.runs[0].start < ended {
					p.OutOfTurn++
				}
				for _, run := range u.runs {
					end := run.end
					if !run.ended {
						end = never
					}
					ended = max(ended, end)
				}
			}
		}
	}
	if w.Debounce > 0 {
		add("debounce_replaces_unstarted", p.LateReplacements == 0, "%d units ran though a later submission of their key came before their start", p.LateReplacements)
		add("debounce_skips_replaced", p.Unreplaced == 0, "%d of %d units skipped with no later submission of their key", p.Unreplaced, p.Replaced)
		add("debounce_last_runs", p.LastNotRun == 0, "%d of %d keys' last submission did not run", p.LastNotRun, len(byKey))
	}
	if w.Sequence {
		add("sequence_order", p.OutOfTurn == 0, "%d of %d units started before a unit of their key submitted earlier had ended", p.OutOfTurn, p.Ran)
	}
}
