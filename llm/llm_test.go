package llm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
	"github.com/runcue/runcue/llm"
)

// transport sends requests through a provider's middleware, as an SDK's
// middleware hook does.
type transport struct {
	mw func(*http.Request, func(*http.Request) (*http.Response, error)) (*http.Response, error)
}

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.mw(req, http.DefaultTransport.RoundTrip)
}

// server answers each request with the next answer of its script, and
// keeps every request's body.
type server struct {
	mu      sync.Mutex
	bodies  []string
	answers []func(w http.ResponseWriter)
	srv     *httptest.Server
}

func newServer(t *testing.T, answers ...func(w http.ResponseWriter)) *server {
	s := &server{answers: answers}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, string(b))
		answer := s.answers[0]
		if len(s.answers) > 1 {
			s.answers = s.answers[1:]
		}
		s.mu.Unlock()
		answer(w)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *server) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// sse writes a stream of server-sent events, each "data: <line>".
func sse(events ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("x-ratelimit-limit-tokens", "12000")
		w.Header().Set("x-ratelimit-remaining-tokens", "11000")
		w.Header().Set("x-ratelimit-reset-tokens", "2s")
		for _, e := range events {
			fmt.Fprintf(w, "data: %s\n\n", e)
			w.(http.Flusher).Flush()
		}
	}
}

func jsonAnswer(status int, body string, headers ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// cue opens a Cue with a service "llm" metering tokens, and a task "ask"
// whose handler posts body to url through p's middleware and reads the
// whole answer; it returns each run's error.
func cue(t *testing.T, p *llm.Provider, url, path, body string) (*runcue.Cue, *sync.Map) {
	t.Helper()
	c, err := runcue.Open(filepath.Join(t.TempDir(), "q.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 12000, Window: time.Minute}}}))
	client := &http.Client{Transport: transport{mw: p.Middleware(llm.Config{})}}
	errs := &sync.Map{}
	require.NoError(t, c.Task("ask", runcue.Task{Services: []string{"llm"},
		Retry:    runcue.RetryPolicy{MaxAttempts: 1},
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 500} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
			if err != nil {
				return nil, err
			}
			req.Header.Set("X-Stainless-Retry-Count", "0")
			resp, err := client.Do(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			errs.Store(w.Attempt, err)
			return nil, err
		}}))
	require.NoError(t, c.Start(t.Context()))
	return c, errs
}

func usedOf(t *testing.T, c *runcue.Cue, id string) runcue.Costs {
	t.Helper()
	info, err := c.Wait(t.Context(), id)
	require.NoError(t, err)
	require.NotEmpty(t, info.Attempts)
	return info.Attempts[0].Used
}

// TestOpenAIUsage: a response's usage is reported (prompt and completion
// tokens), its headers too; a streamed Chat Completions request is asked
// for its usage, reported once from its last chunk.
func TestOpenAIUsage(t *testing.T) {
	s := newServer(t, jsonAnswer(200, `{"id":"chatcmpl-1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150}}`,
		"x-ratelimit-limit-tokens", "12000", "x-ratelimit-remaining-tokens", "4000", "x-ratelimit-reset-tokens", "20s"))
	c, _ := cue(t, llm.OpenAI, s.srv.URL, "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	sub, err := c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	assert.Equal(t, runcue.Costs{"tokens": 150}, usedOf(t, c, sub.ID))
	st, err := c.ServiceStatus(t.Context(), "llm")
	require.NoError(t, err)
	require.Len(t, st.Meters, 1)
	assert.Greater(t, st.Meters[0].Used, int64(150), "the headers' reading: 8,000 of 12,000 used, most of it elsewhere")
	assert.Equal(t, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, s.requests()[0], "a request that does not stream is sent as it is")

	s = newServer(t, sse(
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"He"}}],"usage":null}`,
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"llo"}}],"usage":null}`,
		`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":200,"completion_tokens":55,"total_tokens":255}}`,
		`[DONE]`))
	c, _ = cue(t, llm.OpenAI, s.srv.URL, "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"stream_options":{"x":1},"messages":[]}`)
	sub, err = c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	assert.Equal(t, runcue.Costs{"tokens": 255}, usedOf(t, c, sub.ID))
	var sent map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(s.requests()[0]), &sent))
	assert.JSONEq(t, `{"x":1,"include_usage":true}`, string(sent["stream_options"]), "the stream is asked for its usage")
}

// TestOpenAIResponsesStream: the Responses API's stream states its usage
// in response.completed.
func TestOpenAIResponsesStream(t *testing.T) {
	s := newServer(t, sse(
		`{"type":"response.created","response":{"id":"r","usage":null}}`,
		`{"type":"response.output_text.delta","delta":"Hi"}`,
		`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":80,"output_tokens":12,"total_tokens":92}}}`))
	c, _ := cue(t, llm.OpenAI, s.srv.URL, "/v1/responses", `{"model":"gpt-4o","stream":true,"input":"hi"}`)
	sub, err := c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	assert.Equal(t, runcue.Costs{"tokens": 92}, usedOf(t, c, sub.ID))
	assert.Equal(t, `{"model":"gpt-4o","stream":true,"input":"hi"}`, s.requests()[0], "only Chat Completions needs asking")
}

