package anthropic

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tiktoken-go/tokenizer"
)

// TestEstimateAgainstReported: on the requests whose input tokens
// Anthropic's count_tokens gave in published examples
// (testdata/reported.json), the estimate is never below the count, and its
// error is logged (docs/llm.md quotes it).
func TestEstimateAgainstReported(t *testing.T) {
	b, err := os.ReadFile("testdata/reported.json")
	require.NoError(t, err)
	var rs []struct {
		Model       string          `json:"model"`
		InputTokens int64           `json:"input_tokens"`
		Body        json.RawMessage `json:"body"`
	}
	require.NoError(t, json.Unmarshal(b, &rs))
	require.NotEmpty(t, rs)
	for _, r := range rs {
		in, out, err := EstimateBody(r.Body)
		require.NoError(t, err)
		t.Logf("%s: estimated %d input tokens, Anthropic counted %d (%+d, %+.1f%%)", r.Model, in, r.InputTokens,
			in-r.InputTokens, 100*float64(in-r.InputTokens)/float64(r.InputTokens))
		assert.GreaterOrEqual(t, in, r.InputTokens, "never below Anthropic's count")
		assert.Less(t, in, 2*r.InputTokens, "not wildly above it")
		assert.Equal(t, int64(1024), out, "max_tokens")
	}
}

// TestEstimateBounds: every block is counted (text above o200k_base's own
// count, tool uses and results, thinking, images and documents at their
// most, the tools' system prompt); the SDK's params give their body's
// estimate.
func TestEstimateBounds(t *testing.T) {
	enc, err := tokenizer.Get(tokenizer.O200kBase)
	require.NoError(t, err)
	o200k := func(s string) int64 {
		n, err := enc.Count(s)
		require.NoError(t, err)
		return int64(n)
	}
	texts := []string{"Summarise this.", "请把这段话翻译成英文：速率限制按每分钟的令牌数计算。",
		"func main() { fmt.Println(42) }", "Übersetze bitte: Die Grenzen gelten für jeden Schlüssel."}
	for _, text := range texts {
		body, err := json.Marshal(map[string]any{
			"model": "claude-sonnet-4-5", "max_tokens": 300,
			"system": []map[string]any{{"type": "text", "text": text}},
			"messages": []map[string]any{
				{"role": "user", "content": []map[string]any{
					{"type": "text", "text": text},
					{"type": "image", "source": map[string]any{"type": "url", "url": "https://example.com/a.png"}},
					{"type": "document", "source": map[string]any{"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}},
				}},
				{"role": "assistant", "content": []map[string]any{
					{"type": "thinking", "thinking": text, "signature": "x"},
					{"type": "tool_use", "id": "t1", "name": "lookup", "input": map[string]any{"q": text}},
				}},
				{"role": "user", "content": []map[string]any{{"type": "tool_result", "tool_use_id": "t1", "content": text}}},
			},
		})
		require.NoError(t, err)
		in, out, err := EstimateBody(body)
		require.NoError(t, err)
		assert.Equal(t, int64(300), out)
		assert.GreaterOrEqual(t, in, 5*o200k(text)+imageMost, text)
	}

	p := anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 200,
		System:    []anthropic.TextBlockParam{{Text: "You are a scientist"}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello, Claude"))},
	}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	wantIn, wantOut, err := EstimateBody(b)
	require.NoError(t, err)
	in, out, err := Estimate(p)
	require.NoError(t, err)
	assert.Equal(t, [2]int64{wantIn, wantOut}, [2]int64{in, out})
	assert.Equal(t, int64(200), out)

	_, _, err = EstimateBody([]byte(`{"messages":`))
	assert.Error(t, err)
}
