package openai

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tiktoken-go/tokenizer"
)

// reported is a request whose prompt tokens OpenAI published as its API
// counted them.
type reported struct {
	Source       string          `json:"source"`
	Model        string          `json:"model"`
	PromptTokens int64           `json:"prompt_tokens"`
	Body         json.RawMessage `json:"body"`
}

// TestEstimateAgainstReported: on the requests whose counts OpenAI
// published (testdata/reported.json), the estimate's input part is never
// below the API's count, and its error is logged (docs/llm.md quotes it).
func TestEstimateAgainstReported(t *testing.T) {
	b, err := os.ReadFile("testdata/reported.json")
	require.NoError(t, err)
	var rs []reported
	require.NoError(t, json.Unmarshal(b, &rs))
	require.NotEmpty(t, rs)
	exact := 0
	for _, r := range rs {
		var body struct {
			MaxTokens int64 `json:"max_tokens"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &body))
		n, err := EstimateBody(r.Body)
		require.NoError(t, err)
		in := n - body.MaxTokens
		t.Logf("%s: estimated %d prompt tokens, the API counted %d (%+d, %+.1f%%)", r.Model, in, r.PromptTokens,
			in-r.PromptTokens, 100*float64(in-r.PromptTokens)/float64(r.PromptTokens))
		assert.GreaterOrEqual(t, in, r.PromptTokens, "%s: never below the API's count", r.Model)
		if in == r.PromptTokens {
			exact++
		}
	}
	assert.Positive(t, exact, "the chat format's framing is counted as the API does")
}

// TestEstimateBounds: over a corpus of requests (prose, code, JSON,
// non-Latin scripts, names, tools, images, several choices), no estimate is
// below the tokenizer's count of the texts plus max_completion_tokens for
// each choice; a request without a bound on its output has no estimate.
func TestEstimateBounds(t *testing.T) {
	texts := []string{
		"Summarise the following meeting notes in three bullet points.",
		strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40),
		"func main() {\n\tfor i := range 10 {\n\t\tfmt.Println(i * i)\n\t}\n}\n",
		`{"orders":[{"id":17,"items":["pen","ink"],"total":12.5},{"id":18,"items":[],"total":0}]}`,
		"Übersetze bitte: Die Grenzen des Dienstes gelten für jeden Schlüssel.",
		"请把这段话翻译成英文：速率限制按每分钟的令牌数计算。",
		"東京の天気を教えてください。明日は雨ですか？",
		"Привет! Сколько токенов в этом предложении?",
		"emoji 🚀🔥✨ and symbols ∑∫√ in one line",
		"",
	}
	enc, err := tokenizer.Get(tokenizer.O200kBase)
	require.NoError(t, err)
	count := func(s string) int64 {
		n, err := enc.Count(s)
		require.NoError(t, err)
		return int64(n)
	}
	checked := 0
	for i, text := range texts {
		for _, choices := range []int64{1, 3} {
			body := map[string]any{
				"model": "gpt-4o-mini",
				"messages": []map[string]any{
					{"role": "system", "content": "You answer briefly."},
					{"role": "user", "name": "ana", "content": text},
					{"role": "user", "content": []map[string]any{
						{"type": "text", "text": text},
						{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/a.png", "detail": "low"}},
						{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/b.png"}},
					}},
				},
				"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "lookup",
					"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}}}},
				"max_completion_tokens": 200 + i,
				"n":                     choices,
			}
			b, err := json.Marshal(body)
			require.NoError(t, err)
			n, err := EstimateBody(b)
			require.NoError(t, err)
			floor := count("You answer briefly.") + 2*count(text) + count("ana") + imageLow + imageHigh + int64(200+i)*choices
			assert.GreaterOrEqual(t, n, floor, "text %d, %d choices", i, choices)
			checked++
		}
	}
	assert.Equal(t, 2*len(texts), checked)

	_, err = EstimateBody([]byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	assert.ErrorIs(t, err, ErrNoMaxTokens)
	_, err = EstimateBody([]byte(`{"model":`))
	assert.Error(t, err)
}

// TestEstimateParams: the SDK's params give the estimate of the body they
// marshal to, and the codecs are shared safely between goroutines.
func TestEstimateParams(t *testing.T) {
	p := openai.ChatCompletionNewParams{
		Model: "gpt-5.1-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You answer briefly."),
			openai.UserMessage("How many tokens is this?"),
		},
		MaxCompletionTokens: openai.Int(50),
	}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	want, err := EstimateBody(b)
	require.NoError(t, err)
	// 3 framing tokens a message and its role, the texts, 3 for the reply, 50 out.
	assert.Equal(t, int64(3+1+4+3+1+6+3+50), want)

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if n, err := Estimate(p); err != nil || n != want {
					errs <- fmt.Errorf("estimate %d, %v", n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