// TestAnthropicStream: input from message_start (with what was written to
// the prompt cache; what was read from it does not count), output from
// the last message_delta, reported once at message_stop; a stream cut
// before message_stop reports nothing (the estimate stands).
func TestAnthropicStream(t *testing.T) {
	s := newServer(t, sse(
		`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":25,"cache_creation_input_tokens":5,"cache_read_input_tokens":100,"output_tokens":1}}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":40}}`,
		`{"type":"message_stop"}`),
		sse(`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":25,"output_tokens":1}}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`))
	c, _ := cue(t, llm.Anthropic, s.srv.URL, "/v1/messages", `{"model":"claude","max_tokens":100,"stream":true,"messages":[]}`)
	sub, err := c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	assert.Equal(t, runcue.Costs{"tokens": 70}, usedOf(t, c, sub.ID))
	cut, err := c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	assert.Nil(t, usedOf(t, c, cut.ID), "cut short: nothing reported")
}

// TestOverloadAndThrottle: a 429 is a RetryAfter (the unit deferred, no
// retry spent, the service held for its Retry-After), Anthropic's 529 an
// overload (a failure); each run made one request.
func TestOverloadAndThrottle(t *testing.T) {
	s := newServer(t, jsonAnswer(429, `{"error":{"type":"rate_limit_error"}}`, "retry-after", "1"),
		jsonAnswer(529, `{"type":"error","error":{"type":"overloaded_error"}}`))
	c, errs := cue(t, llm.Anthropic, s.srv.URL, "/v1/messages", `{"model":"claude","max_tokens":100,"messages":[]}`)
	sub, err := c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	info, err := c.Wait(t.Context(), sub.ID)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateFailed, info.State)
	require.Len(t, info.Attempts, 2)
	assert.Equal(t, "deferred", info.Attempts[0].Outcome, "the 429: no retry spent")
	assert.Equal(t, "failed", info.Attempts[1].Outcome)
	for _, a := range info.Attempts {
		assert.Equal(t, runcue.Costs{"tokens": 0}, a.Used, "a refused request used nothing")
	}
	assert.GreaterOrEqual(t, info.Attempts[1].Start.Sub(info.Attempts[0].End), 900*time.Millisecond, "held for the Retry-After")
	assert.Len(t, s.requests(), 2, "one request a run")

	first, _ := errs.Load(1)
	var ra *runcue.RetryAfterError
	require.ErrorAs(t, first.(error), &ra)
	assert.Equal(t, time.Second, ra.Delay)
	assert.ErrorIs(t, first.(error), httplimit.ErrThrottled)
	var e *llm.Error
	require.ErrorAs(t, first.(error), &e)
	assert.Equal(t, 429, e.StatusCode)
	assert.Contains(t, e.Error(), "rate_limit_error")
	second, _ := errs.Load(2)
	var ov *runcue.OverloadedError
	assert.ErrorAs(t, second.(error), &ov)
	assert.ErrorIs(t, second.(error), llm.ErrOverloaded)
}

// TestRetryRefused: a retry the SDK makes by itself is not sent.
func TestRetryRefused(t *testing.T) {
	s := newServer(t, jsonAnswer(200, `{"usage":{"input_tokens":10,"output_tokens":2}}`))
	mw := llm.Anthropic.Middleware(llm.Config{})
	c, err := runcue.Open(filepath.Join(t.TempDir(), "q.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	var got error
	require.NoError(t, c.Task("ask", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL, strings.NewReader("{}"))
		req.Header.Set("X-Stainless-Retry-Count", "1")
		_, got = mw(req, http.DefaultTransport.RoundTrip)
		return nil, nil
	}}))
	require.NoError(t, c.Start(t.Context()))
	sub, err := c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	_, err = c.Wait(t.Context(), sub.ID)
	require.NoError(t, err)
	assert.ErrorIs(t, got, llm.ErrRetried)
	assert.Empty(t, s.requests())

	// Outside a handler the middleware passes everything.
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL, strings.NewReader("{}"))
	req.Header.Set("X-Stainless-Retry-Count", "1")
	resp, err := mw(req, http.DefaultTransport.RoundTrip)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Len(t, s.requests(), 1)
}

// TestCutAnswer: an answer cut before its body's end is the request's
// error (an unexpected EOF, which runcue retries), not a body the SDK
// would fail to parse; nothing is reported used.
func TestCutAnswer(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "200")
		io.WriteString(w, `{"usage":{"prompt_tokens":1`)
	})
	c, errs := cue(t, llm.OpenAI, s.srv.URL, "/v1/chat/completions", `{"model":"m","messages":[]}`)
	sub, err := c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	info, err := c.Wait(t.Context(), sub.ID)
	require.NoError(t, err)
	got, _ := errs.Load(1)
	require.Error(t, got.(error))
	assert.ErrorIs(t, got.(error), io.ErrUnexpectedEOF)
	assert.Nil(t, info.Attempts[0].Used)
}
