package runcue_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// WorkInfo, ServiceStatus, Explanation and events share one JSON
// convention: snake_case names, RFC 3339 times, zero times left out,
// durations as integer milliseconds in *_ms fields. The shapes round-trip.
func TestJSONConvention(t *testing.T) {
	at := time.Date(2026, 11, 23, 1, 2, 3, 0, time.UTC)
	wi := runcue.WorkInfo{ID: "u1", Task: "fetch", Target: "https://example.org", State: runcue.StateFailed, Runs: 2, Failures: 2,
		CreatedAt: at, FinishedAt: at.Add(time.Minute), Timeout: 90 * time.Second, Error: "boom", ErrorKind: "error",
		Attempts: []runcue.Attempt{{Run: 1, Start: at, End: at.Add(time.Second), Outcome: "failed", Error: "boom"}}}
	b, err := json.Marshal(wi)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"u1","task":"fetch","target":"https://example.org","state":"failed","runs":2,"failures":2,
		"created_at":"2026-11-23T01:02:03Z","finished_at":"2026-11-23T01:03:03Z","timeout_ms":90000,
		"error":"boom","error_kind":"error",
		"attempts":[{"run":1,"start":"2026-11-23T01:02:03Z","end":"2026-11-23T01:02:04Z","outcome":"failed","error":"boom"}]}`, string(b))
	var back runcue.WorkInfo
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, wi, back)

	st := runcue.ServiceStatus{Name: "api", Class: "api", Circuit: runcue.CircuitClosed, Active: 1,
		Limits: runcue.Service{MaxConcurrent: 4, RateLimit: 10, RateWindow: time.Minute, CircuitThreshold: 3, CircuitTimeout: 30 * time.Second}}
	b, err = json.Marshal(st)
	require.NoError(t, err)
	assert.JSONEq(t, `{"name":"api","class":"api","active":1,"circuit":"closed",
		"limits":{"max_concurrent":4,"rate_limit":10,"rate_window_ms":60000,"circuit_threshold":3,"circuit_timeout_ms":30000}}`, string(b))
	var stBack runcue.ServiceStatus
	require.NoError(t, json.Unmarshal(b, &stBack))
	assert.Equal(t, st, stBack)

	qw := runcue.QueueWaitStats{Count: 3, P50: 5 * time.Millisecond, P90: time.Second, P95: 2 * time.Second, P99: time.Minute}
	b, err = json.Marshal(qw)
	require.NoError(t, err)
	assert.JSONEq(t, `{"count":3,"p50_ms":5,"p90_ms":1000,"p95_ms":2000,"p99_ms":60000}`, string(b))
	var qwBack runcue.QueueWaitStats
	require.NoError(t, json.Unmarshal(b, &qwBack))
	assert.Equal(t, qw, qwBack)

	ex := runcue.Explanation{ID: "u1", Task: "fetch", State: runcue.StateQueued, AsOf: at,
		Reasons: []runcue.Reason{{Kind: runcue.ReasonRateLimited, Service: "api", Until: at, Detail: "full"}}}
	b, err = json.Marshal(ex)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"u1","task":"fetch","state":"queued","live":false,"as_of":"2026-11-23T01:02:03Z",
		"reasons":[{"kind":"rate_window_full","service":"api","until":"2026-11-23T01:02:03Z","detail":"full"}]}`, string(b))

	// A page of List (it was "Units" and "Next").
	b, err = json.Marshal(runcue.WorkPage{Units: []runcue.WorkInfo{{ID: "u1", Task: "fetch", State: runcue.StateQueued, CreatedAt: at}},
		Next: "2s", Partial: true})
	require.NoError(t, err)
	assert.JSONEq(t, `{"units":[{"id":"u1","task":"fetch","state":"queued","runs":0,"failures":0,"created_at":"2026-11-23T01:02:03Z"}],
		"next":"2s","partial":true}`, string(b))

	// Limits with a margin and pacing; a service with none at all.
	b, err = json.Marshal(runcue.Service{RateLimit: 4, RateWindow: time.Second, Margin: 1500 * time.Microsecond, Pace: true})
	require.NoError(t, err)
	assert.JSONEq(t, `{"rate_limit":4,"rate_window_ms":1000,"margin_ms":2,"pace":true}`, string(b), "a margin rounds up to a millisecond")
	var svc runcue.Service
	require.NoError(t, json.Unmarshal([]byte(`{"rate_limit":4,"rate_window_ms":1000,"margin_ms":-1}`), &svc))
	assert.Equal(t, runcue.Service{RateLimit: 4, RateWindow: time.Second, Margin: -1}, svc)

	// Adaptive limits and fair shares, and an adaptive status.
	adaptive := runcue.ServiceStatus{Name: "tenant:a", Class: "tenant", Circuit: runcue.CircuitClosed,
		Limits: runcue.Service{RateLimit: 60, RateWindow: time.Minute, Adaptive: &runcue.Adaptive{Decrease: 0.7}, Share: "tokens",
			Weight: 2, MinConcurrent: 1},
		Adaptive: &runcue.AdaptiveStatus{Limits: []runcue.AdaptiveLimit{{Limit: "requests", Configured: 60, Effective: 42, Overloads: 3}},
			Throttled: 3}}
	b, err = json.Marshal(adaptive)
	require.NoError(t, err)
	assert.JSONEq(t, `{"name":"tenant:a","class":"tenant","active":0,"circuit":"closed",
		"limits":{"rate_limit":60,"rate_window_ms":60000,"adaptive":{"decrease":0.7},"share":"tokens","weight":2,"min_concurrent":1},
		"adaptive":{"limits":[{"limit":"requests","configured":60,"effective":42,"overloads":3}],"throttled":3}}`, string(b))
	var adaptiveBack runcue.ServiceStatus
	require.NoError(t, json.Unmarshal(b, &adaptiveBack))
	assert.Equal(t, adaptive, adaptiveBack)
	assert.Equal(t, []string{"effective limit 42/min (configured 60), lowered after 3 429s"}, adaptive.Adaptive.Describe(adaptive.Limits))
}

