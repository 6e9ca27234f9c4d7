package main

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// verdict is what a mock service answers one call.
type verdict uint8

const (
	answerOK verdict = iota
	answerError
	answerTimeout
	answerPermanent
	answerTooMany // 429 with a Retry-After
	answerOutage  // a forced failure: circuit_test burst, fail_from, key C
)

var verdictNames = [...]string{"ok", "error", "timeout", "permanent", "429", "outage"}

func (v verdict) String() string { return verdictNames[v] }

// call is one call a mock service received: its arrival (the handler-start
// instant plus the wire's delay), its end, and its answer.
type call struct {
	unit    string
	attempt int
	start   time.Time // the arrival
	end     time.Time
	answer  verdict
	tokens  int64 // what the call used, counted at its arrival
	// refused: the hidden limit answered it 429 (Behavior.HiddenLimit).
	refused bool
}

// mock is a simulated service. It decides each call from the run's seed
// and the call's identity alone (unit and attempt), so that a replay
// answers the same whatever order calls arrive in, and it keeps its own
// record of the calls it received, from which the server-side checks are
// made; it trusts nothing runcue reports.
type mock struct {
	name  string
	cfg   ServiceConfig
	seed  uint64
	epoch time.Time
	// until is how long after epoch work is submitted (the token
	// utilisation's span ends there).
	until time.Duration
	// reach is the share of its token limit a window must use to count
	// as reached (HeadersStats; default 0.9).
	reach float64

	// Interactive overrides (the TUI's keys), read on handler goroutines.
	errorRate    atomic.Uint64 // math.Float64bits; NaN: the configured rate
	latencyScale atomic.Uint64 // math.Float64bits
	failUntil    atomic.Int64  // offset from epoch, ns; a forced outage before it

	mu          sync.Mutex
	calls       []call        // every call, in arrival order of the mock's lock
	foreign     []call        // the other client's requests (Tokens.Shared), by arrival
	nextForeign time.Duration // the other client's next request, since epoch
	foreignRng  *rand.Rand    // its Poisson arrivals' draws (Shared.Arrivals)
	inflight    int           // calls started and not ended
	window      []float64     // arrivals (s since epoch) within the mock window, for live display
	holds       []hold        // every Retry-After answered
	mark        bucketMark    // the bucket's level replayed so far (Tokens.MockBucket)
}

// bucketMark is the token bucket's level at at, the first calls and
// foreign requests (by arrival, each list a prefix) replayed into it: a
// level asked for replays only the calls after them.
type bucketMark struct {
	valid          bool
	level          float64
	at             time.Time
	calls, foreign int
}

// bucketLag is how far behind the latest level asked for the mark is
// kept: a level is asked for at a call's arrival until it is answered,
// and calls are recorded at their arrival, so no call or question comes
// that late.
const bucketLag = time.Minute

// hold is a Retry-After the mock answered: no call should arrive in
// (from, until).
type hold struct{ from, until time.Time }

func newMock(name string, cfg ServiceConfig, seed uint64, epoch time.Time) *mock {
	m := &mock{name: name, cfg: cfg, seed: seed, epoch: epoch}
	m.errorRate.Store(math.Float64bits(math.NaN()))
	m.latencyScale.Store(math.Float64bits(1))
	return m
}

// rng returns the random source of one call.
func (m *mock) rng(unit string, attempt int) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%d", m.name, unit, attempt)
	return rand.New(rand.NewPCG(m.seed, h.Sum64()))
}

