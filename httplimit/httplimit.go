// Package httplimit reads what an HTTP API says about its rate limits:
// OpenAI's x-ratelimit-* headers, Anthropic's anthropic-ratelimit-*
// headers, the IETF RateLimit and RateLimit-Policy fields (the structured
// form and the older RateLimit-Limit/-Remaining/-Reset), and Retry-After
// (seconds or an HTTP date). It only parses: no network, no state.
//
// Values a provider should never send are dropped, not trusted: a
// negative or unparsable amount reads as unknown, a reset in the past as
// none, and a reset further away than MaxReset as unknown (a year-9999
// reset must not hold anything).
//
// Inside a runcue handler, Report hands a response's figures to the run's
// meters and turns a 429 or a 503 into runcue.RetryAfter:
//
//	resp, err := client.Do(req)
//	...
//	if err := httplimit.Report(w, resp.Header, resp.StatusCode, time.Now()); err != nil {
//		return nil, err // the service is held for its Retry-After
//	}
//
// Parse reads a response without a handler; Reading and Limit are its
// result.
package httplimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxReset bounds the resets and Retry-After durations Parse accepts; a
// longer one reads as unknown. (A consumer caps them further, at the
// window of the limit they name.)
const MaxReset = 24 * time.Hour

// Names of the limits the providers report.
const (
	Requests     = "requests"
	Tokens       = "tokens"
	InputTokens  = "input_tokens"
	OutputTokens = "output_tokens"
)

// A Limit is what a response said about one limit. An amount not reported
// (or not believable) is -1; a reset not reported is 0.
type Limit struct {
	// Name is the limit's: Requests, Tokens, InputTokens, OutputTokens, or
	// an IETF policy's name.
	Name string
	// Max is the limit's size, Remaining what is left of it.
	Max, Remaining int64
	// Reset is how long after the response the limit is whole again.
	Reset time.Duration
	// Window is the IETF policy's window (w), 0 if not reported.
	Window time.Duration
}

// A Reading is what one response said about the API's limits.
type Reading struct {
	// Limits are the limits the headers name, in a stable order: OpenAI's
	// and Anthropic's by name (requests, tokens, input, output), then the
	// IETF ones as they appear.
	Limits []Limit
	// RetryAfter is Retry-After's delay (0 if absent or not believable).
	RetryAfter time.Duration
	// Throttled reports a 429 (Too Many Requests).
	Throttled bool
}

// Limit returns the limit named name, and whether the response named it.
func (r Reading) Limit(name string) (Limit, bool) {
	for _, l := range r.Limits {
		if l.Name == name {
			return l, true
		}
	}
	return Limit{}, false
}

// Parse reads h, the headers of a response with status code status,
// received at now.
func Parse(h http.Header, status int, now time.Time) Reading {
	r := Reading{Throttled: status == http.StatusTooManyRequests}
	r.RetryAfter = retryAfter(h.Get("Retry-After"), now)
	for _, name := range []string{Requests, Tokens, InputTokens, OutputTokens} {
		header := strings.ReplaceAll(name, "_", "-")
		// OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens},
		// resets as Go-style durations ("6m0s", "12ms").
		if l, ok := openAI(h, header); ok {
			l.Name = name
			r.Limits = append(r.Limits, l)
			continue
		}
		// Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,
		// output-tokens}-{limit,remaining,reset}, resets as RFC 3339.
		if l, ok := anthropic(h, header, now); ok {
			l.Name = name
			r.Limits = append(r.Limits, l)
		}
	}
	r.Limits = append(r.Limits, ietf(h)...)
	return r
}

func openAI(h http.Header, name string) (Limit, bool) {
	max, rem, reset := h.Get("X-Ratelimit-Limit-"+name), h.Get("X-Ratelimit-Remaining-"+name), h.Get("X-Ratelimit-Reset-"+name)
	if max == "" && rem == "" && reset == "" {
		return Limit{}, false
	}
	return Limit{Max: amount(max), Remaining: amount(rem), Reset: duration(reset)}, true
}

