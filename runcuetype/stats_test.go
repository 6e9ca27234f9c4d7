package runcuetype_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/runcue/runcue/runcuetype"
)

// TestQueueWaitBounds: a percentile read from the histogram is shown as
// the bucket it fell in, not as an exact figure.
func TestQueueWaitBounds(t *testing.T) {
	q := runcuetype.QueueWaitStats{Count: 10}
	for p, want := range map[time.Duration]string{
		time.Millisecond:     "under 1ms",
		5 * time.Millisecond: "1ms-5ms",
		5 * time.Minute:      "1m0s-5m0s",
		time.Hour:            "over 15m0s",
		2 * time.Hour:        "over 1h0m0s",
	} {
		assert.Equal(t, want, q.Bounds(p), "%v", p)
	}
	assert.Equal(t, "-", runcuetype.QueueWaitStats{}.Bounds(0))
}
