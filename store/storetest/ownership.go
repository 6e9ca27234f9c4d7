package storetest

import (
	"testing"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: ownership (Acquire).

func testAcquire(t *testing.T, h *harness) {
	since := time.Unix(1_800_000_000, 0)
	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "first", PID: 4242, Host: "hostA", Since: since})
	require.NoError(t, err)
	other := h.again()
	defer other.Close()
	_, err = other.Acquire(h.ctx, store.Holder{Owner: "second"})
	require.ErrorIs(t, err, store.ErrLocked)
	var le *store.LockedError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "first", le.Holder.Owner)
	assert.Equal(t, 4242, le.Holder.PID)
	assert.Equal(t, "hostA", le.Holder.Host)
	assert.True(t, le.Holder.Since.Equal(since))
	assert.Contains(t, err.Error(), "4242")
	_, err = h.st.Acquire(h.ctx, store.Holder{Owner: "again"})
	assert.ErrorIs(t, err, store.ErrLocked, "the same handle cannot acquire twice")
	require.NoError(t, own.Release())
	require.NoError(t, own.Release(), "Release is idempotent")
	own2, err := other.Acquire(h.ctx, store.Holder{Owner: "second"})
	require.NoError(t, err)
	require.NoError(t, own2.Release())
}