// Every work event carries its unit's target, delivered live and read
// back from the log: submitted, started, completed, failed with a
// dependency, cancelled, requeued by Retry.
func TestEventsCarryTarget(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	c := e.c
	require.NoError(t, c.Task("t", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Target == "bad" {
				return nil, errors.New("no")
			}
			return nil, nil
		}}))
	rec := record(t, c)
	e.start()
	_, err := c.SubmitBatch(e.ctx, []runcue.Submission{
		{ID: "good", Task: "t", Target: "good"},
		{ID: "bad", Task: "t", Target: "bad"},
		{ID: "child", Task: "t", Target: "child of bad", DependsOn: []string{"bad"}},
	})
	require.NoError(t, err)
	e.wait("good")
	e.wait("child")
	require.NoError(t, c.Retry(e.ctx, "bad"))
	e.wait("bad")
	require.NoError(t, c.PauseQueue(e.ctx))
	late := e.submit("t", func(s *runcue.Submission) { s.Target = "late" })
	require.NoError(t, c.Cancel(e.ctx, late, runcue.CancelOptions{}))
	rec.waitFor(t, 1, ofType(runcue.EventWorkCancelled, late))
	require.NoError(t, runcue.Settle(e.ctx, c))

	want := map[string]string{"good": "good", "bad": "bad", "child": "child of bad", late: "late"}
	check := func(evs []runcue.Event, how string) {
		kinds := map[runcue.EventType]bool{}
		for _, ev := range evs {
			if ev.WorkID == "" {
				continue
			}
			assert.Equal(t, want[ev.WorkID], ev.Target, "%s %s of %s", how, ev.Type, ev.WorkID)
			kinds[ev.Type] = true
		}
		for _, k := range []runcue.EventType{runcue.EventWorkQueued, runcue.EventWorkStarted, runcue.EventWorkCompleted,
			runcue.EventWorkFailed, runcue.EventWorkCancelled} {
			assert.True(t, kinds[k], "%s: a %s was seen", how, k)
		}
	}
	check(rec.all(), "live")
	stored, stop, err := c.Subscribe(e.ctx, runcue.SubscribeOptions{After: 0})
	require.NoError(t, err)
	defer stop()
	var replay []runcue.Event
	for len(replay) < len(rec.all()) {
		ev := recv(e, stored, "the log")
		if ev.Seq > 0 {
			replay = append(replay, ev)
		}
		if ev.Type == runcue.EventWorkCancelled && ev.WorkID == late {
			break
		}
	}
	check(replay, "replayed")
	b, err := json.Marshal(replay[0])
	require.NoError(t, err)
	assert.Contains(t, string(b), `"target":"good"`)
}
