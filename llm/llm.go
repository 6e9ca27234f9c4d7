// Package llm plugs an LLM provider's HTTP API into a runcue handler: a
// middleware for the provider's HTTP client (its official SDK's, through
// the SDK's middleware hook: runcue's modules llm/openai and llm/anthropic
// do that) that, for a request made in a runcue handler (runcue.WorkFrom
// finds its Work in the request's context):
//
//   - reports what the response's headers say of the API's limits
//     (httplimit.Report: Work.Observe);
//   - reports the tokens the response says it used (Work.Used), from the
//     JSON body's usage, or from a streamed response's events as they pass
//     (OpenAI's Chat Completions stream carries usage only when asked:
//     the middleware asks, setting stream_options.include_usage); a
//     stream cut short reports nothing, and the run's estimate stands;
//   - turns a 429 into runcue.RetryAfter, a 503 (and Anthropic's 529)
//     into runcue.Overloaded, so that runcue holds the service and runs
//     the unit again, and reports that the refused request used no
//     tokens (should the provider count it after all, the headers'
//     remaining says so, and runcue counts it as use from elsewhere);
//   - refuses a retry of the SDK's own (runcue owns retries: every request
//     runcue did not admit is one the limits do not count), so that one run
//     makes one request.
//
// A request made outside a runcue handler passes untouched.
package llm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
)

// Amounts a response's usage is reported as (Config.Usage): Tokens is
// what the provider's token limit counts (input and output; Anthropic's
// cache reads excluded, as its input limits exclude them), InputTokens and
// OutputTokens each part.
const (
	Tokens       = "tokens"
	InputTokens  = "input_tokens"
	OutputTokens = "output_tokens"
)

// Config configures a provider's middleware.
type Config struct {
	// Usage names the amounts a response's usage is reported as
	// (Work.Used): Tokens, InputTokens, OutputTokens. Default {Tokens}.
	// Name the ones the service's meters count (by Name or Alias): an
	// amount no meter counts is logged once and listed in
	// ServiceStatus.Unmatched.
	Usage []string
}

// Usage is what a response says it used.
type Usage struct {
	// Input and Output are the tokens of the prompt and of the answer;
	// CacheWrite and CacheRead the prompt's tokens written to and read
	// from the provider's prompt cache (Anthropic; both apart from Input).
	Input, Output, CacheWrite, CacheRead int64
}

// Provider is an API's wire format: where its responses state their
// usage, which statuses mean overloaded, and what a request must ask to be
// told its usage. OpenAI and Anthropic are runcue's.
type Provider struct {
	// Name names the provider in errors.
	Name string
	// Tokens is what the provider's token limit counts of u.
	Tokens func(u Usage) int64
	// Body reads a JSON response body's usage; ok is false when it states
	// none.
	Body func(body []byte) (u Usage, ok bool)
	// Event reads one event of a streamed response (its data) into u;
	// done is true once the stream's usage is whole.
	Event func(data []byte, u *Usage) (done bool)
	// Prepare, if set, rewrites a request's JSON body before it is sent
	// (the path is the URL's).
	Prepare func(path string, body []byte) []byte
	// Overloaded lists the statuses that mean the API is overloaded,
	// besides 503.
	Overloaded []int
}

// Error is the error a request gets for a response runcue acts on (a 429,
// a 503, an overload): its status and the start of its body. It wraps
// runcue.RetryAfter or runcue.Overloaded (errors.As finds them), which
// wrap httplimit.ErrThrottled, httplimit.ErrUnavailable or ErrOverloaded.
type Error struct {
	Provider   string
	StatusCode int
	Body       string
	err        error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %d %s: %s", e.Provider, e.StatusCode, http.StatusText(e.StatusCode), e.Body)
}

func (e *Error) Unwrap() error { return e.err }

// ErrOverloaded is wrapped (in runcue.Overloaded) by the error of a
// response whose status the provider uses for overload (Anthropic's 529).
var ErrOverloaded = errors.New("llm: the API is overloaded")

// ErrRetried is the error of a request the SDK retried on its own: the
// middleware does not send it. runcue runs the unit again when its policy
// says, under the service's limits; keep the SDK's retries off (the
// modules' options set its MaxRetries to 0).
var ErrRetried = errors.New("llm: the SDK retried the request by itself; runcue owns retries (set the SDK's MaxRetries to 0)")

