package runcuetype

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// Costs are a unit's costs by amount: how many tokens, input tokens,
// bytes or requests one run of it charges the meters that count them
// (Service.Meters; "requests" is what RateLimit and Budgets count, one by
// default). They are fixed at submit (Submission.Cost, else the task's
// Estimate) and stored with the unit, so that a submitter in another
// process, the owner and every later owner charge the same amounts.
type Costs map[string]int64

// Of returns the cost of amount: one when c does not state it (the
// default cost of Requests).
func (c Costs) Of(amount string) int64 {
	if n, ok := c[amount]; ok {
		return n
	}
	return 1
}

// String writes c as its amounts in name order, each with its figure
// ("input_tokens 1100, requests 1"); "" for none.
func (c Costs) String() string {
	names := make([]string, 0, len(c))
	for name := range c {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	for i, name := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", name, c[name])
	}
	return b.String()
}

// MaxCost is the largest cost of one amount a submission may state.
const MaxCost = 1 << 50

// Requests is the amount RateLimit and Budgets count: one per run unless a
// unit's Costs say otherwise.
const Requests = store.MeterRequests

// Meter limits an amount other than requests that a service counts:
// tokens, input or output tokens, bytes, or any name. At most Limit of it
// start within any interval of length Window plus the service's Margin,
// each run counted at its handler's start (Work.Started) at the unit's
// cost of Name, exactly as RateLimit counts requests: logged with the
// claim, rebuilt from the service log by a new owner. A dispatch must fit
// all of its units' costs in every meter of every service it uses, or it
// waits; a unit whose cost is above a meter's Limit can never run and is
// refused at submit (ErrCostTooLarge), or fails with ErrorKind
// cost_too_large when the limit that refuses it (a keyed instance's, or
// one lowered since) was not known then.
//
// A cost is an estimate made before the run. When the handler reports
// what the run used (Work.Used), the start's charge becomes what Charge
// says; a charge lower than the estimate frees the difference at once. The
// limit holds, counted where the service counts, only while every
// estimate is at least the amount the service charges: reserve the most a
// request can use (its max_tokens and its input), not the likely amount.
type Meter struct {
	// Name is the amount counted: a unit's Costs[Name]. Not "requests"
	// (RateLimit counts those) nor "circuit".
	Name string
	// Aliases are other names a run's reports may give the amount
	// (Work.Used, Work.Observe, httplimit.Report, which names token
	// readings "tokens"): a meter named "llm_tokens" with Aliases
	// []string{"tokens"} takes them. Costs name the meter by Name. A
	// reported amount that no meter of the run's services counts, by name
	// or alias, is ignored: it is logged once and listed in
	// ServiceStatus.Unmatched and Explanation.Notes.
	Aliases []string
	// Limit is the most of Name that may start within any Window.
	Limit int64
	// Window is the sliding window's length, from 1 ms to MaxRateWindow.
	Window time.Duration
	// Charge is what a start's charge becomes once its run reports what
	// it used (Work.Used): ChargeActual by default.
	Charge Charge
	// Bucket counts as a continuously refilling bucket instead of a
	// sliding window, for a provider that documents one (Anthropic): it
	// holds Limit and refills Limit per Window, so a full bucket lets a
	// whole Limit start at once and then Limit per Window, where a window
	// lets at most Limit start in any Window. (A window of the same Limit
	// and Window never exceeds such a bucket: it is the safe choice when
	// the provider's shape is unknown.) The margin counts as its refill:
	// the bucket admits as if it held Limit less Margin's refill. A new
	// owner takes the bucket to have been empty a Window and Margin before
	// it took over, and counts what started since.
	Bucket bool
	// FromProvider makes Limit follow what the provider states of the
	// limit in its responses (ObservedLimit.Limit: httplimit.Report reads
	// x-ratelimit-limit-tokens, anthropic-ratelimit-tokens-limit and the
	// like): Limit is then the conservative value used until a response
	// states one, and MaxLimit, when set, a cap no stated limit exceeds.
	// The window is still Window: the headers give an amount, not its
	// period. The stated limit is stored (a new owner starts from it),
	// shown in ServiceStatus (MeterStatus.Stated), and announced by a
	// limit_stated event when it changes. Limits that differ by model are
	// read by a keyed service per model (Task.ServiceKeys: "model:gpt-5"),
	// each instance stating its own.
	FromProvider bool
	MaxLimit     int64
}

