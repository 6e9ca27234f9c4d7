//go:build unix

package postgres_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// proxiedURL is u (a URL of the shared test server) through p.
func proxiedURL(u string, p *proxy) string {
	i := strings.Index(u, "@") + 1
	j := i + strings.Index(u[i:], "/")
	return u[:i] + p.addr() + u[j:]
}

// upstreamOf is the host:port of URL u.
func upstreamOf(u string) string {
	i := strings.Index(u, "@") + 1
	return u[i : i+strings.Index(u[i:], "/")]
}

// TestCommitCutResolved: the connection is cut right after a COMMIT
// reached the server (the proxy forwards the COMMIT and closes both
// sides): the writer asks the server whether the transaction committed
// (txid_status) rather than trying it again, so nothing is applied twice:
// one work_queued event for the unit submitted, one queue_changed for the
// pause, and the submission is not reported a duplicate of itself.
func TestCommitCutResolved(t *testing.T) {
	ctx := context.Background()
	u := schemaURL(t)
	p := startProxy(t, upstreamOf(u))
	st, err := postgres.Open(ctx, proxiedURL(u, p), postgres.Options{LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}))

	p.cutAfterMessage([]byte("commit"))
	sub, err := c.Submit(ctx, runcue.Submission{Task: "t", ID: "once"})
	require.NoError(t, err)
	assert.False(t, sub.Duplicate, "the submission is its own, not a duplicate of a first attempt that committed")
	require.Equal(t, 1, p.cutCount(), "the COMMIT's connection was cut")

	p.cutAfterMessage([]byte("commit"))
	require.NoError(t, c.PauseQueue(ctx))
	require.Equal(t, 2, p.cutCount())

	direct, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer direct.Close()
	evs, err := direct.EventsAfter(ctx, 0, 100)
	require.NoError(t, err)
	count := map[string]int{}
	for _, e := range evs {
		count[e.Type]++
	}
	assert.Equal(t, 1, count[store.TypeWorkQueued], "work_queued once: %v", count)
	assert.Equal(t, 1, count[store.TypeQueueChanged], "queue_changed once: %v", count)
}
