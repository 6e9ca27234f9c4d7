package store

import (
	"encoding/json"
	"fmt"
	"time"
)

// The encoded columns of a stored unit and a subscription, as every
// backend stores them.

// DecodeUnitColumns sets u's Costs from their stored JSON object (empty:
// none) and its Attempts from their stored JSON array of AttemptJSON
// entries (empty: none).
func DecodeUnitColumns(u *Unit, costs []byte, attempts string) error {
	if len(costs) > 0 {
		if err := json.Unmarshal(costs, &u.Costs); err != nil {
			return fmt.Errorf("unit %s: costs: %w", u.ID, err)
		}
	}
	if attempts == "" {
		return nil
	}
	var recs []struct {
		Run     int              `json:"run"`
		Start   int64            `json:"start"`
		End     int64            `json:"end"`
		Outcome string           `json:"outcome"`
		Error   string           `json:"error"`
		Used    map[string]int64 `json:"used"`
	}
	if err := json.Unmarshal([]byte(attempts), &recs); err != nil {
		return fmt.Errorf("unit %s: attempts: %w", u.ID, err)
	}
	u.Attempts = make([]Attempt, len(recs))
	for i, a := range recs {
		u.Attempts[i] = Attempt{Run: a.Run, Start: fromUnixNano(a.Start), End: fromUnixNano(a.End), Outcome: a.Outcome, Error: a.Error, Used: a.Used}
	}
	return nil
}

// fromUnixNano is unixNano's inverse: the zero time for 0.
func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// EncodeNames is a subscription filter's stored form: its names as a JSON
// array, "" when there are none.
func EncodeNames(names []string) string {
	if len(names) == 0 {
		return ""
	}
	b, _ := json.Marshal(names)
	return string(b)
}

// DecodeSubscriptionFilter sets sub's Types and Tasks from their stored
// forms (EncodeNames).
func DecodeSubscriptionFilter(sub *Subscription, types, tasks string) error {
	for _, f := range []struct {
		what  string
		from  string
		names *[]string
	}{{"types", types, &sub.Types}, {"tasks", tasks, &sub.Tasks}} {
		if f.from == "" {
			continue
		}
		if err := json.Unmarshal([]byte(f.from), f.names); err != nil {
			return fmt.Errorf("subscription %q: %s: %w", sub.Name, f.what, err)
		}
	}
	return nil
}