// wire draws the transport delay of one call, from the handler's start to
// its arrival here, in [WireMin, WireMax], from the seed and the call's
// identity.
func (m *mock) wire(unit string, attempt int) time.Duration {
	h := fnv.New64a()
	fmt.Fprintf(h, "wire/%s/%s/%d", m.name, unit, attempt)
	r := rand.New(rand.NewPCG(m.seed, h.Sum64()))
	lo, hi := m.cfg.Behavior.WireMin.D(), m.cfg.Behavior.WireMax.D()
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// decide draws a call's latency and answer. now is the call's arrival.
func (m *mock) decide(unit string, attempt int, now time.Time) (time.Duration, verdict) {
	r := m.rng(unit, attempt)
	b := m.cfg.Behavior
	lat := time.Duration(float64(m.latency(r)) * math.Float64frombits(m.latencyScale.Load()))
	u := r.Float64()
	since := now.Sub(m.epoch)
	switch {
	case since < time.Duration(m.failUntil.Load()):
		return lat, answerOutage
	case b.FailFor > 0 && since >= b.FailFrom.D() && since < b.FailFrom.D()+b.FailFor.D():
		return lat, answerOutage
	case b.CircuitTest && since%b.BurstEvery.D() >= b.BurstEvery.D()-b.BurstLength.D():
		return lat, answerOutage
	}
	errRate := b.ErrorRate
	if x := math.Float64frombits(m.errorRate.Load()); !math.IsNaN(x) {
		errRate = x
	}
	switch {
	case u < b.PermanentErrorRate:
		return lat, answerPermanent
	case u < b.PermanentErrorRate+errRate:
		return lat, answerError
	case u < b.PermanentErrorRate+errRate+b.TimeoutRate:
		return lat, answerTimeout
	case u < b.PermanentErrorRate+errRate+b.TimeoutRate+b.RateLimitedRate:
		return lat, answerTooMany
	}
	return lat, answerOK
}

// latency draws from the configured distribution, at least 1ms.
func (m *mock) latency(r *rand.Rand) time.Duration {
	l := m.cfg.Behavior.Latency
	var d float64
	switch l.Distribution {
	case "uniform":
		d = float64(l.Min) + r.Float64()*float64(l.Max-l.Min)
	case "lognormal":
		d = float64(l.Median) * math.Exp(l.Sigma*r.NormFloat64())
	default:
		d = float64(l.Mean) + float64(l.Stddev)*r.NormFloat64()
	}
	if l.OutlierRate > 0 && r.Float64() < l.OutlierRate {
		d *= l.OutlierMultiplier
	}
	return max(time.Millisecond, time.Duration(d).Round(time.Millisecond))
}

// tokens returns what a unit's call uses (input and output tokens, the
// same at every attempt) and the cost runcue is told at submit: its input
// overestimated by up to EstimateError, plus MaxTokens (or its output
// overestimated likewise). Zero without a token limit.
func (m *mock) tokens(unit string) (use, estimate int64) {
	t := m.cfg.Tokens
	if t == nil {
		return 0, 0
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "tokens/%s/%s", m.name, unit)
	r := rand.New(rand.NewPCG(m.seed, h.Sum64()))
	draw := func(s Span) int64 { return s.Min + r.Int64N(s.Max-s.Min+1) }
	over := func(n int64) int64 { return int64(math.Ceil(float64(n) * (1 + r.Float64()*t.EstimateError))) }
	in, out := draw(t.Input), draw(t.Output)
	estimate = over(in)
	if t.MaxTokens > 0 {
		estimate += t.MaxTokens
	} else {
		estimate += over(out)
	}
	return in + out, estimate
}

// tokenState returns what the mock has left of its token limit at now
// (its own count of the arrivals within its window), and how long until
// all of them have left it.
func (m *mock) tokenState(now time.Time) (remaining int64, reset time.Duration) {
	t := m.cfg.Tokens
	m.mu.Lock()
	defer m.mu.Unlock()
	m.foreignUpTo(now)
	if t.MockBucket {
		level := m.bucketLevel(now)
		rate := float64(t.MockLimit) / float64(t.Window.D())
		return max(int64(level), 0), time.Duration((float64(t.MockLimit) - level) / rate)
	}
	cut := now.Add(-t.Window.D())
	var used int64
	var last time.Time
	for _, c := range m.foreign {
		if c.start.After(cut) && !c.start.After(now) {
			used += c.tokens
			if c.start.After(last) {
				last = c.start
			}
		}
	}
	for i := len(m.calls) - 1; i >= 0; i-- {
		c := m.calls[i]
		if c.start.After(now) {
			continue // not arrived yet at now
		}
		if !c.start.After(cut) {
			if c.start.Before(cut.Add(-time.Second)) {
				break // calls are appended in arrival order, give or take the wire's jitter
			}
			continue
		}
		used += c.tokens
		if c.start.After(last) {
			last = c.start
		}
	}
	if !last.IsZero() {
		reset = last.Add(t.Window.D()).Sub(now)
	}
	return max(t.MockLimit-used, 0), reset
}

// arrive records a call arriving at start (its arrival) and returns its
// index, and whether the hidden limit refuses it. The call is unit's; a
// batch's call (batch: its units, unit's first) uses its units' tokens.
func (m *mock) arrive(unit string, attempt int, start time.Time, batch ...string) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	use, _ := m.tokens(unit)
	if len(batch) > 0 {
		use = 0
		for _, u := range batch {
			n, _ := m.tokens(u)
			use += n
		}
	}
	refused := m.overHidden(start)
	if t := m.cfg.Tokens; t != nil && (t.Shared != nil || t.Enforce) {
		m.foreignUpTo(start)
		if m.room(start) < use {
			refused, use = true, 0 // a refused call uses nothing
		}
	}
	m.recorded(start)
	m.calls = append(m.calls, call{unit: unit, attempt: attempt, start: start, tokens: use, refused: refused})
	m.inflight++
	if m.cfg.Behavior.MockWindow > 0 {
		s := start.Sub(m.epoch).Seconds()
		cut := s - m.cfg.Behavior.MockWindow.D().Seconds()
		i := 0
		for i < len(m.window) && m.window[i] <= cut {
			i++
		}
		m.window = append(m.window[i:], s)
	}
	return len(m.calls) - 1, refused
}