func anthropic(h http.Header, name string, now time.Time) (Limit, bool) {
	p := "Anthropic-Ratelimit-" + name + "-"
	max, rem, reset := h.Get(p+"Limit"), h.Get(p+"Remaining"), h.Get(p+"Reset")
	if max == "" && rem == "" && reset == "" {
		return Limit{}, false
	}
	l := Limit{Max: amount(max), Remaining: amount(rem)}
	if t, err := time.Parse(time.RFC3339, strings.TrimSpace(reset)); err == nil {
		l.Reset = bounded(t.Sub(now))
	}
	return l, true
}

// ietf reads the IETF fields: RateLimit-Policy ("name";q=100;w=60) with
// RateLimit ("name";r=50;t=30), matched by name, or the older
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (seconds).
func ietf(h http.Header) []Limit {
	var out []Limit
	policies := items(h.Values("RateLimit-Policy"))
	for _, it := range items(h.Values("RateLimit")) {
		l := Limit{Name: it.name, Max: -1, Remaining: param(it, "r"), Reset: seconds(it.params["t"])}
		for _, p := range policies {
			if p.name == it.name {
				l.Max, l.Window = param(p, "q"), seconds(p.params["w"])
			}
		}
		out = append(out, l)
	}
	if len(out) == 0 && (h.Get("RateLimit-Limit") != "" || h.Get("RateLimit-Remaining") != "" || h.Get("RateLimit-Reset") != "") {
		out = append(out, Limit{Name: "ratelimit", Max: amount(firstMember(h.Get("RateLimit-Limit"))),
			Remaining: amount(h.Get("RateLimit-Remaining")), Reset: seconds(h.Get("RateLimit-Reset"))})
	}
	return out
}

// item is a structured-field list member: "name" with ;key=value
// parameters.
type item struct {
	name   string
	params map[string]string
}

func items(values []string) []item {
	var out []item
	for _, v := range values {
		for _, member := range strings.Split(v, ",") {
			parts := strings.Split(strings.TrimSpace(member), ";")
			name := strings.Trim(strings.TrimSpace(parts[0]), `"`)
			if name == "" {
				continue
			}
			it := item{name: name, params: map[string]string{}}
			for _, p := range parts[1:] {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				it.params[strings.ToLower(k)] = strings.Trim(v, `"`)
			}
			out = append(out, it)
		}
	}
	return out
}

func param(it item, key string) int64 {
	v, ok := it.params[key]
	if !ok {
		return -1
	}
	return amount(v)
}

// firstMember is the value before any ";" or "," (the older draft's
// RateLimit-Limit may carry a policy after its number).
func firstMember(s string) string {
	s, _, _ = strings.Cut(s, ",")
	s, _, _ = strings.Cut(s, ";")
	return s
}

// amount parses a non-negative amount; anything else is -1 (unknown).
func amount(s string) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// duration parses OpenAI's reset ("6m0s", "12ms", "1s"; a bare number is
// seconds).
func duration(s string) time.Duration {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0
	}
	if d, err := time.ParseDuration(s); err == nil {
		return bounded(d)
	}
	return seconds(s)
}

// seconds parses a number of seconds (fractions allowed).
func seconds(s string) time.Duration {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f != f {
		return 0
	}
	if f > MaxReset.Seconds() {
		return 0
	}
	return bounded(time.Duration(f * float64(time.Second)))
}

// bounded is d when it is a believable reset: positive and at most
// MaxReset; otherwise 0.
func bounded(d time.Duration) time.Duration {
	if d <= 0 || d > MaxReset {
		return 0
	}
	return d
}

// retryAfter parses Retry-After: delay-seconds or an HTTP date.
func retryAfter(s string, now time.Time) time.Duration {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n <= 0 || n > int64(MaxReset/time.Second) {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(s); err == nil {
		return bounded(t.Sub(now))
	}
	return 0
}
