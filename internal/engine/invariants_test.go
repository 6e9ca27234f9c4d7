package engine

import (
	"strings"
	"sync"
	"testing"
)

// TestInvariantCheckCanFail: the active-count invariant reports a count
// that no run accounts for, also when some task holds its slots until its
// handler returns (that once turned the check off for every resource).
// (Moved from the root, where it reached the engine through a back door.)
func TestInvariantCheckCanFail(t *testing.T) {
	w := newWorld(t)
	defer w.close()
	var mu sync.Mutex
	var violations []error
	w.invariant = func(err error) { mu.Lock(); violations = append(violations, err); mu.Unlock() }
	for _, cmd := range []string{"service api max=5", "service other max=5", "task holds services=other hold", "task t services=api",
		"start", "submit u1 t", "done u1 ok"} {
		w.do(cmd)
	}
	mu.Lock()
	if len(violations) > 0 {
		t.Fatalf("violations before the corruption: %v", violations)
	}
	mu.Unlock()
	// A phantom holder of api, on the dispatcher goroutine.
	if _, _, err := ask(w.ctx, w.e, func(d *Engine) struct{} { d.services["api"].Active++; return struct{}{} }); err != nil {
		t.Fatal(err)
	}
	w.settle()
	mu.Lock()
	defer mu.Unlock()
	if len(violations) == 0 || !strings.Contains(violations[0].Error(), "api: active 1") {
		t.Fatalf("a phantom holder is not reported: %v", violations)
	}
	// The phantom is taken back, so that the engine stops cleanly.
	if _, _, err := ask(w.ctx, w.e, func(d *Engine) struct{} { d.services["api"].Active--; return struct{}{} }); err != nil {
		t.Fatal(err)
	}
}
