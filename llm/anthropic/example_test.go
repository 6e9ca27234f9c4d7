package anthropic_test

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

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/llm"
	runcueanthropic "github.com/runcue/runcue/llm/anthropic"
)

// A classifier calls Claude through the official SDK under Anthropic's
// separate input and output token limits: the adapter reports each
// response's input and output to the two meters. (A local server stands
// in for the API here; leave out option.WithBaseURL in real code.)
func ExampleOptions() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-5-5","content":[{"type":"text","text":"spam"}],"stop_reason":"end_turn","usage":{"input_tokens":310,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":2}}`)
	}))
	defer api.Close()
	dir, _ := os.MkdirTemp("", "runcue-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	client := anthropic.NewClient(append([]option.RequestOption{option.WithBaseURL(api.URL), option.WithAPIKey("sk-ant-...")},
		runcueanthropic.Options(llm.Config{Usage: []string{llm.InputTokens, llm.OutputTokens}})...)...)
	cue, err := runcue.Open(filepath.Join(dir, "work.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer cue.Close()
	_ = cue.Service("anthropic", runcue.Service{RateLimit: 50, RateWindow: time.Minute, Meters: []runcue.Meter{
		{Name: llm.InputTokens, Limit: 50000, Window: time.Minute},
		{Name: llm.OutputTokens, Limit: 10000, Window: time.Minute},
	}})
	_ = cue.Task("classify", runcue.Task{Services: []string{"anthropic"},
		Estimate: func(s runcue.Submission) runcue.Costs {
			return runcue.Costs{llm.InputTokens: int64(len(s.Target)), llm.OutputTokens: 5} // MaxTokens: 5
		},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
				Model: anthropic.ModelClaudeHaiku5_5, MaxTokens: 5,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("spam or ham? " + w.Target))},
			})
			if err != nil {
				return nil, err // a 429 is a runcue.RetryAfter, a 529 runcue.Overloaded
			}
			return msg.Content[0].Text, nil
		}})
	if err := cue.Start(ctx); err != nil {
		log.Fatal(err)
	}
	sub, err := cue.Submit(ctx, runcue.Submission{Task: "classify", Target: "WIN A FREE CRUISE"})
	if err != nil {
		log.Fatal(err)
	}
	info, err := cue.Wait(ctx, sub.ID)
	if err != nil {
		log.Fatal(err)
	}
	used := info.Attempts[0].Used
	fmt.Println(info.State, string(info.Result), "input", used[llm.InputTokens], "output", used[llm.OutputTokens])
	// Output: completed "spam" input 310 output 2
}

// A task's Estimate costs each request before it is admitted: its input
// (the system prompt and messages, above what Claude's tokenizer counts)
// and its output bound, summed for a meter of Anthropic's combined
// tokens-* limit.
func ExampleEstimate() {
	params := anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 200,
		System:    []anthropic.TextBlockParam{{Text: "You are a scientist"}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello, Claude"))},
	}
	in, out, err := runcueanthropic.Estimate(params)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(runcue.Costs{"tokens": in + out}) // or {"input_tokens": in, "output_tokens": out}
	// Output: tokens 219
}
