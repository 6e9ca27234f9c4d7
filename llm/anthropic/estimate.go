package anthropic

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/tiktoken-go/tokenizer"
)

// Claude's tokenizer is not published: the estimate counts text with
// OpenAI's o200k_base and scales it by textFactor, so that it stays above
// what Claude counts (docs/llm.md gives the measured error).
const textFactor = 1.5

// The framing of a request: tokens for each message and for the system
// prompt, beyond their text.
const (
	perMessage = 4
	perSystem  = 4
)

// Tools add a system prompt of their own, of the sizes Anthropic
// documents: 346 tokens at most for the current models, 530 for Claude 3
// Opus.
const (
	toolsPrompt       = 346
	toolsPromptOpus3  = 530
	opus3ModelsPrefix = "claude-3-opus"
)

// An image counts about width×height/750 tokens, and is scaled down to
// about 1.15 megapixels first: at most about 1,600.
const imageMost = 1600

// Estimate returns the tokens a Messages request counts toward Anthropic's
// limits at admission, at least: its input (the system prompt, messages,
// tools and their system prompt, images at their most, documents at a
// token a byte of their data) and its output (max_tokens, which
// Anthropic's output limits count at the start). Its tokens-* headers
// count both: a meter of "tokens" takes their sum, meters of
// "input_tokens" and "output_tokens" one each. Prompt-cache reads, which
// Anthropic's input limits leave out, are counted: the estimate cannot
// know which prefix the cache will hold. Use it in a Task's Estimate:
//
//	Estimate: func(s runcue.Submission) runcue.Costs {
//		in, out, _ := runcueanthropic.Estimate(s.Params.(anthropic.MessageNewParams))
//		return runcue.Costs{"tokens": in + out}
//	}
func Estimate(p anthropic.MessageNewParams) (input, output int64, err error) {
	body, err := json.Marshal(p)
	if err != nil {
		return 0, 0, fmt.Errorf("anthropic: estimate: %w", err)
	}
	return EstimateBody(body)
}

// EstimateBody is Estimate of a Messages request body (JSON), for requests
// made without the SDK's types.
func EstimateBody(body []byte) (input, output int64, err error) {
	var r struct {
		Model     string            `json:"model"`
		MaxTokens int64             `json:"max_tokens"`
		System    json.RawMessage   `json:"system"`
		Messages  []json.RawMessage `json:"messages"`
		Tools     []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, 0, fmt.Errorf("anthropic: estimate: %w", err)
	}
	count, err := counter()
	if err != nil {
		return 0, 0, err
	}
	if len(r.System) > 0 && string(r.System) != "null" {
		n, err := content(r.System, count)
		if err != nil {
			return 0, 0, err
		}
		input += perSystem + n
	}
	for _, raw := range r.Messages {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return 0, 0, fmt.Errorf("anthropic: estimate: a message: %w", err)
		}
		n, err := content(m.Content, count)
		if err != nil {
			return 0, 0, err
		}
		input += perMessage + n
	}
	if len(r.Tools) > 0 {
		input += toolsPrompt
		if strings.HasPrefix(r.Model, opus3ModelsPrefix) {
			input += toolsPromptOpus3 - toolsPrompt
		}
		for _, t := range r.Tools {
			input += count(string(t)) // the definition's JSON
		}
	}
	return input, max(r.MaxTokens, 0), nil
}

// content counts a system prompt's or a message's content: a string, or
// blocks of text, tool uses and results, images and documents.
func content(raw json.RawMessage, count func(string) int64) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return count(s), nil
	}
	var blocks []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		Thinking string          `json:"thinking"`
		Name     string          `json:"name"`
		Input    json.RawMessage `json:"input"`
		Content  json.RawMessage `json:"content"`
		Source   json.RawMessage `json:"source"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return 0, fmt.Errorf("anthropic: estimate: a content: %w", err)
	}
	var n int64
	for _, b := range blocks {
		switch b.Type {
		case "image":
			n += imageMost
		case "document":
			n += int64(len(b.Source)) + count(b.Text)
		case "tool_result":
			c, err := content(b.Content, count)
			if err != nil {
				return 0, err
			}
			n += c + perMessage
		default: // text, thinking, tool_use
			n += count(b.Text) + count(b.Thinking) + count(b.Name)
			if len(b.Input) > 0 {
				n += count(string(b.Input))
			}
		}
	}
	return n, nil
}

var (
	codecOnce sync.Once
	codec     tokenizer.Codec
	codecErr  error
)

// counter returns the text counter: o200k_base's count scaled by
// textFactor, rounded up.
func counter() (func(string) int64, error) {
	codecOnce.Do(func() { codec, codecErr = tokenizer.Get(tokenizer.O200kBase) })
	if codecErr != nil {
		return nil, fmt.Errorf("anthropic: estimate: %w", codecErr)
	}
	return func(s string) int64 {
		if s == "" {
			return 0
		}
		n, err := codec.Count(s)
		if err != nil {
			return int64(len(s)) // a token is at least a byte
		}
		return int64(math.Ceil(float64(n) * textFactor))
	}, nil
}
