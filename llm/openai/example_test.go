package openai_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/runcue/runcue"
	runcueopenai "github.com/runcue/runcue/llm/openai"
)

// A summarizer calls OpenAI through the official SDK: the client made
// with the adapter's options reports each response's usage and headers to
// its run, and leaves retries to runcue. (A local server stands in for
// the API here; leave out option.WithBaseURL in real code.)
func ExampleOptions() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("x-ratelimit-limit-tokens", "30000")
		w.Header().Set("x-ratelimit-remaining-tokens", "29500")
		w.Header().Set("x-ratelimit-reset-tokens", "1s")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-5.5","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"A short summary."}}],"usage":{"prompt_tokens":412,"completion_tokens":38,"total_tokens":450}}`)
	}))
	defer api.Close()
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	client := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(api.URL), option.WithAPIKey("sk-...")},
		runcueopenai.Options()...)...)
	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()
	_ = cue.Service("openai", runcue.Service{RateLimit: 500, RateWindow: time.Minute,
		Meters: []runcue.Meter{{Name: "tokens", Limit: 30000, Window: time.Minute}}})
	_ = cue.Task("summarize", runcue.Task{Services: []string{"openai"},
		// The prompt's tokens, generously, plus the most the answer may use.
		Estimate: func(s runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": int64(len(s.Target))/2 + 100} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:     openai.ChatModelGPT5_5,
				MaxTokens: openai.Int(100),
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Summarize: " + w.Target)},
			})
			if err != nil {
				return nil, err // a 429 is a runcue.RetryAfter: the unit runs again later
			}
			return resp.Choices[0].Message.Content, nil
		}})
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	sub, err := cue.Submit(ctx, runcue.Submission{Task: "summarize", Target: "a long article ..."})
	if err != nil {
		log.Fatal(err)
	}
	info, err := cue.Wait(ctx, sub.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.State, string(info.Result), "estimated", info.Cost["tokens"], "used", info.Attempts[0].Used["tokens"])
	// Output: completed "A short summary." estimated 109 used 450
}

// A task's Estimate costs each request before it is admitted: its
// messages as the model's tokenizer counts them, with the chat format's
// framing, and its output bound.
func ExampleEstimate() {
	params := openai.ChatCompletionNewParams{
		Model: "gpt-5.1-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You answer briefly."),
			openai.UserMessage("How many tokens is this?"),
		},
		MaxCompletionTokens: openai.Int(50),
	}
	n, err := runcueopenai.Estimate(params)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n, "tokens") // what a task's Estimate returns: runcue.Costs{"tokens": n}
	// Output: 71 tokens
}
