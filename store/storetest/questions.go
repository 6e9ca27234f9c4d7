package storetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// Conformance: questions to the live owner travel outside the event log.
// An asked question is listed until answered; its answer is read by its
// ID; the asker forgets it, and the owner's answer forgets the questions
// asked before its Forget; a deposed owner's answer is fenced; nothing
// of it reaches the log.
func testQuestions(t *testing.T, h *harness) {
	q, ok := h.st.(store.Questioner)
	if !ok {
		t.Skip("the store carries no questions (store.Questioner)")
	}
	last, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	t0 := h.tick()
	res := h.apply(
		&store.Ask{Question: store.OwnerQuestion{Nonce: "q1", Kind: "explain", ID: "u1"}, At: t0},
		&store.Ask{Question: store.OwnerQuestion{Nonce: "q2", Kind: "services"}, At: t0},
		&store.Ask{Question: store.OwnerQuestion{Nonce: "q1", Kind: "services"}, At: t0}, // the same nonce again: kept once
	)
	assert.True(t, res[0].Applied)
	assert.True(t, res[1].Applied)
	assert.False(t, res[2].Applied)
	open, err := q.Questions(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, []store.OwnerQuestion{{Nonce: "q1", Kind: "explain", ID: "u1"}, {Nonce: "q2", Kind: "services"}}, open)
	_, answered, err := q.Answered(h.ctx, "q1")
	require.NoError(t, err)
	assert.False(t, answered, "asked, not answered")

	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "old"})
	require.NoError(t, err)
	old := own.Epoch()
	require.NoError(t, own.Release())
	own, err = h.st.Acquire(h.ctx, store.Holder{Owner: "new"})
	require.NoError(t, err)
	defer own.Release()
	res = h.apply(&store.AnswerQuestion{Epoch: old, ID: "q1", Answer: []byte(`{"stale":true}`)})
	assert.ErrorIs(t, res[0].Err, store.ErrNotOwner, "a deposed owner's answer")
	res = h.apply(
		&store.AnswerQuestion{Epoch: own.Epoch(), ID: "q1", Answer: []byte(`{"id":"u1"}`)},
		&store.AnswerQuestion{Epoch: own.Epoch(), ID: "q1", Answer: []byte(`{"twice":true}`)},
		&store.AnswerQuestion{Epoch: own.Epoch(), ID: "q2"},
		&store.AnswerQuestion{Epoch: own.Epoch(), ID: "gone"},
	)
	assert.True(t, res[0].Applied)
	assert.False(t, res[1].Applied, "answered once")
	assert.True(t, res[2].Applied)
	assert.False(t, res[3].Applied, "a question not stored")
	answer, answered, err := q.Answered(h.ctx, "q1")
	require.NoError(t, err)
	assert.True(t, answered)
	assert.JSONEq(t, `{"id":"u1"}`, string(answer))
	answer, answered, err = q.Answered(h.ctx, "q2")
	require.NoError(t, err)
	assert.True(t, answered, "answered with none")
	assert.Nil(t, answer)
	open, err = q.Questions(h.ctx)
	require.NoError(t, err)
	assert.Empty(t, open)

	assert.True(t, h.apply(&store.ForgetQuestion{ID: "q1"})[0].Applied)
	_, answered, err = q.Answered(h.ctx, "q1")
	require.NoError(t, err)
	assert.False(t, answered, "forgotten")
	// An answer forgets what was asked before its Forget: q2, whose
	// asker is gone, and not q3.
	t3 := h.tick()
	h.apply(&store.Ask{Question: store.OwnerQuestion{Nonce: "q3", Kind: "services"}, At: t3})
	h.apply(&store.AnswerQuestion{Epoch: own.Epoch(), ID: "q3", Answer: []byte(`[]`), Forget: t3})
	_, answered, err = q.Answered(h.ctx, "q2")
	require.NoError(t, err)
	assert.False(t, answered, "asked before Forget")
	_, answered, err = q.Answered(h.ctx, "q3")
	require.NoError(t, err)
	assert.True(t, answered)

	after, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, last, after, "questions append no event")
}
