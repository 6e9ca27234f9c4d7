package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// scenarioYAML are the built-in scenarios, in the configuration file's
// format: `runcue-sim --scenario NAME --print-config` writes one out as a
// starting point for a file of your own.
var scenarioYAML = map[string]string{
	"steady_load": `
description: Sustained load at 80% of capacity over two services, with every failure mode a call can have and every dependency pattern (circular ones are refused at submit).
services:
  mock_api:
    max_concurrent: 5
    rate_limit: 60
    rate_window: 60
    circuit_threshold: 8
    circuit_timeout: 30s
    behavior:
      latency: {distribution: normal, mean: 200ms, stddev: 50ms, outlier_rate: 0.01, outlier_multiplier: 10}
      error_rate: 0.05
      timeout_rate: 0.02
      permanent_error_rate: 0.01
  mock_ssh:
    max_concurrent: 1
    behavior:
      latency: {distribution: uniform, min: 500ms, max: 2000ms}
      error_rate: 0.10
workload:
  pattern: random
  pattern_weights: {none: 0.25, single: 0.15, chain: 0.1, fan_out: 0.1, fan_in: 0.1, diamond: 0.15, complex: 0.1, circular: 0.05}
  chain_depth: 4
  fan_out_width: 3
  fan_in_width: 3
  task_types: [extract, transform, load]
  load: 0.8
  timeout: 5s
expect:
  refused: true
`,
	"burst": `
description: A burst to 200% of capacity for ten minutes against a bounded queue; backpressure refuses the excess, and everything accepted completes.
services:
  mock_api:
    max_concurrent: 5
    rate_limit: 60
    rate_window: 60
    behavior:
      latency: {distribution: normal, mean: 200ms, stddev: 50ms}
      error_rate: 0.02
  mock_ssh:
    max_concurrent: 1
    behavior:
      latency: {distribution: uniform, min: 500ms, max: 2000ms}
      error_rate: 0.02
workload:
  pattern: random
  pattern_weights: {none: 0.5, single: 0.3, chain: 0.2}
  task_types: [extract, transform, load]
  load: 0.8
  burst_at: 10m
  burst_length: 10m
  burst_factor: 2.5
  max_queued: 300
expect:
  backpressure: true
`,
	"cascade_failure": `
description: One service (mock_flaky) fails every call from minute 10 to minute 20; its circuit opens and probes until it recovers, while the other services run on unaffected.
services:
  mock_api:
    max_concurrent: 4
    rate_limit: 30
    rate_window: 60
    circuit_threshold: 5
    circuit_timeout: 30s
    behavior:
      latency: {distribution: normal, mean: 300ms, stddev: 80ms}
  mock_db:
    max_concurrent: 2
    circuit_threshold: 5
    circuit_timeout: 30s
    behavior:
      latency: {distribution: lognormal, median: 400ms, sigma: 0.4}
  mock_flaky:
    max_concurrent: 3
    circuit_threshold: 5
    circuit_timeout: 30s
    behavior:
      latency: {distribution: normal, mean: 250ms, stddev: 50ms}
      fail_from: 10m
      fail_for: 10m
workload:
  pattern: none
  task_types: [api_call, db_query, flaky_call]
  load: 0.6
  max_attempts: 4
  base_delay: 5s
expect:
  circuit_opens: [mock_flaky]
  unaffected: [mock_api, mock_db]
`,
	"priority_test": `
description: High- and low-priority units (30% high) on one saturated service; no low-priority unit may start while a high-priority one is eligible and waiting.
services:
  mock_gpu:
    max_concurrent: 2
    behavior:
      latency: {distribution: normal, mean: 2s, stddev: 500ms}
workload:
  pattern: none
  task_types: [render]
  load: 1.15
  high_fraction: 0.3
expect:
  no_inversions: true
`,
	"starvation": `
description: A stream of high-priority units at 95% of capacity plus low-priority units at 10%; with aging (score max(priority, wait/5m)) every low-priority unit starts within 6 minutes (5 to reach the stream's score, then its turn as the oldest), where strict priority would starve them.
services:
  mock_gpu:
    max_concurrent: 2
    behavior:
      latency: {distribution: normal, mean: 2s, stddev: 500ms}
workload:
  pattern: none
  task_types: [render]
  rate: 0.1
  high_rate: 0.95
  aging: 5m
expect:
  max_low_wait: 6m
`,
	"llm_api": `
description: An LLM API limited to 60 requests and 100,000 tokens per minute that answers 5% of calls 429 with a Retry-After of 20s. Each call reserves its input (overestimated by up to 10%) plus max_tokens (1,000), reports the tokens it used, and reads the mock's own count from Anthropic's headers; runcue holds the service back for each Retry-After and stays under both limits, counted at the mock.
services:
  llm:
    max_concurrent: 10
    rate_limit: 60
    rate_window: 1m
    tokens:
      limit: 100000
      window: 1m
      input: {min: 100, max: 1500}
      output: {min: 50, max: 1000}
      max_tokens: 1000
      estimate_error: 0.1
      headers: anthropic
    behavior:
      latency: {distribution: lognormal, median: 800ms, sigma: 0.5, outlier_rate: 0.02, outlier_multiplier: 5}
      rate_limited_rate: 0.05
      retry_after: 20s
      error_rate: 0.02
workload:
  pattern: random
  pattern_weights: {none: 0.6, chain: 0.2, fan_out: 0.2}
  chain_depth: 3
  task_types: [complete]
  load: 0.85
  timeout: 30s
expect:
  deferrals: true
`,
	"llm_tokens": `
description: An LLM API whose binding limit is 100,000 tokens per minute, with calls of 1,000 to 5,000 tokens (1-5% of the limit) estimated up to 10% high, the actual use reported when each ends, and OpenAI's headers read; offered 1.3 times what the limit lets through, so work always waits. The mock counts tokens at arrival, never more than the limit in a minute, and at least 95% of the limit is used while work is submitted.
services:
  llm:
    max_concurrent: 20
    tokens:
      limit: 100000
      window: 1m
      input: {min: 500, max: 2500}
      output: {min: 500, max: 2500}
      estimate_error: 0.1
      headers: openai
    behavior:
      latency: {distribution: lognormal, median: 1500ms, sigma: 0.4}
workload:
  pattern: none
  task_types: [complete]
  load: 1.3
  timeout: 1m
duration: 15m
expect:
  token_utilisation: 0.95
`,
	"llm_bucket": `
description: An LLM API whose limit is a refilling bucket of 40,000 tokens a minute (as Anthropic describes its limits), its headers Anthropic's, calls of 1,000 to 4,000 tokens estimated up to 10% high and answered in 0.5 to 5 s, streamed (headers at the first byte, usage with the last event); runcue's meter is a bucket too, offered 1.3 times what the limit lets through. The mock counts each call's tokens out of its bucket at arrival; no call finds it short, and at least 90% of the limit is used while work is submitted.
services:
  llm:
    max_concurrent: 20
    tokens:
      limit: 40000
      window: 1m
      bucket: true
      mock_bucket: true
      input: {min: 500, max: 2000}
      output: {min: 500, max: 2000}
      estimate_error: 0.1
      headers: anthropic
    behavior:
      latency: {distribution: uniform, min: 500ms, max: 5s}
      stream: 0.1
workload:
  pattern: none
  task_types: [complete]
  load: 1.3
  timeout: 1m
duration: 15m
expect:
  token_utilisation: 0.9
`,
	"hidden_limit": `
description: An API that grants only 36 of the 60 calls a minute runcue is told (its real limit, 60% of the configured one, hidden), answering 429 with a 2 s Retry-After beyond it and saying nothing else; after an hour it grants all 60. Offered 1.3 times the configured limit, so work always waits. runcue's adaptive limit finds the hidden one (under 2% of calls refused, at least 85% of it used over the second half-hour) and follows the rise. Set adaptive to false to see the same run without.
services:
  api:
    max_concurrent: 10
    rate_limit: 60
    rate_window: 1m
    adaptive: true
    behavior:
      latency: {distribution: lognormal, median: 300ms, sigma: 0.3}
      hidden_limit: 36
      hidden_until: 1h
      retry_after: 2s
workload:
  pattern: none
  task_types: [call]
  load: 1.3
  timeout: 30s
  max_attempts: 5
duration: 90m
expect:
  hidden_refusals: 0.02
  hidden_throughput: 0.85
  hidden_follow: 20m
`,
	"tenants": `
description: Two tenants share an LLM API's 100,000 tokens a minute, tenant a offering 60% of what it lets through and tenant b 90% (both more than their shares, so both always have work waiting); tenant b has weight 2. Shares are counted in tokens, not requests, so each tenant's share of the tokens is within 10% of its weight's (a third and two thirds), whatever its backlog. Set tenant_share to "" to see first come, first served (shares follow the offered load instead).
services:
  llm:
    max_concurrent: 20
    tokens:
      limit: 100000
      window: 1m
      input: {min: 500, max: 2500}
      output: {min: 500, max: 2500}
      headers: openai
    behavior:
      latency: {distribution: lognormal, median: 1500ms, sigma: 0.4}
workload:
  pattern: none
  task_types: [complete]
  tenants:
    - {name: a, load: 0.6}
    - {name: b, load: 0.9, weight: 2}
  tenant_share: tokens
  timeout: 1m
duration: 20m
expect:
  tenant_shares: true
`,
	"shared_key": `
description: An OpenAI-style API key shared with another program that steadily sends 40% of its 12,000 tokens per 2 s (a request every 100 ms); the API counts every request's tokens at arrival, 0 to 5 ms after its start, in a sliding window and answers 429 (Retry-After 1 s) to one that does not fit. runcue, told the key's whole limit and offered 75% of it (backlogged), learns of the other program only from the x-ratelimit headers and keeps room for it. At most 1% of runcue's calls are answered 429, runcue uses at least 80% of what the other program leaves, and the other program is refused at most 5 points more often than with runcue absent.
services:
  llm:
    max_concurrent: 30
    tokens:
      limit: 12000
      window: 2s
      input: {min: 100, max: 300}
      output: {min: 50, max: 150}
      max_tokens: 150
      estimate_error: 0.05
      headers: openai
      shared: {share: 0.4, every: 100ms}
    behavior:
      latency: {distribution: uniform, min: 50ms, max: 300ms}
      retry_after: 1s
      wire_min: 0s
      wire_max: 5ms
workload:
  pattern: none
  task_types: [complete]
  load: 0.75
  timeout: 30s
duration: 10m
drain: 30m
expect:
  shared_refusals: 0.01
  shared_of_left: 0.8
  shared_foreign: 5
`,
	"shared_bucket": `
description: The shared key of shared_key, its limit a refilling bucket of 12,000 tokens per 2 s (as Anthropic describes its limits) with Anthropic's headers, and runcue's meter a bucket too; answers take 0.5 to 5 s and stream (headers at the first byte, usage with the last event). The other program takes 40% of the refill steadily; runcue learns of it only from the headers, leaves it its share of the refill and keeps room for its requests. At most 1% of runcue's calls are answered 429, runcue uses at least 80% of what the other program leaves, and the other program is refused at most 5 points more often than with runcue absent.
services:
  llm:
    max_concurrent: 100
    tokens:
      limit: 12000
      window: 2s
      bucket: true
      mock_bucket: true
      input: {min: 100, max: 300}
      output: {min: 50, max: 150}
      max_tokens: 150
      estimate_error: 0.05
      headers: anthropic
      shared: {share: 0.4, every: 100ms}
    behavior:
      latency: {distribution: uniform, min: 500ms, max: 5s}
      stream: 0.1
      retry_after: 1s
      wire_min: 0s
      wire_max: 5ms
workload:
  pattern: none
  task_types: [complete]
  load: 0.75
  timeout: 30s
duration: 10m
drain: 30m
expect:
  shared_refusals: 0.01
  shared_of_left: 0.8
  shared_foreign: 5
`,
	"headers_only": `
description: An LLM API of 100,000 tokens a minute, which runcue is told only as a conservative 10,000 (a new key, limits unknown) and reads from the API's headers (x-ratelimit-limit-tokens); the API refuses (429) a call whose tokens do not fit at arrival. Offered about 1.25 times what the real limit lets through. runcue reaches 90% of the real limit within three windows and draws at most 1% 429s after the first.
services:
  llm:
    max_concurrent: 20
    tokens:
      limit: 10000
      mock_limit: 100000
      from_provider: true
      max_limit: 200000
      enforce: true
      window: 1m
      input: {min: 500, max: 2500}
      output: {min: 500, max: 2500}
      estimate_error: 0.1
      headers: openai
    behavior:
      latency: {distribution: lognormal, median: 1500ms, sigma: 0.4}
      retry_after: 5s
workload:
  pattern: none
  task_types: [complete]
  rate: 0.7
  timeout: 1m
duration: 15m
expect:
  headers_reach: 0.9
  headers_refusals: 0.01
`,
	"debounce": `
description: Edits of 30 documents arrive at random, each re-indexed by a debounced task (5 s after its last edit); an index call takes 200 ms to 1 s, five at a time. Each burst of edits runs once, for its last edit; the edits it replaced end skipped; no unit runs once a later edit of its document came before its start.
services:
  indexer:
    max_concurrent: 5
    behavior:
      latency: {distribution: uniform, min: 200ms, max: 1s}
      error_rate: 0.02
workload:
  pattern: none
  task_types: [reindex]
  rate: 4
  keys: 30
  debounce: 5s
duration: 20m
`,
	"sequence": `
description: Ledger entries of 12 accounts arrive at random and post one at a time per account, in the order they arrived, through an API that answers 429 (a Retry-After) or fails now and then; a failed entry is retried after its backoff, and the account's next entries wait for it.
services:
  ledger:
    max_concurrent: 8
    rate_limit: 300
    rate_window: 1m
    behavior:
      latency: {distribution: uniform, min: 100ms, max: 600ms}
      error_rate: 0.1
      rate_limited_rate: 0.05
      retry_after: 3s
workload:
  pattern: none
  task_types: [post]
  rate: 3
  keys: 12
  sequence: true
  max_attempts: 5
  base_delay: 2s
duration: 20m
`,
	"batch": `
description: Texts to embed arrive at random, 20 a second, through an embedding API limited to 60,000 tokens and 30 requests a minute, 4 calls at once; runcue sends them in batches of at most 100 texts or 4,000 tokens, each batch waiting up to 2 s for more texts. A batch is one call and one request, counted at its arrival with its texts' summed tokens; an answer rejects 2% of the texts on their own, retried alone; the API answers 429 now and then, which defers the whole batch.
services:
  embed:
    max_concurrent: 4
    rate_limit: 30
    rate_window: 1m
    tokens:
      limit: 60000
      window: 1m
      input: {min: 10, max: 60}
      output: {min: 0, max: 0}
      estimate_error: 0.1
      headers: openai
    behavior:
      latency: {distribution: uniform, min: 200ms, max: 1500ms}
      rate_limited_rate: 0.02
      retry_after: 5s
workload:
  pattern: none
  task_types: [embed]
  rate: 20
  batch: {max: 100, max_tokens: 4000, wait: 2s, item_error_rate: 0.02}
  max_attempts: 5
  base_delay: 1s
duration: 20m
`,
	"recovery": `
description: The Cue runs in a child process that is SIGKILLed at random moments and restarted; the mocks and their counters live in the parent, which checks that no unit is lost and none completes twice, and counts the handler executions the kills repeated. Real clock.
services:
  mock_api:
    max_concurrent: 4
    rate_limit: 40
    rate_window: 1s
    behavior:
      latency: {distribution: uniform, min: 50ms, max: 400ms}
  mock_db:
    max_concurrent: 2
    behavior:
      latency: {distribution: uniform, min: 20ms, max: 200ms}
workload:
  pattern: random
  pattern_weights: {none: 0.4, single: 0.2, diamond: 0.2, fan_in: 0.2}
  task_types: [fetch, store]
  rate: 60
duration: 5s
kills: 6
`,
}

// scenarioNames returns the built-in scenarios, sorted.
func scenarioNames() []string {
	var out []string
	for n := range scenarioYAML {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// scenario returns a built-in scenario's configuration.
func scenario(name string) (Config, error) {
	y, ok := scenarioYAML[name]
	if !ok {
		return Config{}, fmt.Errorf("unknown scenario %q (have %s)", name, strings.Join(scenarioNames(), ", "))
	}
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(y))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("scenario %s: %w", name, err)
	}
	c.Name = name
	if c.Duration == 0 {
		c.Duration = Duration(time.Hour)
	}
	return c, nil
}
