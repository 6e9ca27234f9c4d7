package anthropic_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	runcueanthropic "github.com/runcue/runcue/llm/anthropic"
)

// mock is Anthropic's Messages endpoint, answering from a script: "ok" (a
// message with its usage), "stream" (its events, usage in message_start
// and message_delta), "cut" (a stream that ends after message_start),
// "429" and "529"; it counts the requests.
type mock struct {
	mu     sync.Mutex
	script []string
	n      int
}

func event(w io.Writer, name, data string) {
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
}

func (m *mock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	m.mu.Lock()
	answer := m.script[min(m.n, len(m.script)-1)]
	m.n++
	m.mu.Unlock()
	w.Header().Set("anthropic-ratelimit-tokens-limit", "40000")
	w.Header().Set("anthropic-ratelimit-tokens-remaining", "39000")
	w.Header().Set("anthropic-ratelimit-tokens-reset", time.Now().Add(2*time.Second).UTC().Format(time.RFC3339))
	start := `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-5-5","content":[],"stop_reason":null,"usage":{"input_tokens":30,"cache_creation_input_tokens":12,"cache_read_input_tokens":500,"output_tokens":1}}}`
	switch answer {
	case "ok":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-5-5","content":[{"type":"text","text":"Hello."}],"stop_reason":"end_turn","usage":{"input_tokens":21,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":9}}`)
	case "stream", "cut":
		w.Header().Set("Content-Type", "text/event-stream")
		event(w, "message_start", start)
		event(w, "content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		event(w, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`)
		if answer == "cut" {
			return
		}
		event(w, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo."}}`)
		event(w, "content_block_stop", `{"type":"content_block_stop","index":0}`)
		event(w, "message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":14}}`)
		event(w, "message_stop", `{"type":"message_stop"}`)
	case "429":
		w.Header().Set("retry-after", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`)
	case "529":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(529)
		io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	}
}

func (m *mock) requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// run opens a Cue whose "ask" task asks the mock through the SDK
// (streaming when stream), with a service metering tokens, submits one
// unit and returns it once it ended.
func run(t *testing.T, m *mock, stream bool) runcue.WorkInfo {
	t.Helper()
	srv := httptest.NewServer(m)
	defer srv.Close()
	client := anthropic.NewClient(append([]option.RequestOption{option.WithBaseURL(srv.URL), option.WithAPIKey("test")}, runcueanthropic.Options()...)...)
	c, err := runcue.Open(filepath.Join(t.TempDir(), "q.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("anthropic", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 40000, Window: time.Minute}}}))
	params := anthropic.MessageNewParams{Model: anthropic.ModelClaudeHaiku5_5, MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))}}
	require.NoError(t, c.Task("ask", runcue.Task{Services: []string{"anthropic"},
		Retry:    runcue.RetryPolicy{MaxAttempts: 1},
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 1000} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if !stream {
				msg, err := client.Messages.New(ctx, params)
				if err != nil {
					return nil, err
				}
				return msg.Content[0].Text, nil
			}
			s := client.Messages.NewStreaming(ctx, params)
			var text string
			for s.Next() {
				if d, ok := s.Current().AsAny().(anthropic.ContentBlockDeltaEvent); ok {
					text += d.Delta.Text
				}
			}
			return text, s.Err()
		}}))
	require.NoError(t, c.Start(t.Context()))
	sub, err := c.Submit(t.Context(), runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	info, err := c.Wait(t.Context(), sub.ID)
	require.NoError(t, err)
	return info
}

// TestUsage: a message's usage reaches the run; a stream's too, once:
// message_start's input (with the tokens written to the prompt cache, not
// those read from it) and message_delta's output; a stream cut short
// reports nothing, and the run's estimate stands.
func TestUsage(t *testing.T) {
	info := run(t, &mock{script: []string{"ok"}}, false)
	assert.Equal(t, runcue.StateCompleted, info.State)
	assert.JSONEq(t, `"Hello."`, string(info.Result))
	assert.Equal(t, runcue.Costs{"tokens": 30}, info.Attempts[0].Used)

	info = run(t, &mock{script: []string{"stream"}}, true)
	assert.Equal(t, runcue.StateCompleted, info.State)
	assert.JSONEq(t, `"Hello."`, string(info.Result))
	assert.Equal(t, runcue.Costs{"tokens": 30 + 12 + 14}, info.Attempts[0].Used)

	info = run(t, &mock{script: []string{"cut"}}, true)
	assert.Nil(t, info.Attempts[0].Used, "cut short: nothing reported")
}

// TestOneRequestPerRun: a 429 defers the unit (its Retry-After held, no
// retry spent) and a 529 fails it as an overload; the SDK retries
// neither: each run made one request.
func TestOneRequestPerRun(t *testing.T) {
	m := &mock{script: []string{"429", "529"}}
	info := run(t, m, false)
	assert.Equal(t, runcue.StateFailed, info.State)
	require.Len(t, info.Attempts, 2)
	assert.Equal(t, "deferred", info.Attempts[0].Outcome)
	assert.Equal(t, "failed", info.Attempts[1].Outcome)
	assert.Contains(t, info.Error, "overloaded_error")
	assert.Equal(t, 2, m.requests(), "one request a run")
	assert.GreaterOrEqual(t, info.Attempts[1].Start.Sub(info.Attempts[0].End), 900*time.Millisecond, "held for the Retry-After")
}