// Charge says what a start's charge in a Meter becomes once its handler
// reports the amount the run actually used (Work.Used). A run that
// reports nothing keeps its estimate.
type Charge uint8

const (
	// ChargeActual replaces the estimate with the actual amount: for a
	// provider that charges what was used (output tokens reserved from
	// max_tokens and corrected when the response ends).
	ChargeActual Charge = iota
	// ChargeLarger keeps the larger of the estimate and the actual amount.
	ChargeLarger
	// ChargeEstimate keeps the estimate whatever was used: for a provider
	// that charges at admission (max(max_tokens, estimated input)).
	ChargeEstimate
)

// Charged returns what a start estimated at est is charged once actual is
// known, under c.
func (c Charge) Charged(est, actual int64) int64 {
	switch c {
	case ChargeLarger:
		return max(est, actual)
	case ChargeEstimate:
		return est
	}
	return actual
}

var chargeNames = [...]string{ChargeActual: "actual", ChargeLarger: "larger", ChargeEstimate: "estimate"}

// String returns the policy's name: actual, larger or estimate.
func (c Charge) String() string {
	if int(c) < len(chargeNames) {
		return chargeNames[c]
	}
	return fmt.Sprintf("Charge(%d)", uint8(c))
}

// MarshalText writes the policy's name.
func (c Charge) MarshalText() ([]byte, error) {
	if int(c) >= len(chargeNames) {
		return nil, fmt.Errorf("%w: charge policy %d", ErrInvalid, uint8(c))
	}
	return []byte(c.String()), nil
}

// UnmarshalText reads a policy's name; empty is ChargeActual.
func (c *Charge) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*c = ChargeActual
		return nil
	}
	for i, n := range chargeNames {
		if n == string(b) {
			*c = Charge(i)
			return nil
		}
	}
	return fmt.Errorf("%w: charge policy %q (actual, larger or estimate)", ErrInvalid, b)
}

// meterJSON is Meter's JSON form.
type meterJSON struct {
	Name         string   `json:"name"`
	Aliases      []string `json:"aliases,omitempty"`
	Limit        int64    `json:"limit"`
	WindowMS     int64    `json:"window_ms"`
	Charge       Charge   `json:"charge"`
	Bucket       bool     `json:"bucket,omitempty"`
	FromProvider bool     `json:"from_provider,omitempty"`
	MaxLimit     int64    `json:"max_limit,omitempty"`
}

// MarshalJSON writes m in runcue's JSON convention (the window in
// milliseconds).
func (m Meter) MarshalJSON() ([]byte, error) {
	return json.Marshal(meterJSON{m.Name, m.Aliases, m.Limit, m.Window.Milliseconds(), m.Charge, m.Bucket, m.FromProvider, m.MaxLimit})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (m *Meter) UnmarshalJSON(b []byte) error {
	var j meterJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*m = Meter{Name: j.Name, Aliases: j.Aliases, Limit: j.Limit, Window: time.Duration(j.WindowMS) * time.Millisecond, Charge: j.Charge, Bucket: j.Bucket,
		FromProvider: j.FromProvider, MaxLimit: j.MaxLimit}
	return nil
}

// Observation is what a service said of its limits in one response (see
// Work.Observe).
type Observation struct {
	// Limits are the limits the response named.
	Limits []ObservedLimit
	// Services names the services of the run the response came from;
	// empty: every service of the run with a meter of a named amount
	// (a rate window for "requests").
	Services []string
}

// ObservedLimit is one limit as a response reported it.
type ObservedLimit struct {
	// Name is the amount, as meters name it: "requests" (the rate
	// window), "tokens", "input_tokens", "output_tokens", ...
	Name string
	// Remaining is what the service has left of it; -1 if not reported.
	Remaining int64
	// Reset is how long after the response the limit is whole again; 0
	// if not reported.
	Reset time.Duration
	// Limit is the limit's size as the service states it; 0 if not
	// reported. A meter with FromProvider takes it as its Limit.
	Limit int64
}
