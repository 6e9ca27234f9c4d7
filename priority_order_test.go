package runcue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestPriorityOrderByHeldScores: with one handler slot, units of several
// lanes (two task types) start in the order of the scores they hold, highest
// first, ties by submission, whatever order they were submitted in. Scores
// are drawn from a few values so that ties are common; PriorityTTL is long,
// so every unit holds its first score. The seed is logged.
func TestPriorityOrderByHeldScores(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 7))
	e := newEnv(t, runcue.Config{MaxConcurrent: 1, PriorityTTL: time.Hour, CallbackTimeout: 20 * time.Second,
		Priority: func(pc runcue.PriorityContext) float64 {
			var p struct{ Score float64 }
			_ = pc.Work.Bind(&p)
			return p.Score
		}})
	var mu sync.Mutex
	var order []string
	h := func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		order = append(order, w.ID)
		mu.Unlock()
		return nil, nil
	}
	require.NoError(t, e.c.Task("a", runcue.Task{Handler: h}))
	require.NoError(t, e.c.Task("b", runcue.Task{Handler: h}))
	const n = 600
	var subs []scoredSub
	for i := range n {
		id := fmt.Sprintf("u%03d", i)
		sc := float64(rnd.IntN(5)) / 4
		subs = append(subs, scoredSub{id, sc})
		task := []string{"a", "b"}[rnd.IntN(2)]
		_, err := e.c.Submit(e.ctx, runcue.Submission{Task: task, ID: id, Params: map[string]float64{"Score": sc}})
		require.NoError(t, err)
	}
	e.start()
	require.NoError(t, e.c.Drain(e.ctx))
	assert.Equal(t, byHeldScore(subs), order)
}

// scoredSub is a submission and the score the test's priority function
// gives it.
type scoredSub struct {
	id    string
	score float64
}

// byHeldScore returns the IDs of subs (in submission order) in the order
// a priority function must start them: highest score first, ties in
// submission order.
func byHeldScore(subs []scoredSub) []string {
	sorted := slices.Clone(subs)
	slices.SortStableFunc(sorted, func(a, b scoredSub) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	var ids []string
	for _, s := range sorted {
		ids = append(ids, s.id)
	}
	return ids
}

// TestPriorityScoresUnitsOfAParkedLane: units that arrive while their lane
// is parked (their service is full) are scored when the lane is ready
// again, and run in the order of their scores.
func TestPriorityScoresUnitsOfAParkedLane(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 11))
	e := newEnv(t, runcue.Config{PriorityTTL: time.Hour, CallbackTimeout: 20 * time.Second,
		Priority: func(pc runcue.PriorityContext) float64 {
			var p struct{ Score float64 }
			_ = pc.Work.Bind(&p)
			return p.Score
		}})
	require.NoError(t, e.c.Service("svc", runcue.Service{MaxConcurrent: 1}))
	release, blocked := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var order []string
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"svc"}, Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		if w.ID == "blocker" {
			close(blocked)
			<-release
		}
		mu.Lock()
		order = append(order, w.ID)
		mu.Unlock()
		return nil, nil
	}}))
	e.start()
	e.submit("t", func(s *runcue.Submission) { s.ID = "blocker"; s.Params = map[string]float64{"Score": 1} })
	<-blocked // the service is full: the lane of the units below is parked
	var subs []scoredSub
	for i := range 40 {
		s := scoredSub{fmt.Sprintf("u%02d", i), float64(rnd.IntN(4)) / 4}
		subs = append(subs, s)
		e.submit("t", func(x *runcue.Submission) { x.ID = s.id; x.Params = map[string]float64{"Score": s.score} })
	}
	e.settle()
	close(release)
	require.NoError(t, e.c.Drain(e.ctx))
	assert.Equal(t, append([]string{"blocker"}, byHeldScore(subs)...), order)
}
