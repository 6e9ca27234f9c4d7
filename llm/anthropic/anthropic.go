// Package anthropic plugs runcue into Anthropic's official Go SDK
// (github.com/anthropics/anthropic-sdk-go/v2). A client made with Options,
// called in a runcue handler with the handler's context (or one derived
// from it), reports to the run what each response's headers say of the
// API's limits (anthropic-ratelimit-*) and the tokens it used, streamed
// responses included (message_start's input, message_delta's output), and
// turns a 429 into runcue.RetryAfter and a 503 or 529 into
// runcue.Overloaded; the SDK's own retries are off, so that a run makes
// one request and runcue decides when the next is made (see package
// github.com/runcue/runcue/llm).
//
// It is a module of its own: runcue's go.mod does not require the SDK.
package anthropic

import (
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/runcue/runcue/llm"
)

// Options returns the request options that make an SDK client runcue's:
// pass them to anthropic.NewClient, after the client's own (a later
// option.WithMaxRetries would turn the SDK's retries back on; the
// middleware then refuses them, ErrRetried, and sends nothing). cfg, if
// given, names the amounts the usage is reported as (default "tokens":
// input, with what was written to the prompt cache, and output; name
// "input_tokens" and "output_tokens" for meters of Anthropic's separate
// input and output limits).
func Options(cfg ...llm.Config) []option.RequestOption {
	var c llm.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	return []option.RequestOption{option.WithMaxRetries(0), option.WithMiddleware(llm.Anthropic.Middleware(c))}
}
