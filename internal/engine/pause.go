package engine

import (
	"context"

	"github.com/runcue/runcue/store"
)

// reloadPauses re-reads the stored pauses on the reader goroutine, applies
// them, and closes applied (if not nil).
func (d *Engine) reloadPauses(applied chan struct{}) {
	d.read(func(ctx context.Context) func(*Engine) {
		p, err := d.st.Pauses(ctx)
		return func(d *Engine) {
			if applied != nil {
				defer close(applied)
			}
			if err != nil {
				d.log.Error("runcue: read pauses", "error", err)
				return
			}
			d.applyPauses(p)
		}
	})
}

// applyPauses makes p the pauses in force: the queue's, and each task's
// on its cap.
func (t *resourceTable) applyPauses(p store.Pauses) {
	if p.Queue != t.queuePaused {
		t.queuePaused = p.Queue
		t.log.Info("runcue: queue " + pauseWord(p.Queue))
	}
	t.pausedTasks = make(map[string]bool, len(p.Tasks))
	for _, name := range p.Tasks {
		t.pausedTasks[name] = true
	}
	for name, rt := range t.tasks {
		paused := t.pausedTasks[name]
		if rt.cap.Paused == paused {
			continue
		}
		rt.cap.Paused = paused
		t.log.Info("runcue: task "+pauseWord(paused), "task_type", name)
		t.wakeAll(rt.cap)
	}
}

func pauseWord(paused bool) string {
	if paused {
		return "paused"
	}
	return "resumed"
}