// retryHeader is the header Stainless SDKs (OpenAI's, Anthropic's) number
// their attempts with, from 0.
const retryHeader = "X-Stainless-Retry-Count"

// Middleware returns p's middleware, in the shape of the SDKs' middleware
// hook (option.WithMiddleware): next sends the request.
func (p *Provider) Middleware(cfg Config) func(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	usage := cfg.Usage
	if len(usage) == 0 {
		usage = []string{Tokens}
	}
	return func(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
		w := runcue.WorkFrom(req.Context())
		if w == nil {
			return next(req)
		}
		if n := req.Header.Get(retryHeader); n != "" && n != "0" {
			return nil, ErrRetried
		}
		if p.Prepare != nil && req.Body != nil && req.Body != http.NoBody {
			if err := p.prepare(req); err != nil {
				return nil, err
			}
		}
		resp, err := next(req)
		if err != nil {
			return nil, err
		}
		if err := p.check(w, resp); err != nil {
			// Refused (429, overloaded): the provider charged it nothing.
			// Should it count it after all, its headers' remaining says
			// so, and runcue counts that as use from elsewhere.
			(&reporter{p: p, w: w, names: usage}).report(Usage{})
			return nil, err
		}
		if resp.StatusCode >= 300 {
			return resp, nil // the SDK's error
		}
		r := &reporter{p: p, w: w, names: usage}
		if isStream(resp) {
			resp.Body = &stream{ReadCloser: resp.Body, r: r}
			return resp, nil
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err // the connection was cut mid-answer: the SDK's error, as it would have read it
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if u, ok := p.Body(body); ok {
			r.report(u)
		}
		return resp, nil
	}
}

// prepare rewrites req's body with p.Prepare.
func (p *Provider) prepare(req *http.Request) error {
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return err
	}
	body = p.Prepare(req.URL.Path, body)
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	return nil
}

// check reports resp's headers to w and returns the error of a response
// runcue acts on (its body read and closed), nil for any other.
func (p *Provider) check(w *runcue.Work, resp *http.Response) error {
	err := httplimit.Report(w, resp.Header, resp.StatusCode, time.Now())
	if err == nil {
		for _, s := range p.Overloaded {
			if resp.StatusCode == s {
				err = runcue.Overloaded(ErrOverloaded)
				if d := httplimit.Parse(resp.Header, resp.StatusCode, time.Now()).RetryAfter; d > 0 {
					err = runcue.RetryAfter(d, err)
				}
			}
		}
	}
	if err == nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	_ = resp.Body.Close()
	return &Error{Provider: p.Name, StatusCode: resp.StatusCode, Body: strings.TrimSpace(string(b)), err: err}
}

// isStream reports whether resp is a stream of server-sent events.
func isStream(resp *http.Response) bool {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "text/event-stream"
}

// reporter reports a response's usage to its run, once.
type reporter struct {
	p     *Provider
	w     *runcue.Work
	names []string
	once  sync.Once
}

func (r *reporter) report(u Usage) {
	r.once.Do(func() {
		costs := make(runcue.Costs, len(r.names))
		for _, name := range r.names {
			switch name {
			case Tokens:
				costs[name] = r.p.Tokens(u)
			case InputTokens:
				costs[name] = u.Input + u.CacheWrite
			case OutputTokens:
				costs[name] = u.Output
			}
		}
		r.w.Used(costs)
	})
}

// stream reads a streamed response's events as the SDK reads them, and
// reports its usage once the provider's events make it whole.
type stream struct {
	io.ReadCloser
	r    *reporter
	line []byte // the line read so far
	u    Usage
	done bool
}

func (s *stream) Read(b []byte) (int, error) {
	n, err := s.ReadCloser.Read(b)
	if !s.done {
		s.scan(b[:n])
	}
	return n, err
}

// scan feeds bytes of the stream: each whole "data:" line is an event's
// data (the providers send each event's JSON on one line).
func (s *stream) scan(b []byte) {
	for len(b) > 0 && !s.done {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.line = append(s.line, b...)
			if len(s.line) > 1<<20 {
				s.line = s.line[:0] // not an event of ours: no usage is that long
			}
			return
		}
		line := b[:i]
		if len(s.line) > 0 {
			line = append(s.line, line...)
			s.line = s.line[:0]
		}
		b = b[i+1:]
		line = bytes.TrimRight(line, "\r")
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if s.r.p.Event(bytes.TrimSpace(data), &s.u) {
				s.done = true
				s.r.report(s.u)
			}
		}
	}
}
