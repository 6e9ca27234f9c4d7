package runcue_test

import (
	"encoding/json"
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

	ex := runcue.Explanation{ID: "u1", Task: "fetch", State: runcue.StateQueued, AsOf: at,
		Reasons: []runcue.Reason{{Kind: runcue.ReasonRateLimited, Service: "api", Until: at, Detail: "full"}}}
	b, err = json.Marshal(ex)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"u1","task":"fetch","state":"queued","live":false,"as_of":"2026-11-23T01:02:03Z",
		"reasons":[{"kind":"rate_window_full","service":"api","until":"2026-11-23T01:02:03Z","detail":"full"}]}`, string(b))
}
