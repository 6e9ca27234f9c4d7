package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/runcue/runcue"
)

// Duration is a time.Duration in YAML: a Go duration string ("200ms",
// "1h30m") or a number of seconds (the spec's rate_window: 60).
type Duration time.Duration

// UnmarshalYAML reads a duration string or a number of seconds.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: a duration must be a string or a number", n.Line)
	}
	if s, err := strconv.ParseFloat(n.Value, 64); err == nil {
		*d = Duration(s * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// MarshalText writes the duration as a Go duration string (JSON reports).
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads a Go duration string (JSON, the recovery child's
// configuration).
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// D returns the duration as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Latency is a latency distribution: normal (mean, stddev), uniform (min,
// max) or lognormal (median, sigma), each with an outlier rate whose draws
// are multiplied by outlier_multiplier.
type Latency struct {
	Distribution      string   `yaml:"distribution" json:"distribution"`
	Mean              Duration `yaml:"mean,omitempty" json:"mean,omitzero"`
	Stddev            Duration `yaml:"stddev,omitempty" json:"stddev,omitzero"`
	Min               Duration `yaml:"min,omitempty" json:"min,omitzero"`
	Max               Duration `yaml:"max,omitempty" json:"max,omitzero"`
	Median            Duration `yaml:"median,omitempty" json:"median,omitzero"`
	Sigma             float64  `yaml:"sigma,omitempty" json:"sigma,omitempty"`
	OutlierRate       float64  `yaml:"outlier_rate,omitempty" json:"outlier_rate,omitempty"`
	OutlierMultiplier float64  `yaml:"outlier_multiplier,omitempty" json:"outlier_multiplier,omitempty"`
}

// mean returns the distribution's mean, outliers included.
func (l Latency) mean() time.Duration {
	var m float64
	switch l.Distribution {
	case "uniform":
		m = float64(l.Min+l.Max) / 2
	case "lognormal":
		m = float64(l.Median) * math.Exp(l.Sigma*l.Sigma/2)
	default:
		m = float64(l.Mean)
	}
	if l.OutlierRate > 0 {
		m *= 1 + l.OutlierRate*(l.OutlierMultiplier-1)
	}
	return time.Duration(m)
}

// Behavior is how a mock service answers.
type Behavior struct {
	Latency Latency `yaml:"latency" json:"latency"`
	// ErrorRate fails a call with a retryable error; TimeoutRate makes it
	// hang until runcue's timeout; PermanentErrorRate fails it for good;
	// RateLimitedRate answers 429 with a Retry-After of RetryAfter.
	ErrorRate          float64  `yaml:"error_rate,omitempty" json:"error_rate,omitempty"`
	TimeoutRate        float64  `yaml:"timeout_rate,omitempty" json:"timeout_rate,omitempty"`
	PermanentErrorRate float64  `yaml:"permanent_error_rate,omitempty" json:"permanent_error_rate,omitempty"`
	RateLimitedRate    float64  `yaml:"rate_limited_rate,omitempty" json:"rate_limited_rate,omitempty"`
	RetryAfter         Duration `yaml:"retry_after,omitempty" json:"retry_after,omitzero"`
	// CircuitTest makes the service fail every call in bursts: for
	// BurstLength out of every BurstEvery (defaults 30s of 5m), from
	// FailFrom on.
	CircuitTest bool     `yaml:"circuit_test,omitempty" json:"circuit_test,omitempty"`
	BurstEvery  Duration `yaml:"burst_every,omitempty" json:"burst_every,omitzero"`
	BurstLength Duration `yaml:"burst_length,omitempty" json:"burst_length,omitzero"`
	// FailFrom and FailFor make the service fail every call from FailFrom
	// (after the run's start) for FailFor: a hard outage.
	FailFrom Duration `yaml:"fail_from,omitempty" json:"fail_from,omitzero"`
	FailFor  Duration `yaml:"fail_for,omitempty" json:"fail_for,omitzero"`
	// MockLimit and MockWindow are the server-side limiter: the mock
	// counts the calls it receives on a sliding window of its own and
	// reports each call beyond MockLimit in any MockWindow as a
	// violation. Default: the service's rate_limit and rate_window. Set a
	// lower limit to see the check fail.
	MockLimit  int      `yaml:"mock_limit,omitempty" json:"mock_limit,omitempty"`
	MockWindow Duration `yaml:"mock_window,omitempty" json:"mock_window,omitzero"`
	// HiddenLimit, when set, is the service's real limit per
	// rate_window, below the rate_limit runcue is told: a call arriving
	// when the calls the mock served in the window ending at its arrival
	// reach it is answered 429 with a Retry-After of RetryAfter, and no
	// header says more. HiddenUntil, when set, is when the hidden limit
	// is lifted (from then on the service grants rate_limit).
	HiddenLimit int      `yaml:"hidden_limit,omitempty" json:"hidden_limit,omitempty"`
	HiddenUntil Duration `yaml:"hidden_until,omitempty" json:"hidden_until,omitzero"`
	// MockConcurrent is the server-side concurrency limit (default the
	// service's max_concurrent).
	MockConcurrent int `yaml:"mock_concurrent,omitempty" json:"mock_concurrent,omitempty"`
	// WireMin and WireMax bound the transport delay from a handler's start
	// to its call's arrival at the mock, drawn per call from the seed
	// (default 1ms to 4ms, as measured against local mock servers). The
	// mock counts every call at its arrival, as a real service does.
	WireMin Duration `yaml:"wire_min,omitempty" json:"wire_min,omitzero"`
	WireMax Duration `yaml:"wire_max,omitempty" json:"wire_max,omitzero"`
	// Stream, when above zero, streams each answer that succeeds: its
	// status and headers reach the handler at this fraction of the
	// answer's latency (its first byte), its usage only with its last
	// event, as an LLM API's streamed answers do.
	Stream float64 `yaml:"stream,omitempty" json:"stream,omitempty"`
}

// ServiceConfig is a mock service: runcue's limits for it, and its
// behaviour.
type ServiceConfig struct {
	MaxConcurrent    int      `yaml:"max_concurrent,omitempty" json:"max_concurrent,omitempty"`
	RateLimit        int      `yaml:"rate_limit,omitempty" json:"rate_limit,omitempty"`
	RateWindow       Duration `yaml:"rate_window,omitempty" json:"rate_window,omitzero"`
	CircuitThreshold int      `yaml:"circuit_threshold,omitempty" json:"circuit_threshold,omitempty"`
	CircuitTimeout   Duration `yaml:"circuit_timeout,omitempty" json:"circuit_timeout,omitzero"`
	// Margin is runcue's Service.Margin (default runcue's: 10ms; negative
	// for none).
	Margin   Duration `yaml:"margin,omitempty" json:"margin,omitzero"`
	Behavior Behavior `yaml:"behavior" json:"behavior"`
	// Tokens, when set, makes the service an LLM API that also limits
	// tokens.
	Tokens *Tokens `yaml:"tokens,omitempty" json:"tokens,omitempty"`
	// Adaptive makes runcue's limits of the service adaptive
	// (runcue.Service.Adaptive, default fractions).
	Adaptive bool `yaml:"adaptive,omitempty" json:"adaptive,omitempty"`
}

// Tokens is an LLM API's token limit and its calls' token use. runcue
// meters "tokens" (Limit per Window, Charge); each call uses Input plus
// Output tokens (uniform in [min, max], drawn from the seed and the unit),
// which the mock counts at the call's arrival and the handler reports
// (Work.Used). The unit's cost, estimated at submit, is its input
// overestimated by up to EstimateError (uniform) plus MaxTokens, the
// output it reserves (or, without MaxTokens, its output overestimated the
// same way), so an estimate is never below the call's use. The mock
// answers with its own count in the headers of Headers' shape (openai or
// anthropic; none: no headers), which the handler reports
// (httplimit.Report).
type Tokens struct {
	Limit         int64    `yaml:"limit" json:"limit"`
	Window        Duration `yaml:"window" json:"window"`
	Charge        string   `yaml:"charge,omitempty" json:"charge,omitempty"`
	Input         Span     `yaml:"input" json:"input"`
	Output        Span     `yaml:"output" json:"output"`
	MaxTokens     int64    `yaml:"max_tokens,omitempty" json:"max_tokens,omitempty"`
	EstimateError float64  `yaml:"estimate_error,omitempty" json:"estimate_error,omitempty"`
	Headers       string   `yaml:"headers,omitempty" json:"headers,omitempty"`
	// MockLimit is the mock's own token limit per Window (default Limit).
	MockLimit int64 `yaml:"mock_limit,omitempty" json:"mock_limit,omitempty"`
	// Shared, when set, makes the key a shared one: another client uses
	// it too, and the mock enforces MockLimit at arrival, answering 429
	// (Behavior.RetryAfter) to a call of runcue's or the other client's
	// whose tokens do not fit in its window.
	Shared *Shared `yaml:"shared,omitempty" json:"shared,omitempty"`
	// FromProvider declares runcue's meter as read from the mock's
	// headers (Meter.FromProvider): Limit is only its starting value,
	// MaxLimit its cap (0: none). Enforce makes the mock refuse, 429, a
	// call whose tokens do not fit in its window at arrival (as a shared
	// key does).
	FromProvider bool  `yaml:"from_provider,omitempty" json:"from_provider,omitempty"`
	MaxLimit     int64 `yaml:"max_limit,omitempty" json:"max_limit,omitempty"`
	Enforce      bool  `yaml:"enforce,omitempty" json:"enforce,omitempty"`
	// MockBucket makes the mock's limit a continuously refilling bucket
	// (as Anthropic describes its limits) instead of a sliding window:
	// it holds MockLimit, full at the start, refills MockLimit per
	// Window, and a call takes its tokens at arrival; a call that finds
	// less than its tokens is a violation (refused with Enforce). Bucket
	// declares runcue's meter a bucket too (Meter.Bucket).
	MockBucket bool `yaml:"mock_bucket,omitempty" json:"mock_bucket,omitempty"`
	Bucket     bool `yaml:"bucket,omitempty" json:"bucket,omitempty"`
}

// Shared is the other client of a shared key: every Every it sends a
// request of Share of MockLimit per Window's worth of tokens (Share *
// MockLimit * Every / Window), from the run's start: steadily, or with
// Arrivals "poisson" at random instants Every apart on average (a
// Poisson process of rate 1/Every, drawn from the run's seed).
type Shared struct {
	Share    float64  `yaml:"share" json:"share"`
	Every    Duration `yaml:"every,omitempty" json:"every,omitzero"`
	Arrivals string   `yaml:"arrivals,omitempty" json:"arrivals,omitempty"`
}

// Span is a uniform range of token counts.
type Span struct {
	Min int64 `yaml:"min" json:"min"`
	Max int64 `yaml:"max" json:"max"`
}

// mean returns the calls' mean use.
func (t *Tokens) mean() float64 {
	return float64(t.Input.Min+t.Input.Max+t.Output.Min+t.Output.Max) / 2
}

// normalize fills the defaults and checks t.
func (t *Tokens) normalize() error {
	switch {
	case t.Limit <= 0 || t.Window <= 0:
		return errors.New("tokens: set limit and window")
	case t.Input.Min < 0 || t.Input.Max < t.Input.Min || t.Output.Min < 0 || t.Output.Max < t.Output.Min:
		return errors.New("tokens: input and output need 0 <= min <= max")
	case t.MaxTokens > 0 && t.MaxTokens < t.Output.Max:
		return errors.New("tokens: max_tokens below output's max")
	case t.EstimateError < 0:
		return errors.New("tokens: negative estimate_error")
	}
	switch t.Headers {
	case "":
		t.Headers = "openai"
	case "openai", "anthropic", "none":
	default:
		return fmt.Errorf("tokens: unknown headers %q (openai, anthropic or none)", t.Headers)
	}
	var c runcue.Charge
	if err := c.UnmarshalText([]byte(t.Charge)); err != nil {
		return fmt.Errorf("tokens: %w", err)
	}
	if t.MockLimit == 0 {
		t.MockLimit = t.Limit
	}
	if s := t.Shared; s != nil {
		if s.Every == 0 {
			s.Every = Duration(100 * time.Millisecond)
		}
		if s.Share <= 0 || s.Share >= 1 || s.Every < Duration(time.Millisecond) || s.Every > t.Window {
			return errors.New("tokens: shared needs 0 < share < 1 and 1ms <= every <= window")
		}
		if s.Arrivals != "" && s.Arrivals != "fixed" && s.Arrivals != "poisson" {
			return fmt.Errorf("tokens: shared arrivals %q (fixed or poisson)", s.Arrivals)
		}
	}
	return nil
}

// capacity returns the units per second the service can take: the least
// of its concurrency over the mean latency and its rate.
func (s ServiceConfig) capacity() float64 {
	c := math.Inf(1)
	if s.MaxConcurrent > 0 {
		if m := s.Behavior.Latency.mean(); m > 0 {
			c = float64(s.MaxConcurrent) / m.Seconds()
		}
	}
	if s.RateLimit > 0 && s.RateWindow > 0 {
		c = min(c, float64(s.RateLimit)/s.RateWindow.D().Seconds())
	}
	if t := s.Tokens; t != nil && t.mean() > 0 {
		c = min(c, float64(t.Limit)/t.Window.D().Seconds()/t.mean())
	}
	return c
}

// Workload is the work the simulator submits.
type Workload struct {
	// Pattern is none, single, chain, fan_out, fan_in, diamond, complex,
	// circular or random (drawn by PatternWeights).
	Pattern        string             `yaml:"pattern" json:"pattern"`
	PatternWeights map[string]float64 `yaml:"pattern_weights,omitempty" json:"pattern_weights,omitempty"`
	FanOutWidth    int                `yaml:"fan_out_width,omitempty" json:"fan_out_width,omitempty"`
	FanInWidth     int                `yaml:"fan_in_width,omitempty" json:"fan_in_width,omitempty"`
	ChainDepth     int                `yaml:"chain_depth,omitempty" json:"chain_depth,omitempty"`
	// TaskTypes are cycled through, unit by unit; TaskServices maps each
	// to the services it uses (default: the i-th task type uses the i-th
	// service, by name, cyclically).
	TaskTypes    []string            `yaml:"task_types,omitempty" json:"task_types,omitempty"`
	TaskServices map[string][]string `yaml:"task_services,omitempty" json:"task_services,omitempty"`
	// Rate is the submission rate in units per second; Load, used when
	// Rate is 0, sets it as a fraction of the services' capacity.
	Rate float64 `yaml:"rate,omitempty" json:"rate,omitempty"`
	Load float64 `yaml:"load,omitempty" json:"load,omitempty"`
	// Order is how a group's units are submitted: natural (dependencies
	// first), reversed (dependents first) or shuffled; mixed draws one per
	// group. Default mixed.
	Order string `yaml:"order,omitempty" json:"order,omitempty"`
	// HighFraction of the units get priority 1, the rest 0. HighRate, when
	// set, is a separate stream of high-priority units per second on top.
	HighFraction float64 `yaml:"high_fraction,omitempty" json:"high_fraction,omitempty"`
	HighRate     float64 `yaml:"high_rate,omitempty" json:"high_rate,omitempty"`
	// Aging, when set, lets waiting units catch up with high priority:
	// the score is max(priority, wait/aging).
	Aging Duration `yaml:"aging,omitempty" json:"aging,omitzero"`
	// Timeout bounds each run; MaxAttempts and BaseDelay are the retry
	// policy.
	Timeout     Duration `yaml:"timeout,omitempty" json:"timeout,omitzero"`
	MaxAttempts int      `yaml:"max_attempts,omitempty" json:"max_attempts,omitempty"`
	BaseDelay   Duration `yaml:"base_delay,omitempty" json:"base_delay,omitzero"`
	// MaxQueued bounds the queue (runcue's backpressure); submissions
	// refused by it are counted.
	MaxQueued int `yaml:"max_queued,omitempty" json:"max_queued,omitempty"`
	// Burst multiplies the rate by BurstFactor during BurstLength from
	// BurstAt.
	BurstAt     Duration `yaml:"burst_at,omitempty" json:"burst_at,omitzero"`
	BurstLength Duration `yaml:"burst_length,omitempty" json:"burst_length,omitzero"`
	BurstFactor float64  `yaml:"burst_factor,omitempty" json:"burst_factor,omitempty"`
	// Tenants, when set, spread the units among tenants (each unit's
	// drawn from its ID, in proportion to their loads, which sum to the
	// workload's load when neither rate nor load is set); every unit
	// uses the keyed service "tenant:<name>", whose class shares what
	// they use by the tenants' weights, counted per TenantShare
	// ("requests" or "tokens"; empty: no sharing, first come first
	// served).
	Tenants     []Tenant `yaml:"tenants,omitempty" json:"tenants,omitempty"`
	TenantShare string   `yaml:"tenant_share,omitempty" json:"tenant_share,omitempty"`
	// Keys, when set, draws each unit's target from this many keys
	// ("key-00", ...), for the patterns: Debounce, when set, debounces the
	// tasks by target with that period (Task.Debounce); Sequence runs each
	// key's units one at a time in submission order (Task.Sequence).
	// patterns.go checks them.
	Keys     int      `yaml:"keys,omitempty" json:"keys,omitempty"`
	Debounce Duration `yaml:"debounce,omitempty" json:"debounce,omitzero"`
	Sequence bool     `yaml:"sequence,omitempty" json:"sequence,omitempty"`
	// Batch, when set, runs the tasks' units in batches (Task.Batch): one
	// call of the mocks per batch, counted at its arrival with its units'
	// summed tokens; with Keys, a batch holds one key's units.
	Batch *BatchConfig `yaml:"batch,omitempty" json:"batch,omitempty"`
}

// BatchConfig is Workload.Batch: a batch holds at most Max units and
// MaxTokens of their estimated tokens (0: no bound), and waits up to Wait
// for more; ItemErrorRate is the share of a batch's units its answer
// fails on their own (an item the provider rejects), retried alone.
type BatchConfig struct {
	Max           int      `yaml:"max" json:"max"`
	MaxTokens     int64    `yaml:"max_tokens,omitempty" json:"max_tokens,omitempty"`
	Wait          Duration `yaml:"wait,omitempty" json:"wait,omitzero"`
	ItemErrorRate float64  `yaml:"item_error_rate,omitempty" json:"item_error_rate,omitempty"`
}

// Expect are the scenario's own invariants, besides those every run
// checks.
type Expect struct {
	// NoInversions: no lower-priority unit starts while a higher-priority
	// one of its task was eligible and waiting.
	NoInversions bool `yaml:"no_inversions,omitempty" json:"no_inversions,omitempty"`
	// MaxLowWait bounds the queue wait of priority-0 units.
	MaxLowWait Duration `yaml:"max_low_wait,omitempty" json:"max_low_wait,omitzero"`
	// CircuitOpens lists services whose circuit must open at least once;
	// Unaffected those whose circuit must never open and whose units must
	// all complete.
	CircuitOpens []string `yaml:"circuit_opens,omitempty" json:"circuit_opens,omitempty"`
	Unaffected   []string `yaml:"unaffected,omitempty" json:"unaffected,omitempty"`
	// Backpressure: the queue bound was reached (submissions refused)
	// and the queue never held more than max_queued.
	Backpressure bool `yaml:"backpressure,omitempty" json:"backpressure,omitempty"`
	// Deferrals: some calls were answered 429 and runcue held the service
	// back for their Retry-After.
	Deferrals bool `yaml:"deferrals,omitempty" json:"deferrals,omitempty"`
	// TokenUtilisation bounds from below each token-limited mock's use of
	// its limit while work is submitted (see checks.TokenUtilisation).
	TokenUtilisation float64 `yaml:"token_utilisation,omitempty" json:"token_utilisation,omitempty"`
	// SharedRefusals bounds from above the share of runcue's calls a
	// shared key answered 429, SharedOfLeft from below the tokens runcue
	// used of what the other client left (Tokens.Shared; see SharedStats).
	SharedRefusals float64 `yaml:"shared_refusals,omitempty" json:"shared_refusals,omitempty"`
	SharedOfLeft   float64 `yaml:"shared_of_left,omitempty" json:"shared_of_left,omitempty"`
	// SharedForeign bounds from above how many points more of the other
	// client's requests are refused than with runcue absent.
	SharedForeign float64 `yaml:"shared_foreign,omitempty" json:"shared_foreign,omitempty"`
	// HeadersReach bounds from below the share of the mock's token limit
	// runcue uses in one of its first three windows, and
	// HeadersRefusals from above the share of its calls answered 429
	// after the first window, for a meter read from the headers
	// (Tokens.FromProvider; see HeadersStats).
	HeadersReach    float64 `yaml:"headers_reach,omitempty" json:"headers_reach,omitempty"`
	HeadersRefusals float64 `yaml:"headers_refusals,omitempty" json:"headers_refusals,omitempty"`
	// Refused: circular groups were submitted and every one was refused.
	Refused bool `yaml:"refused,omitempty" json:"refused,omitempty"`
	// TenantShares: each tenant's share is within 10% of its weight's
	// (see TenantShare).
	TenantShares bool `yaml:"tenant_shares,omitempty" json:"tenant_shares,omitempty"`
	// HiddenRefusals bounds from above, and HiddenThroughput from below,
	// the 429s a hidden limit answered (a fraction of the calls) and the
	// calls it served (a fraction of the hidden limit) over the second
	// half of the time it was hidden (see hiddenStats); HiddenFollow
	// bounds how long after it was lifted the served calls reach 90% of
	// the rate limit in a window.
	HiddenRefusals   float64  `yaml:"hidden_refusals,omitempty" json:"hidden_refusals,omitempty"`
	HiddenThroughput float64  `yaml:"hidden_throughput,omitempty" json:"hidden_throughput,omitempty"`
	HiddenFollow     Duration `yaml:"hidden_follow,omitempty" json:"hidden_follow,omitzero"`
}

// Config is a simulation: the services, the workload and what to expect.
type Config struct {
	Name        string                   `yaml:"name,omitempty" json:"name"`
	Description string                   `yaml:"description,omitempty" json:"description,omitempty"`
	Services    map[string]ServiceConfig `yaml:"services" json:"services"`
	Workload    Workload                 `yaml:"workload" json:"workload"`
	Expect      Expect                   `yaml:"expect,omitempty" json:"expect"`
	// Duration is how long work is submitted; Drain how long the run may
	// go on after that for the submitted work to end (default Duration).
	Duration Duration `yaml:"duration,omitempty" json:"duration"`
	Drain    Duration `yaml:"drain,omitempty" json:"drain,omitzero"`
	Seed     uint64   `yaml:"seed,omitempty" json:"seed"`
	// Kills is the recovery scenario's number of SIGKILLs of the child.
	Kills int `yaml:"kills,omitempty" json:"kills,omitempty"`
}

// loadConfig reads a YAML configuration file.
func loadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if c.Name == "" {
		c.Name = path
	}
	return c, nil
}

var patterns = []string{"none", "single", "chain", "fan_out", "fan_in", "diamond", "complex", "circular"}

// serviceNames returns the services in name order.
func (c *Config) serviceNames() []string { return slices.Sorted(maps.Keys(c.Services)) }

// normalize fills defaults and checks the configuration.
func (c *Config) normalize() error {
	if len(c.Services) == 0 {
		return errors.New("no services")
	}
	w := &c.Workload
	if w.Pattern == "" {
		w.Pattern = "none"
	}
	if w.Pattern != "random" && !slices.Contains(patterns, w.Pattern) {
		return fmt.Errorf("unknown pattern %q (want one of %v or random)", w.Pattern, patterns)
	}
	if w.Pattern == "random" {
		if len(w.PatternWeights) == 0 {
			return errors.New("pattern random needs pattern_weights")
		}
		for p, x := range w.PatternWeights {
			if !slices.Contains(patterns, p) || x < 0 {
				return fmt.Errorf("pattern_weights: bad entry %s: %v", p, x)
			}
		}
	}
	w.FanOutWidth = cmp0(w.FanOutWidth, 3)
	w.FanInWidth = cmp0(w.FanInWidth, 3)
	w.ChainDepth = cmp0(w.ChainDepth, 4)
	names := c.serviceNames()
	if len(w.TaskTypes) == 0 {
		for _, s := range names {
			w.TaskTypes = append(w.TaskTypes, "call_"+s)
		}
	}
	if w.TaskServices == nil {
		w.TaskServices = map[string][]string{}
	}
	for i, t := range w.TaskTypes {
		if _, ok := w.TaskServices[t]; !ok {
			w.TaskServices[t] = []string{names[i%len(names)]}
		}
		for _, s := range w.TaskServices[t] {
			if _, ok := c.Services[s]; !ok {
				return fmt.Errorf("task %s uses unknown service %s", t, s)
			}
		}
	}
	switch w.Order {
	case "":
		w.Order = "mixed"
	case "natural", "reversed", "shuffled", "mixed":
	default:
		return fmt.Errorf("unknown order %q", w.Order)
	}
	for _, n := range names {
		s := c.Services[n]
		if (s.RateLimit > 0) != (s.RateWindow > 0) {
			return fmt.Errorf("service %s: set rate_limit and rate_window together", n)
		}
		b := &s.Behavior
		if b.Latency.Distribution == "" {
			b.Latency.Distribution = "normal"
		}
		switch b.Latency.Distribution {
		case "normal", "uniform", "lognormal":
		default:
			return fmt.Errorf("service %s: unknown latency distribution %q", n, b.Latency.Distribution)
		}
		if b.Latency.OutlierRate > 0 && b.Latency.OutlierMultiplier == 0 {
			b.Latency.OutlierMultiplier = 10
		}
		if b.MockLimit == 0 {
			b.MockLimit, b.MockWindow = s.RateLimit, s.RateWindow
		}
		if b.MockLimit > 0 && b.MockWindow == 0 {
			return fmt.Errorf("service %s: mock_limit needs mock_window", n)
		}
		if b.MockConcurrent == 0 {
			b.MockConcurrent = s.MaxConcurrent
		}
		if b.WireMin == 0 && b.WireMax == 0 {
			b.WireMin, b.WireMax = Duration(time.Millisecond), Duration(4*time.Millisecond)
		}
		if b.Stream < 0 || b.Stream >= 1 {
			return fmt.Errorf("service %s: stream %v is not a fraction of the latency in [0, 1)", n, b.Stream)
		}
		if b.WireMin < 0 || b.WireMax < b.WireMin {
			return fmt.Errorf("service %s: wire_min %v and wire_max %v", n, b.WireMin.D(), b.WireMax.D())
		}
		if b.RateLimitedRate > 0 && b.RetryAfter == 0 {
			b.RetryAfter = Duration(time.Second)
		}
		if b.CircuitTest {
			b.BurstEvery = Duration(cmpD(b.BurstEvery.D(), 5*time.Minute))
			b.BurstLength = Duration(cmpD(b.BurstLength.D(), 30*time.Second))
		}
		if x := b.ErrorRate + b.TimeoutRate + b.PermanentErrorRate + b.RateLimitedRate; x > 1 {
			return fmt.Errorf("service %s: failure rates add up to %v > 1", n, x)
		}
		if s.Tokens != nil {
			if err := s.Tokens.normalize(); err != nil {
				return fmt.Errorf("service %s: %w", n, err)
			}
		}
		c.Services[n] = s
	}
	if w.Rate == 0 {
		sum := 0.0
		for _, t := range w.Tenants {
			if t.Load <= 0 || t.Name == "" {
				return fmt.Errorf("tenant %q: set a name and a positive load", t.Name)
			}
			sum += t.Load
		}
		if w.Load == 0 {
			w.Load = sum
		}
		if w.Load == 0 {
			w.Load = 0.8
		}
		w.Rate = w.Load * c.capacity()
	}
	if w.Rate <= 0 || math.IsInf(w.Rate, 0) {
		return fmt.Errorf("submission rate %v: set workload.rate (no service limits its capacity)", w.Rate)
	}
	w.Timeout = Duration(cmpD(w.Timeout.D(), 10*time.Second))
	w.MaxAttempts = cmp0(w.MaxAttempts, 3)
	w.BaseDelay = Duration(cmpD(w.BaseDelay.D(), time.Second))
	if w.BurstLength > 0 && w.BurstFactor == 0 {
		w.BurstFactor = 2
	}
	if c.Duration == 0 {
		c.Duration = Duration(time.Minute)
	}
	if c.Drain == 0 {
		c.Drain = c.Duration
	}
	return nil
}

// capacity returns the units per second the workload's services can
// take, given how the task types spread units over them.
func (c *Config) capacity() float64 {
	share := map[string]float64{}
	for _, t := range c.Workload.TaskTypes {
		for _, s := range c.Workload.TaskServices[t] {
			share[s] += 1 / float64(len(c.Workload.TaskTypes))
		}
	}
	capacity := math.Inf(1)
	for s, f := range share {
		if f > 0 {
			capacity = min(capacity, c.Services[s].capacity()/f)
		}
	}
	return capacity
}

func cmp0(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

func cmpD(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}