// hiddenAt is the hidden limit in force at t (0: none).
func (m *mock) hiddenAt(t time.Time) int {
	b := m.cfg.Behavior
	if b.HiddenLimit == 0 || (b.HiddenUntil > 0 && t.Sub(m.epoch) >= b.HiddenUntil.D()) {
		return 0
	}
	return b.HiddenLimit
}

// overHidden reports whether the hidden limit refuses a call arriving at
// t: the calls served in the rate window ending at t reach it. m.mu is
// held.
func (m *mock) overHidden(t time.Time) bool {
	limit := m.hiddenAt(t)
	if limit == 0 {
		return false
	}
	cut := t.Add(-m.cfg.RateWindow.D())
	served := 0
	for i := len(m.calls) - 1; i >= 0; i-- {
		c := m.calls[i]
		if !c.start.After(cut) {
			if c.start.Before(cut.Add(-time.Second)) {
				break // calls are appended in arrival order, give or take the wire's jitter
			}
			continue
		}
		if !c.refused && !c.start.After(t) {
			served++
		}
	}
	return served >= limit
}

// counted returns the tokens the mock counted of call i: nothing if it
// refused it.
func (m *mock) counted(i int) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[i].tokens
}

// leave records the end of call i and its answer.
func (m *mock) leave(i int, end time.Time, v verdict, retryAfter time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[i].end, m.calls[i].answer = end, v
	m.inflight--
	if v == answerTooMany {
		m.holds = append(m.holds, hold{from: end, until: end.Add(retryAfter)})
	}
}

// live is what the TUI shows of a mock.
type live struct {
	inflight, inWindow, calls int
}

func (m *mock) live(now time.Time) live {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	cut := now.Sub(m.epoch).Seconds() - m.cfg.Behavior.MockWindow.D().Seconds()
	for _, s := range m.window {
		if s > cut {
			n++
		}
	}
	return live{inflight: m.inflight, inWindow: n, calls: len(m.calls)}
}

