package runcue

import (
	"testing"
	"time"

	"github.com/runcue/runcue/store"
)

// Percentiles come from the histogram: the bound of the bucket that holds
// the rank.
func TestQueueWaitStats(t *testing.T) {
	h := make([]int64, len(store.QueueWaitBounds)+1)
	if q := queueWaitStats(h); q != (QueueWaitStats{}) {
		t.Fatalf("empty: %+v", q)
	}
	h[store.WaitBucket(3*time.Millisecond)] = 50   // up to 5ms
	h[store.WaitBucket(800*time.Millisecond)] = 40 // up to 1s
	h[store.WaitBucket(2*time.Minute)] = 9         // up to 5m
	h[len(h)-1] = 1                                // beyond an hour
	q := queueWaitStats(h)
	want := QueueWaitStats{Count: 100, P50: 5 * time.Millisecond, P90: time.Second, P95: 5 * time.Minute, P99: 5 * time.Minute}
	if q != want {
		t.Fatalf("got %+v, want %+v", q, want)
	}
	h[len(h)-1] = 100
	if q := queueWaitStats(h); q.P99 != time.Hour {
		t.Fatalf("past the last bound: %v", q.P99)
	}
}
