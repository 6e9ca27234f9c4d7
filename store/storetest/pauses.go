package storetest

import (
	"testing"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: pauses of task types and of the queue.

func testPauses(t *testing.T, h *harness) {
	p, err := h.st.Pauses(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, store.Pauses{}, p, "nothing paused at first")
	h.apply(&store.PutTask{Name: "a", Def: []byte(`{}`)}, &store.PutTask{Name: "b", Def: []byte(`{}`)})

	r := h.apply(&store.SetPause{Task: "b", Paused: true}, &store.SetPause{Paused: true}, &store.SetPause{Task: "ghost", Paused: true})
	assert.True(t, r[0].Applied)
	assert.True(t, r[1].Applied)
	assert.False(t, r[2].Applied, "an unknown task")
	p, err = h.st.Pauses(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, store.Pauses{Queue: true, Tasks: []string{"b"}}, p)

	h.apply(&store.PutTask{Name: "b", Def: []byte(`{"services":[]}`)}) // re-registered: the pause stays
	p, err = h.st.Pauses(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"b"}, p.Tasks)

	h.apply(&store.SetPause{Task: "b"}, &store.SetPause{})
	p, err = h.st.Pauses(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, store.Pauses{}, p)
	h.apply(&store.SetPause{Task: "a", Paused: true})
	other := h.again()
	defer other.Close()
	p, err = other.Pauses(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, p.Tasks, "stored: another handle reads it")
}
