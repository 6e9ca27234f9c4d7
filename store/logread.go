package store

import (
	"context"
	"fmt"
	"slices"
)

// Reading the event log in blocks (EventBlock): what every backend's
// reads share. A backend supplies its blocks (BlocksFrom); the rest is
// here.

// BlocksFrom reads a backend's event blocks that end at or after seq, in
// order, calling fn with each block's first and last sequence numbers and
// data until fn returns false or an error.
type BlocksFrom func(ctx context.Context, seq int64, fn func(first, last int64, data []byte) (bool, error)) error

// EventSelector returns whether an event matches q's types and tasks (nil
// when q selects every event).
func EventSelector(q EventQuery) func(*Event) bool {
	if len(q.Types) == 0 && len(q.Tasks) == 0 {
		return nil
	}
	return func(e *Event) bool {
		return (len(q.Types) == 0 || slices.Contains(q.Types, e.Type)) && (len(q.Tasks) == 0 || slices.Contains(q.Tasks, e.Task))
	}
}

// ScanLog appends to out the events with Seq in [lo, hi] that sel accepts
// (all, when sel is nil), reading blocks, until out holds limit; it
// returns out and the first sequence number it did not look at (lo when
// none).
func ScanLog(ctx context.Context, blocks BlocksFrom, lo, hi int64, limit int, out []Event, sel func(*Event) bool) ([]Event, int64, error) {
	next := lo
	err := blocks(ctx, lo, func(first, last int64, data []byte) (bool, error) {
		if first > hi {
			return false, nil
		}
		err := DecodeBlock(first, data, func(e Event) bool {
			if e.Seq > hi {
				return false
			}
			if e.Seq >= lo && (sel == nil || sel(&e)) {
				out = append(out, e)
			}
			return len(out) < limit
		})
		if err != nil {
			return false, err
		}
		next = min(last, hi) + 1
		return len(out) < limit && last < hi, nil
	})
	return out, next, err
}

// UnitSelector returns whether an event is one of q.WorkID's that q's
// types and tasks select.
func UnitSelector(q EventQuery) func(*Event) bool {
	sel := EventSelector(q)
	return func(e *Event) bool { return e.WorkID == q.WorkID && (sel == nil || sel(e)) }
}

// UnitLogEvents returns the events of unit q.WorkID in q's range that q
// selects, up to q.Limit: those its record rec names (UnitRecord), read
// from their blocks, and, when the record is full, those after its last
// entry, found by scanning the log. (A unit no longer stored has no
// record: scan the log with UnitSelector instead.)
func UnitLogEvents(ctx context.Context, blocks BlocksFrom, rec []byte, q EventQuery) ([]Event, error) {
	mine := UnitSelector(q)
	entries, full, err := UnitRecord(rec)
	if err != nil {
		return nil, fmt.Errorf("runcue: store: unit %q: %w", q.WorkID, err)
	}
	var out []Event
	// i is the next entry; open says that the events read are in the
	// transaction of a More entry; seen is the highest Seq looked at.
	i, open, seen := 0, false, q.After
	done := func() bool { return len(out) >= q.Limit || seen >= q.Upto }
	for (i < len(entries) || open) && !done() {
		from := seen + 1
		if !open {
			from = max(from, entries[i].Seq)
		}
		found := false
		err := blocks(ctx, from, func(first, last int64, data []byte) (bool, error) {
			found = true
			err := DecodeBlock(first, data, func(e Event) bool {
				if e.Seq < from {
					return true
				}
				wanted := open
				for ; i < len(entries) && entries[i].Seq <= e.Seq; i++ {
					// A More entry opens its transaction's events even when
					// the block lost its head to retention (its number is
					// below first): at worst, the unit's events of a later
					// transaction are read a second way.
					if entries[i].More {
						open = true
					}
					wanted = wanted || entries[i].Seq == e.Seq || open
				}
				if e.Seq > q.Upto {
					seen = q.Upto
					return false
				}
				seen = e.Seq
				if wanted && mine(&e) {
					out = append(out, e)
				}
				return !done()
			})
			if err != nil || done() {
				return false, err
			}
			seen = max(seen, min(last, q.Upto))
			if open && !BlockContinues(data) {
				open = false
			}
			// On to the next block when still in an open transaction or
			// when the next entry is in it; otherwise seek the next entry.
			return open, nil
		})
		if err != nil {
			return nil, err
		}
		if !found {
			break // nothing is stored from there on
		}
		for i < len(entries) && entries[i].Seq <= seen && !open {
			i++ // pruned, or past the range
		}
	}
	if full && !done() {
		from := seen + 1
		if n := len(entries); n > 0 {
			from = max(from, entries[n-1].Seq+1)
		}
		out, _, err = ScanLog(ctx, blocks, from, q.Upto, q.Limit, out, mine)
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// LastInBlock returns the last event of the block (first, data) with Seq in
// [lo, hi] that sel accepts, and whether there is one.
func LastInBlock(first int64, data []byte, lo, hi int64, sel func(*Event) bool) (Event, bool, error) {
	var found Event
	ok := false
	err := DecodeBlock(first, data, func(e Event) bool {
		if e.Seq > hi {
			return false
		}
		if e.Seq >= lo && sel(&e) {
			found, ok = e, true
		}
		return true
	})
	return found, ok, err
}
