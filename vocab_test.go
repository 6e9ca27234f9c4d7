package runcue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/engine"
)

// TestEngineVocabularyAgrees: the constants and reason kinds the engine
// keeps for itself are runcue's documented ones (the engine cannot name
// the public types, and the public package keeps their documentation).
func TestEngineVocabularyAgrees(t *testing.T) {
	assert.Equal(t, runcue.MaxFreeProbes, engine.MaxFreeProbes)
	assert.Equal(t, runcue.HighWater, engine.HighWater)
	assert.Equal(t, runcue.LowWater, engine.LowWater)
	for engineKind, kind := range map[engine.ReasonKind]runcue.ReasonKind{
		engine.ReasonRunning:             runcue.ReasonRunning,
		engine.ReasonFinished:            runcue.ReasonFinished,
		engine.ReasonDependencies:        runcue.ReasonDependencies,
		engine.ReasonDependencyCheck:     runcue.ReasonDependencyCheck,
		engine.ReasonServiceBusy:         runcue.ReasonServiceBusy,
		engine.ReasonRateLimited:         runcue.ReasonRateLimited,
		engine.ReasonCircuitOpen:         runcue.ReasonCircuitOpen,
		engine.ReasonCircuitProbe:        runcue.ReasonCircuitProbe,
		engine.ReasonBudgetExhausted:     runcue.ReasonBudgetExhausted,
		engine.ReasonQueuePaused:         runcue.ReasonQueuePaused,
		engine.ReasonTaskPaused:          runcue.ReasonTaskPaused,
		engine.ReasonPaused:              runcue.ReasonPaused,
		engine.ReasonServiceRetryAfter:   runcue.ReasonServiceRetryAfter,
		engine.ReasonGlobalCap:           runcue.ReasonGlobalCap,
		engine.ReasonCommitBacklog:       runcue.ReasonCommitBacklog,
		engine.ReasonTaskCap:             runcue.ReasonTaskCap,
		engine.ReasonBackoff:             runcue.ReasonBackoff,
		engine.ReasonRetryAfter:          runcue.ReasonRetryAfter,
		engine.ReasonRunAt:               runcue.ReasonRunAt,
		engine.ReasonDependenciesSkipped: runcue.ReasonDependenciesSkipped,
		engine.ReasonBackpressure:        runcue.ReasonBackpressure,
		engine.ReasonTaskNotRegistered:   runcue.ReasonTaskNotRegistered,
		engine.ReasonStopping:            runcue.ReasonStopping,
		engine.ReasonNotLoaded:           runcue.ReasonNotLoaded,
		engine.ReasonEligible:            runcue.ReasonEligible,
	} {
		assert.Equal(t, string(kind), string(engineKind))
	}
}