// checks are the server-side verdicts on a mock's calls.
type checks struct {
	Calls int `json:"calls"`
	// RateViolations counts calls beyond MockLimit in a sliding
	// MockWindow ending at their arrival.
	RateViolations int `json:"rate_violations"`
	// MaxInWindow is the most calls seen in any MockWindow (or runcue's
	// rate window when the mock has none of its own).
	MaxInWindow int `json:"max_in_window"`
	// MaxConcurrent is the most calls in progress at once;
	// ConcurrencyViolations counts arrivals beyond MockConcurrent.
	MaxConcurrent         int `json:"max_concurrent"`
	ConcurrencyViolations int `json:"concurrency_violations"`
	// RetryAfterViolations counts calls sent after a Retry-After this mock
	// answered (their arrival less the wire's delay) that arrived while it
	// was still running.
	RetryAfterViolations int            `json:"retry_after_violations"`
	Answers              map[string]int `json:"answers"`
	// With a token limit: TokenViolations counts arrivals that took the
	// tokens in a sliding window of the limit's beyond Tokens.MockLimit;
	// MaxTokensInWindow is the most tokens seen in one; TokenUtilisation
	// is the tokens that arrived from one window after the first arrival
	// to the end of submissions, against MockLimit per window over that
	// span (0 when the span is shorter than a window).
	TokenViolations   int     `json:"token_violations,omitempty"`
	MaxTokensInWindow int64   `json:"max_tokens_in_window,omitempty"`
	TokenUtilisation  float64 `json:"token_utilisation,omitempty"`
	// Hidden reports a hidden limit's effect (Behavior.HiddenLimit).
	Hidden *hiddenStats `json:"hidden,omitempty"`
	// Shared reports a shared key's figures (Tokens.Shared).
	Shared *SharedStats `json:"shared,omitempty"`
	// Headers are a meter read from the headers' figures
	// (Tokens.FromProvider).
	Headers *HeadersStats `json:"headers,omitempty"`
}

// hiddenStats is what a hidden limit did over the second half of the
// time it was hidden (From to To: of HiddenUntil, or of the submissions
// when it is never lifted): the calls that arrived, those it refused
// (429), and those served as a fraction of the hidden limit over that
// span (Throughput); once lifted, how long until the calls served in a
// rate window first reached 90% of rate_limit (Follow; -1 if never).
type hiddenStats struct {
	From       Duration `json:"from"`
	To         Duration `json:"to"`
	Calls      int      `json:"calls"`
	Refused    int      `json:"refused"`
	RefusedPct float64  `json:"refused_pct"`
	Throughput float64  `json:"throughput"`
	Follow     Duration `json:"follow,omitzero"`
}

// checkHidden computes the hidden limit's figures of the calls cs, by
// arrival.
func (m *mock) checkHidden(cs []call) *hiddenStats {
	b := m.cfg.Behavior
	end := m.until
	if b.HiddenUntil > 0 {
		end = b.HiddenUntil.D()
	}
	hs := &hiddenStats{From: Duration(end / 2), To: Duration(end)}
	from, to := m.epoch.Add(end/2), m.epoch.Add(end)
	served := 0
	for _, c := range cs {
		if c.start.After(from) && !c.start.After(to) {
			hs.Calls++
			if c.refused {
				hs.Refused++
			} else {
				served++
			}
		}
	}
	win := m.cfg.RateWindow.D()
	if hs.Calls > 0 {
		hs.RefusedPct = round4(100 * float64(hs.Refused) / float64(hs.Calls))
	}
	if end > 0 {
		hs.Throughput = round4(float64(served) / (float64(b.HiddenLimit) * (end / 2).Seconds() / win.Seconds()))
	}
	if b.HiddenUntil > 0 {
		hs.Follow = -1
		lifted := m.epoch.Add(b.HiddenUntil.D())
		goal := int(math.Ceil(0.9 * float64(m.cfg.RateLimit)))
		var in []time.Time // served arrivals after the lift, in the window
		for _, c := range cs {
			if c.refused || !c.start.After(lifted) {
				continue
			}
			in = append(in, c.start)
			for len(in) > 0 && !in[0].After(c.start.Add(-win)) {
				in = in[1:]
			}
			if len(in) >= goal {
				hs.Follow = Duration(c.start.Sub(lifted))
				break
			}
		}
	}
	return hs
}

