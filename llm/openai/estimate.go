package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/openai/openai-go/v3"
	"github.com/tiktoken-go/tokenizer"
)

// ErrNoMaxTokens is returned by Estimate for a request that bounds
// neither max_completion_tokens nor max_tokens: OpenAI counts the bound at
// admission, so without one no estimate is safe.
var ErrNoMaxTokens = errors.New("openai: the request sets no max_completion_tokens or max_tokens")

// Per the chat format: each message is framed by 3 tokens, a message's
// name costs 1 more, and the reply is primed with 3.
const (
	perMessage = 3
	perName    = 1
	perReply   = 3
)

// An image part counts at most this many tokens: 85 for low detail; for
// high or auto detail, 85 and 170 per 512-pixel tile of the image scaled
// to fit 2048 square with its short side at most 768 (8 tiles at most).
const (
	imageLow  = 85
	imageHigh = 85 + 8*170
)

// Estimate returns the tokens a Chat Completions request counts toward a
// tokens-per-minute limit at admission, at least: its messages' tokens as
// the model's tokenizer counts them (o200k_base, or cl100k_base for the
// gpt-4 and gpt-3.5 models), the chat format's framing, its tools'
// definitions and each image's most, plus max_completion_tokens (or
// max_tokens) for each of its n choices. Use it in a Task's Estimate:
//
//	Estimate: func(s runcue.Submission) runcue.Costs {
//		n, _ := runcueopenai.Estimate(s.Params.(openai.ChatCompletionNewParams))
//		return runcue.Costs{"tokens": n}
//	}
//
// The tokenizer's vocabularies are embedded in the binary
// (github.com/tiktoken-go/tokenizer); docs/llm.md gives the estimate's
// measured error.
func Estimate(p openai.ChatCompletionNewParams) (int64, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return 0, fmt.Errorf("openai: estimate: %w", err)
	}
	return EstimateBody(body)
}

// EstimateBody is Estimate of a Chat Completions request body (JSON), for
// requests made without the SDK's types.
func EstimateBody(body []byte) (int64, error) {
	var r struct {
		Model               string            `json:"model"`
		Messages            []json.RawMessage `json:"messages"`
		Tools               []json.RawMessage `json:"tools"`
		MaxCompletionTokens *int64            `json:"max_completion_tokens"`
		MaxTokens           *int64            `json:"max_tokens"`
		N                   *int64            `json:"n"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, fmt.Errorf("openai: estimate: %w", err)
	}
	out := r.MaxCompletionTokens
	if out == nil {
		out = r.MaxTokens
	}
	if out == nil {
		return 0, ErrNoMaxTokens
	}
	choices := int64(1)
	if r.N != nil && *r.N > 1 {
		choices = *r.N
	}
	in, err := promptTokens(r.Model, r.Messages, r.Tools)
	if err != nil {
		return 0, err
	}
	return in + max(*out, 0)*choices, nil
}

// promptTokens counts a request's messages and tools as the model's
// tokenizer does, with the chat format's framing.
func promptTokens(model string, messages, tools []json.RawMessage) (int64, error) {
	enc, err := codecFor(model)
	if err != nil {
		return 0, err
	}
	count := func(s string) int64 {
		n, err := enc.Count(s)
		if err != nil {
			return int64(len(s)) // a token is at least a byte
		}
		return int64(n)
	}
	n := int64(perReply)
	for _, raw := range messages {
		var m struct {
			Role      string          `json:"role"`
			Name      string          `json:"name"`
			Content   json.RawMessage `json:"content"`
			ToolCalls []struct {
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
			ToolCallID string `json:"tool_call_id"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return 0, fmt.Errorf("openai: estimate: a message: %w", err)
		}
		n += perMessage + count(m.Role) + count(m.ToolCallID)
		if m.Name != "" {
			n += perName + count(m.Name)
		}
		for _, c := range m.ToolCalls {
			n += count(c.Function.Name) + count(c.Function.Arguments) + perMessage
		}
		c, err := contentTokens(m.Content, count)
		if err != nil {
			return 0, err
		}
		n += c
	}
	for _, t := range tools {
		n += count(string(t)) // the definition's JSON: more than the model reads of it
	}
	return n, nil
}

// contentTokens counts a message's content: a string, or parts of text,
// refusals and images (each at its most).
func contentTokens(raw json.RawMessage, count func(string) int64) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return count(s), nil
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		Refusal  string `json:"refusal"`
		ImageURL struct {
			Detail string `json:"detail"`
		} `json:"image_url"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, fmt.Errorf("openai: estimate: a message's content: %w", err)
	}
	var n int64
	for _, p := range parts {
		switch p.Type {
		case "image_url":
			if p.ImageURL.Detail == "low" {
				n += imageLow
			} else {
				n += imageHigh
			}
		default:
			n += count(p.Text) + count(p.Refusal)
		}
	}
	return n, nil
}

var codecs sync.Map // tokenizer.Encoding → tokenizer.Codec

// codecFor returns the tokenizer of model: cl100k_base for the gpt-4 and
// gpt-3.5 models (not gpt-4o, gpt-4.1, gpt-4.5), o200k_base otherwise.
func codecFor(model string) (tokenizer.Codec, error) {
	enc := tokenizer.O200kBase
	m := strings.TrimPrefix(model, "ft:")
	if strings.HasPrefix(m, "gpt-3.5") || strings.HasPrefix(m, "gpt-35") ||
		(strings.HasPrefix(m, "gpt-4") && !strings.HasPrefix(m, "gpt-4o") && !strings.HasPrefix(m, "gpt-4.")) {
		enc = tokenizer.Cl100kBase
	}
	if c, ok := codecs.Load(enc); ok {
		return c.(tokenizer.Codec), nil
	}
	c, err := tokenizer.Get(enc)
	if err != nil {
		return nil, fmt.Errorf("openai: estimate: %w", err)
	}
	codecs.Store(enc, c)
	return c, nil
}
