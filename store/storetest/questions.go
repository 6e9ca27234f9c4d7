package storetest

import (
	"testing"
	"time"

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

	old, own := h.deposed()
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

// CheckQuestionsMigrated checks a store opened on the fixture the
// backends' mkschema programs write before the questions table (SQLite
// schema 14, PostgreSQL schema 4: a completed unit done-1, a queued one
// queued-1, a schedule hourly, an owner_asked and an owner_answered
// event), once migrated: the units, the schedule and the old events are as
// they were, and a question then travels through the table without an
// event.
func CheckQuestionsMigrated(t *testing.T, st store.Store) {
	t.Helper()
	ctx := t.Context()
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued}, states)
	recs, err := st.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "hourly", recs[0].Name)
	evs, err := st.EventsAfter(ctx, 0, 100)
	require.NoError(t, err)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	assert.Contains(t, types, store.TypeOwnerAsked)
	assert.Contains(t, types, store.TypeOwnerAnswered)

	q, ok := st.(store.Questioner)
	require.True(t, ok, "the store carries questions")
	own, err := st.Acquire(ctx, store.Holder{Owner: "new-owner"})
	require.NoError(t, err)
	defer own.Release()
	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	b, err := st.Apply(ctx, []store.Op{
		&store.Ask{Question: store.OwnerQuestion{Nonce: "n2", Kind: "services"}, At: at},
		&store.AnswerQuestion{Epoch: own.Epoch(), ID: "n2", Answer: []byte(`[]`)},
	})
	require.NoError(t, err)
	for _, r := range b.Results {
		require.NoError(t, r.Err)
		assert.True(t, r.Applied)
	}
	answer, answered, err := q.Answered(ctx, "n2")
	require.NoError(t, err)
	assert.True(t, answered)
	assert.Equal(t, "[]", string(answer))
	last, err := st.LastSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, evs[len(evs)-1].Seq, last, "no event appended")
}
