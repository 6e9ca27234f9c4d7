package main

// HeadersStats are the figures of a meter runcue reads from the mock's
// headers (Tokens.FromProvider): the share of the mock's token limit
// runcue's calls used in each of the first windows from the run's start
// (at arrival), the first window (1-based) whose use reached the
// scenario's bound (0: none of the first ten), and, after the first
// window, runcue's calls and the share of them answered 429.
type HeadersStats struct {
	Start      int64     `json:"start"`
	Windows    []float64 `json:"windows"`
	Best       float64   `json:"best"`
	Reached    int       `json:"reached"`
	Calls      int       `json:"calls"`
	RefusedPct float64   `json:"refused_pct"`
}

// headersStats computes the figures of the calls cs (by arrival); reach
// is the share of the limit a window must use to count as reached.
func (m *mock) headersStats(cs []call) *HeadersStats {
	t := m.cfg.Tokens
	if t == nil || !t.FromProvider {
		return nil
	}
	win := t.Window.D()
	st := &HeadersStats{Start: t.Limit, Windows: make([]float64, 10)}
	used := make([]int64, len(st.Windows))
	reach := m.reach
	if reach == 0 {
		reach = 0.9
	}
	var refused int
	for _, c := range cs {
		k := int(c.start.Sub(m.epoch) / win)
		if k >= 0 && k < len(used) {
			used[k] += c.tokens
		}
		if k >= 1 {
			st.Calls++
			if c.refused {
				refused++
			}
		}
	}
	for k, u := range used {
		st.Windows[k] = round4(float64(u) / float64(t.MockLimit))
		if k < 3 {
			st.Best = max(st.Best, st.Windows[k])
		}
		if st.Reached == 0 && st.Windows[k] >= reach {
			st.Reached = k + 1
		}
	}
	if st.Calls > 0 {
		st.RefusedPct = round4(100 * float64(refused) / float64(st.Calls))
	}
	return st
}
