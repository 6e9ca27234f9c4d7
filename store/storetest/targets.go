package storetest

import (
	"testing"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
)

// Conformance: the events the store derives carry their unit's target
// (insert, propagation, cancel, requeue), and the log keeps it.

func testEventTargets(t *testing.T, h *harness) {
	root := h.unit("a", func(u *store.Unit) { u.Target = "root.example" })
	dep := h.unit("a", func(u *store.Unit) { u.Target = "dep.example"; u.DependsOn = []string{root.ID} })
	other := h.unit("a", func(u *store.Unit) { u.Target = "other.example" })
	h.insert(root, dep, other)
	h.claim(root.ID, 1)
	h.finish(root.ID, 1, store.Failed, func(f *store.Finish) { f.Propagate = true })
	h.apply(&store.Cancel{ID: other.ID, At: h.tick()})
	h.apply(&store.Requeue{IDs: []string{root.ID}, At: h.tick()})
	want := map[string]string{root.ID: "root.example", dep.ID: "dep.example", other.ID: "other.example"}
	seen := map[string]bool{}
	for _, ev := range h.events(0) {
		if ev.WorkID == "" || ev.Type == "work_started" || (ev.WorkID == root.ID && ev.Type == "work_failed") {
			continue // the harness's own claim and finish events carry none
		}
		assert.Equal(t, want[ev.WorkID], ev.Target, "%s of %s", ev.Type, ev.WorkID)
		seen[ev.Type] = true
	}
	assert.True(t, seen["work_queued"] && seen["work_failed"] && seen["work_cancelled"], "%v", seen)
}
