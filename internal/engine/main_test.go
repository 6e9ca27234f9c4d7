package engine

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine the engine starts has an owner and a stop path.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