// checkTokens computes the token verdicts of the calls cs, by arrival.
func (m *mock) checkTokens(ch *checks, cs []call, t *Tokens) {
	if t.MockBucket && t.Shared == nil && !t.Enforce {
		// (A mock that enforces its bucket refuses what does not fit:
		// its 429s are runcue's violations, counted by the shared key's
		// and the headers' checks. Replayed in arrival order, a call it
		// served might find the bucket short by a call that arrived
		// first though it started later, which the mock, deciding at
		// each call's start, had not seen yet.)
		m.mu.Lock()
		ch.TokenViolations = m.bucketViolations()
		m.mu.Unlock()
	}
	win := t.Window.D()
	var sum int64
	j := 0
	for i := range cs {
		sum += cs[i].tokens
		for !cs[j].start.After(cs[i].start.Add(-win)) {
			sum -= cs[j].tokens
			j++
		}
		ch.MaxTokensInWindow = max(ch.MaxTokensInWindow, sum)
		if sum > t.MockLimit && !t.MockBucket {
			ch.TokenViolations++
		}
	}
	from, to := cs[0].start.Add(win), m.epoch.Add(m.until)
	if span := to.Sub(from); span >= win {
		var used int64
		for _, c := range cs {
			if c.start.After(from) && !c.start.After(to) {
				used += c.tokens
			}
		}
		ch.TokenUtilisation = round4(float64(used) / (float64(t.MockLimit) * span.Seconds() / win.Seconds()))
	}
}

// sortedCalls returns the calls by arrival, ties by unit and attempt: an
// order that does not depend on goroutine scheduling.
func (m *mock) sortedCalls() []call {
	m.mu.Lock()
	cs := slices.Clone(m.calls)
	m.mu.Unlock()
	slices.SortFunc(cs, func(a, b call) int {
		if c := a.start.Compare(b.start); c != 0 {
			return c
		}
		if a.unit != b.unit {
			if a.unit < b.unit {
				return -1
			}
			return 1
		}
		return a.attempt - b.attempt
	})
	return cs
}

