package llm

import (
	"bytes"
	"encoding/json"
	"strings"
)

// OpenAI is OpenAI's API (Chat Completions, Responses, Embeddings): its
// token limit counts a request's input and output tokens; a response
// states them as usage.prompt_tokens and completion_tokens (input_tokens
// and output_tokens in the Responses API); a Chat Completions stream
// states them in its last chunk when the request asked
// (stream_options.include_usage, which Prepare sets), a Responses stream
// in its response.completed event.
var OpenAI = &Provider{
	Name:    "openai",
	Tokens:  func(u Usage) int64 { return u.Input + u.Output },
	Body:    bodyUsage,
	Event:   openAIEvent,
	Prepare: openAIPrepare,
}

// Anthropic is Anthropic's Messages API: its token limits count input
// tokens (with those written to the prompt cache, not those read from it)
// and output tokens; a response states them as usage.input_tokens,
// cache_creation_input_tokens, cache_read_input_tokens and
// output_tokens; a stream states the input in its message_start event and
// the output, cumulative, in message_delta events, whole at message_stop.
// A 529 means overloaded.
var Anthropic = &Provider{
	Name:       "anthropic",
	Tokens:     func(u Usage) int64 { return u.Input + u.CacheWrite + u.Output },
	Body:       bodyUsage,
	Event:      anthropicEvent,
	Overloaded: []int{529},
}

// wireUsage is a usage object of either provider.
type wireUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	InputTokens      *int64 `json:"input_tokens"`
	OutputTokens     *int64 `json:"output_tokens"`
	CacheCreation    *int64 `json:"cache_creation_input_tokens"`
	CacheRead        *int64 `json:"cache_read_input_tokens"`
}

func (w *wireUsage) usage() Usage {
	var u Usage
	for _, p := range []*int64{w.PromptTokens, w.InputTokens} {
		if p != nil {
			u.Input = *p
		}
	}
	for _, p := range []*int64{w.CompletionTokens, w.OutputTokens} {
		if p != nil {
			u.Output = *p
		}
	}
	if w.CacheCreation != nil {
		u.CacheWrite = *w.CacheCreation
	}
	if w.CacheRead != nil {
		u.CacheRead = *w.CacheRead
	}
	return u
}

// bodyUsage reads a response body's usage object (either provider's).
func bodyUsage(body []byte) (Usage, bool) {
	var r struct {
		Usage *wireUsage `json:"usage"`
	}
	if json.Unmarshal(body, &r) != nil || r.Usage == nil {
		return Usage{}, false
	}
	return r.Usage.usage(), true
}

func openAIEvent(data []byte, u *Usage) bool {
	if !bytes.Contains(data, []byte(`"usage"`)) {
		return false // most chunks: no need to parse them
	}
	var e struct {
		Type     string     `json:"type"`
		Usage    *wireUsage `json:"usage"`
		Response *struct {
			Usage *wireUsage `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &e) != nil {
		return false
	}
	switch {
	case e.Usage != nil: // a Chat Completions chunk: the last, asked for with include_usage
		*u = e.Usage.usage()
		return true
	case e.Response != nil && e.Response.Usage != nil && strings.HasPrefix(e.Type, "response.") &&
		(e.Type == "response.completed" || e.Type == "response.incomplete" || e.Type == "response.failed"):
		*u = e.Response.Usage.usage()
		return true
	}
	return false
}

// openAIPrepare asks a streamed Chat Completions request for its usage
// (stream_options.include_usage), keeping its other stream options.
func openAIPrepare(path string, body []byte) []byte {
	if !strings.HasSuffix(path, "/chat/completions") {
		return body
	}
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil {
		return body
	}
	var stream bool
	if json.Unmarshal(req["stream"], &stream) != nil || !stream {
		return body
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := req["stream_options"]; ok && json.Unmarshal(raw, &opts) != nil {
		return body
	}
	opts["include_usage"] = json.RawMessage("true")
	raw, err := json.Marshal(opts)
	if err != nil {
		return body
	}
	req["stream_options"] = raw
	out, err := json.Marshal(req)
	if err != nil {
		return body
	}
	return out
}

func anthropicEvent(data []byte, u *Usage) bool {
	var e struct {
		Type    string `json:"type"`
		Message *struct {
			Usage *wireUsage `json:"usage"`
		} `json:"message"`
		Usage *wireUsage `json:"usage"`
	}
	if json.Unmarshal(data, &e) != nil {
		return false
	}
	switch e.Type {
	case "message_start":
		if e.Message != nil && e.Message.Usage != nil {
			*u = e.Message.Usage.usage()
		}
	case "message_delta":
		if w := e.Usage; w != nil {
			// Cumulative: the output so far, and the input again when
			// the API states it here too.
			next := w.usage()
			if w.OutputTokens != nil {
				u.Output = next.Output
			}
			if w.InputTokens != nil {
				u.Input = next.Input
			}
			if w.CacheCreation != nil {
				u.CacheWrite = next.CacheWrite
			}
			if w.CacheRead != nil {
				u.CacheRead = next.CacheRead
			}
		}
	case "message_stop":
		return u.Input+u.CacheWrite+u.CacheRead+u.Output > 0 // message_start came
	}
	return false
}
