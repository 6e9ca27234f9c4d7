package store

import "context"

// Position returns where a durable subscription stands once the events up
// to last are committed: its acknowledgement, or for a filtered
// subscription the last sequence number before the first event after it
// that the filter matches (last if none does). Its consumer never receives
// the events the filter skips, so they wait for no acknowledgement: once
// every match up to a point is acknowledged, the subscription has passed
// the point.
func Position(ctx context.Context, st Store, sub Subscription, last int64) (int64, error) {
	if (len(sub.Types) == 0 && len(sub.Tasks) == 0) || sub.Acked >= last {
		return sub.Acked, nil
	}
	evs, err := st.MatchingEvents(ctx, EventQuery{After: sub.Acked, Upto: last, Types: sub.Types, Tasks: sub.Tasks, Limit: 1})
	if err != nil {
		return 0, err
	}
	if len(evs) == 0 {
		return last, nil
	}
	return evs[0].Seq - 1, nil
}

// PassedPositions returns, by filtered subscription, the position past its
// acknowledgement that its filter lets it pass (for retention:
// Prune.Passed).
func PassedPositions(ctx context.Context, st Store) (map[string]int64, error) {
	subs, err := st.Subscriptions(ctx)
	if err != nil {
		return nil, err
	}
	var last int64
	var passed map[string]int64
	for _, s := range subs {
		if len(s.Types) == 0 && len(s.Tasks) == 0 {
			continue
		}
		if last == 0 {
			if last, err = st.LastSeq(ctx); err != nil {
				return nil, err
			}
		}
		pos, err := Position(ctx, st, s, last)
		if err != nil {
			return nil, err
		}
		if pos > s.Acked {
			if passed == nil {
				passed = make(map[string]int64)
			}
			passed[s.Name] = pos
		}
	}
	return passed, nil
}
