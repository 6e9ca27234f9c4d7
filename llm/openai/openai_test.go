package openai_test

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

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	runcueopenai "github.com/runcue/runcue/llm/openai"
)

// mock is OpenAI's Chat Completions endpoint, answering from a script:
// "ok" (a completion with its usage), "stream" (a stream, its usage last
// if asked for), "429" and "503"; it counts the requests.
type mock struct {
	mu      sync.Mutex
	script  []string
	n       int
	streams []bool // whether each streamed request asked for its usage
}

func (m *mock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	answer := m.script[min(m.n, len(m.script)-1)]
	m.n++
	m.mu.Unlock()
	w.Header().Set("x-ratelimit-limit-tokens", "30000")
	w.Header().Set("x-ratelimit-remaining-tokens", "29000")
	w.Header().Set("x-ratelimit-reset-tokens", "2s")
	switch answer {
	case "ok":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-5.5","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"Hello."}}],"usage":{"prompt_tokens":21,"completion_tokens":9,"total_tokens":30}}`)
	case "stream":
		asked := bytesContain(body, `"include_usage":true`)
		m.mu.Lock()
		m.streams = append(m.streams, asked)
		m.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{"Hel", "lo."} {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}],\"usage\":null}\n\n", c)
		}
		if asked {
			io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":17,\"total_tokens\":57}}\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	case "429":
		w.Header().Set("retry-after-ms", "300")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"Rate limit reached","type":"tokens","code":"rate_limit_exceeded"}}`)
	case "503":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"The server is overloaded","type":"server_error"}}`)
	}
}

func bytesContain(b []byte, s string) bool {
	return len(b) > 0 && string(b) != "" && contains(string(b), s)
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func (m *mock) requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// run opens a Cue whose "chat" task asks the mock through the SDK
// (streaming when stream), with a service metering tokens, submits one
// unit and returns it once it ended.
func run(t *testing.T, m *mock, stream bool) runcue.WorkInfo {
	t.Helper()
	srv := httptest.NewServer(m)
	defer srv.Close()
	client := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(srv.URL), option.WithAPIKey("test")}, runcueopenai.Options()...)...)
	c, err := runcue.Open(filepath.Join(t.TempDir(), "q.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("openai", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 30000, Window: time.Minute}}}))
	params := openai.ChatCompletionNewParams{Model: openai.ChatModelGPT5_5, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")}}
	require.NoError(t, c.Task("chat", runcue.Task{Services: []string{"openai"},
		Retry:    runcue.RetryPolicy{MaxAttempts: 1},
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 1000} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if !stream {
				resp, err := client.Chat.Completions.New(ctx, params)
				if err != nil {
					return nil, err
				}
				return resp.Choices[0].Message.Content, nil
			}
			s := client.Chat.Completions.NewStreaming(ctx, params)
			var text string
			for s.Next() {
				if ch := s.Current(); len(ch.Choices) > 0 {
					text += ch.Choices[0].Delta.Content
				}
			}
			return text, s.Err()
		}}))
	require.NoError(t, c.Start(t.Context()))
	sub, err := c.Submit(t.Context(), runcue.Submission{Task: "chat"})
	require.NoError(t, err)
	info, err := c.Wait(t.Context(), sub.ID)
	require.NoError(t, err)
	return info
}

// TestUsage: a completion's usage reaches the run, and a stream's, asked
// for by the adapter, once.
func TestUsage(t *testing.T) {
	info := run(t, &mock{script: []string{"ok"}}, false)
	assert.Equal(t, runcue.StateCompleted, info.State)
	assert.JSONEq(t, `"Hello."`, string(info.Result))
	assert.Equal(t, runcue.Costs{"tokens": 30}, info.Attempts[0].Used)

	m := &mock{script: []string{"stream"}}
	info = run(t, m, true)
	assert.Equal(t, runcue.StateCompleted, info.State)
	assert.JSONEq(t, `"Hello."`, string(info.Result))
	assert.Equal(t, []bool{true}, m.streams, "the stream was asked for its usage")
	assert.Equal(t, runcue.Costs{"tokens": 57}, info.Attempts[0].Used, "reported once")
}

// TestOneRequestPerRun: a 429 defers the unit (its Retry-After held, no
// retry spent) and a 503 fails it as an overload; the SDK retries
// neither: each run made one request.
func TestOneRequestPerRun(t *testing.T) {
	m := &mock{script: []string{"429", "503"}}
	info := run(t, m, false)
	assert.Equal(t, runcue.StateFailed, info.State)
	require.Len(t, info.Attempts, 2)
	assert.Equal(t, "deferred", info.Attempts[0].Outcome)
	assert.Equal(t, "failed", info.Attempts[1].Outcome)
	assert.Contains(t, info.Error, "503")
	assert.Equal(t, 2, m.requests(), "one request a run")
	assert.GreaterOrEqual(t, info.Attempts[1].Start.Sub(info.Attempts[0].End), 250*time.Millisecond, "held for the Retry-After")
}