// check computes the server-side verdicts. A call counts against the
// window from its arrival for exactly one window: the window is the
// half-open interval (t-W, t], as runcue's.
func (m *mock) check() checks {
	cs := m.sortedCalls()
	b := m.cfg.Behavior
	ch := checks{Calls: len(cs), Answers: map[string]int{}}
	win := b.MockWindow.D()
	if win == 0 {
		win = m.cfg.RateWindow.D()
	}
	if win > 0 {
		j := 0
		for i := range cs {
			for !cs[j].start.After(cs[i].start.Add(-win)) {
				j++
			}
			n := i - j + 1
			ch.MaxInWindow = max(ch.MaxInWindow, n)
			if b.MockLimit > 0 && n > b.MockLimit {
				ch.RateViolations++
			}
		}
	}
	if t := m.cfg.Tokens; t != nil && len(cs) > 0 {
		m.checkTokens(&ch, cs, t)
		ch.Shared = m.sharedStats(cs)
		ch.Headers = m.headersStats(cs)
	}
	if b.HiddenLimit > 0 && m.cfg.RateWindow > 0 {
		ch.Hidden = m.checkHidden(cs)
	}
	// Concurrency: calls are [start, end); an end at an instant frees its
	// place before a start at that instant.
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, c := range cs {
		ch.Answers[c.answer.String()]++
		end := c.end
		if end.IsZero() {
			end = time.Unix(1<<40, 0) // still in progress
		}
		edges = append(edges, edge{c.start, 1}, edge{end, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	n := 0
	for _, e := range edges {
		n += e.delta
		ch.MaxConcurrent = max(ch.MaxConcurrent, n)
		if e.delta > 0 && b.MockConcurrent > 0 && n > b.MockConcurrent {
			ch.ConcurrencyViolations++
		}
	}
	m.mu.Lock()
	holds := slices.Clone(m.holds)
	m.mu.Unlock()
	for _, h := range holds {
		i, _ := slices.BinarySearchFunc(cs, h.from, func(c call, t time.Time) int {
			if c.start.After(t) {
				return 1
			}
			return -1
		})
		for ; i < len(cs) && cs[i].start.Before(h.until); i++ {
			// A call its client sent before the 429 was answered could not
			// have been held back: only those sent after it count.
			if sent := cs[i].start.Add(-m.wire(cs[i].unit, cs[i].attempt)); !sent.Before(h.from) {
				ch.RetryAfterViolations++
			}
		}
	}
	return ch
}

// tokenHeaders are the headers of a response at now, in the shape of
// Tokens.Headers: the limit, what the mock's own count leaves of it, and
// when it is whole again.
func (m *mock) tokenHeaders(arrival, now time.Time) http.Header {
	t := m.cfg.Tokens
	rem, reset := m.tokenState(arrival)
	reset = max(reset-now.Sub(arrival), 0)
	h := http.Header{}
	if t.Headers == "anthropic" {
		h.Set("Anthropic-Ratelimit-Tokens-Limit", strconv.FormatInt(t.MockLimit, 10))
		h.Set("Anthropic-Ratelimit-Tokens-Remaining", strconv.FormatInt(rem, 10))
		h.Set("Anthropic-Ratelimit-Tokens-Reset", now.Add(reset).UTC().Format(time.RFC3339))
		return h
	}
	h.Set("X-Ratelimit-Limit-Tokens", strconv.FormatInt(t.MockLimit, 10))
	h.Set("X-Ratelimit-Remaining-Tokens", strconv.FormatInt(rem, 10))
	h.Set("X-Ratelimit-Reset-Tokens", reset.String())
	return h
}

// foreignUpTo sends the other client's requests (Tokens.Shared) due up to
// now, each served if its tokens fit in the window at its arrival, else
// refused. m.mu is held.
func (m *mock) foreignUpTo(now time.Time) {
	t := m.cfg.Tokens
	if t == nil || t.Shared == nil {
		return
	}
	every := t.Shared.Every.D()
	size := int64(t.Shared.Share * float64(t.MockLimit) * float64(every) / float64(t.Window.D()))
	next := func() time.Duration { return every }
	if t.Shared.Arrivals == "poisson" {
		if m.foreignRng == nil {
			m.foreignRng = rand.New(rand.NewPCG(m.seed, 0x5f0e1a))
		}
		next = func() time.Duration { return time.Duration(m.foreignRng.ExpFloat64() * float64(every)) }
	}
	for ; !m.epoch.Add(m.nextForeign).After(now); m.nextForeign += next() {
		at := m.epoch.Add(m.nextForeign)
		c := call{unit: "", start: at, end: at, tokens: size}
		if m.room(at) < size {
			c.refused, c.tokens = true, 0
		}
		m.recorded(at)
		m.foreign = append(m.foreign, c)
	}
}

// tokensAt is what the window ending at t holds: the tokens of the calls
// served (runcue's and the other client's) that arrived in it. m.mu is
// held.
func (m *mock) tokensAt(t time.Time) int64 {
	cut := t.Add(-m.cfg.Tokens.Window.D())
	var used int64
	for _, cs := range [][]call{m.calls, m.foreign} {
		for i := len(cs) - 1; i >= 0; i-- {
			c := cs[i]
			if !c.start.After(cut) {
				if c.start.Before(cut.Add(-time.Second)) {
					break // appended in arrival order, give or take the wire's jitter
				}
				continue
			}
			if !c.start.After(t) {
				used += c.tokens
			}
		}
	}
	return used
}

// SharedStats are a shared key's figures (Tokens.Shared), from Window
// after the start to the end of the submissions: runcue's calls and the
// share of them answered 429 for tokens, runcue's tokens served as a
// fraction of what the other client's served tokens left of the limit,
// and the other client's requests and the share of them refused.
type SharedStats struct {
	Calls          int     `json:"calls"`
	RefusedPct     float64 `json:"refused_pct"`
	OfLeft         float64 `json:"of_left"`
	Foreign        int     `json:"foreign"`
	ForeignRefused float64 `json:"foreign_refused_pct"`
	// ForeignAlone is the share of the other client's requests the mock
	// would have refused with runcue absent.
	ForeignAlone float64 `json:"foreign_refused_alone_pct"`
}

// sharedStats computes the shared key's figures of the calls cs (by
// arrival).
func (m *mock) sharedStats(cs []call) *SharedStats {
	t := m.cfg.Tokens
	if t == nil || t.Shared == nil {
		return nil
	}
	m.mu.Lock()
	foreign := slices.Clone(m.foreign)
	m.mu.Unlock()
	win := t.Window.D()
	from, to := m.epoch.Add(win), m.epoch.Add(m.until)
	st := &SharedStats{}
	var refused, ours, theirs int64
	for _, c := range cs {
		if c.start.After(from) && !c.start.After(to) {
			st.Calls++
			if c.refused {
				refused++
			}
			ours += c.tokens
		}
	}
	var frefused int
	for _, c := range foreign {
		if c.start.After(from) && !c.start.After(to) {
			st.Foreign++
			if c.refused {
				frefused++
			}
			theirs += c.tokens
		}
	}
	if st.Calls > 0 {
		st.RefusedPct = round4(100 * float64(refused) / float64(st.Calls))
	}
	if st.Foreign > 0 {
		st.ForeignRefused = round4(100 * float64(frefused) / float64(st.Foreign))
		st.ForeignAlone = round4(100 * m.foreignAlone(foreign, from, to))
	}
	if span := to.Sub(from); span > 0 {
		left := float64(t.MockLimit)*span.Seconds()/win.Seconds() - float64(theirs)
		if left > 0 {
			st.OfLeft = round4(float64(ours) / left)
		}
	}
	return st
}

// foreignAlone replays the other client's requests (by arrival) alone
// through the mock's limit and returns the share of those that arrived
// after from, up to to, that it would have refused.
func (m *mock) foreignAlone(foreign []call, from, to time.Time) float64 {
	t := m.cfg.Tokens
	size := int64(t.Shared.Share * float64(t.MockLimit) * float64(t.Shared.Every.D()) / float64(t.Window.D()))
	win, limit := t.Window.D(), float64(t.MockLimit)
	rate := limit / float64(win)
	level, at := limit, m.epoch
	var served []time.Time
	n, refused := 0, 0
	for _, c := range foreign {
		fits := false
		if t.MockBucket {
			level = min(limit, level+rate*float64(c.start.Sub(at)))
			at = c.start
			if fits = level >= float64(size)-1e-6; fits {
				level -= float64(size)
			}
		} else {
			i := 0
			for i < len(served) && !served[i].After(c.start.Add(-win)) {
				i++
			}
			served = served[i:]
			if fits = float64(int64(len(served)+1)*size) <= limit; fits {
				served = append(served, c.start)
			}
		}
		if c.start.After(from) && !c.start.After(to) {
			n++
			if !fits {
				refused++
			}
		}
	}
	if n == 0 {
		return 0
	}
	return float64(refused) / float64(n)
}

// room is what the mock's token limit has left at t: the window's limit
// less what it holds, or the bucket's level. m.mu is held.
func (m *mock) room(t time.Time) int64 {
	if m.cfg.Tokens.MockBucket {
		return int64(m.bucketLevel(t))
	}
	return m.cfg.Tokens.MockLimit - m.tokensAt(t)
}

// bucketCalls returns the calls the bucket counts (runcue's and the other
// client's, refused ones using nothing) that arrived by t, by arrival,
// from the calls[from] and foreign[fromForeign] on. m.mu is held.
func (m *mock) bucketCalls(t time.Time, from, fromForeign int) []call {
	var cs []call
	for _, l := range [][]call{m.calls[from:], m.foreign[fromForeign:]} {
		for _, c := range l {
			if !c.start.After(t) && c.tokens > 0 {
				cs = append(cs, c)
			}
		}
	}
	slices.SortStableFunc(cs, func(a, b call) int { return a.start.Compare(b.start) })
	return cs
}

// bucketLevel is what the token bucket holds at t (Tokens.MockBucket):
// full at the epoch, refilled MockLimit per Window up to MockLimit, each
// call's tokens taken at its arrival. It replays the calls from the mark,
// which it first moves up to bucketLag before t. m.mu is held.
func (m *mock) bucketLevel(t time.Time) float64 {
	mk := &m.mark
	if !mk.valid || t.Before(mk.at) {
		*mk = bucketMark{valid: true, level: float64(m.cfg.Tokens.MockLimit), at: m.epoch}
	}
	if upTo := t.Add(-bucketLag); upTo.After(mk.at) {
		i, j := mk.calls, mk.foreign
		for i < len(m.calls) && !m.calls[i].start.After(upTo) {
			i++
		}
		for j < len(m.foreign) && !m.foreign[j].start.After(upTo) {
			j++
		}
		var cs []call // the prefixes' calls, all arrived by upTo
		for _, c := range slices.Concat(m.calls[mk.calls:i], m.foreign[mk.foreign:j]) {
			if c.tokens > 0 {
				cs = append(cs, c)
			}
		}
		slices.SortStableFunc(cs, func(a, b call) int { return a.start.Compare(b.start) })
		mk.level, _ = m.replayBucket(cs, mk.level, mk.at, upTo)
		mk.at, mk.calls, mk.foreign = upTo, i, j
	}
	level, _ := m.replayBucket(m.bucketCalls(t, mk.calls, mk.foreign), mk.level, mk.at, t)
	return level
}

// recorded notes a call or foreign request recorded at start: one that
// arrived before the mark (never in a virtual run) makes the mark replay
// from the epoch. m.mu is held.
func (m *mock) recorded(start time.Time) {
	if m.mark.valid && !start.After(m.mark.at) {
		m.mark.valid = false
	}
}

// bucketViolations counts the calls that found the bucket holding less
// than their tokens at their arrival. m.mu is held.
func (m *mock) bucketViolations() int {
	_, n := m.replayBucket(m.bucketCalls(time.Unix(1<<40, 0), 0, 0), float64(m.cfg.Tokens.MockLimit), m.epoch, time.Time{})
	return n
}

// replayBucket replays cs (by arrival) through the bucket, from level at
// at: its level at until (zero: at the last call), and how many calls
// found it short.
func (m *mock) replayBucket(cs []call, level float64, at, until time.Time) (float64, int) {
	tk := m.cfg.Tokens
	capacity := float64(tk.MockLimit)
	rate := capacity / float64(tk.Window.D())
	short := 0
	for _, c := range cs {
		level = min(capacity, level+rate*float64(c.start.Sub(at)))
		at = c.start
		if level < float64(c.tokens)-1e-6 {
			short++
		}
		level -= float64(c.tokens)
	}
	if !until.IsZero() && until.After(at) {
		level = min(capacity, level+rate*float64(until.Sub(at)))
	}
	return level, short
}
