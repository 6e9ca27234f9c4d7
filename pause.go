package runcue

import (
	"context"
	"fmt"
	"slices"

	"github.com/runcue/runcue/store"
)

// Pauses of a task type and of the whole queue: stored, honoured by the
// owner (at once when made in its process, within its PollInterval when
// made in another), reported as task_changed and queue_changed events.
// Running units continue; queued ones wait, and Explain says why. Drain
// waits for paused work too.

// PauseTask stops dispatching units of task type name until ResumeTask.
// The task must be registered here or in the database (ErrUnknownTask).
func (c *Cue) PauseTask(ctx context.Context, name string) error {
	return c.setPause(ctx, name, true)
}

// ResumeTask lets a paused task type's units be dispatched again.
func (c *Cue) ResumeTask(ctx context.Context, name string) error {
	return c.setPause(ctx, name, false)
}

// PauseQueue stops dispatching any unit until ResumeQueue.
func (c *Cue) PauseQueue(ctx context.Context) error { return c.setPause(ctx, "", true) }

// ResumeQueue lets units be dispatched again after PauseQueue.
func (c *Cue) ResumeQueue(ctx context.Context) error { return c.setPause(ctx, "", false) }

func (c *Cue) setPause(ctx context.Context, task string, paused bool) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	change := "resumed"
	if paused {
		change = "paused"
	}
	typ := EventQueueChanged
	if task != "" {
		typ = EventTaskChanged
	}
	ev := &store.AppendEvent{Event: store.Event{Type: string(typ), Task: task, Time: c.clock.Now(),
		Data: store.EventData{Reason: change}.Encode()}}
	res, err := c.w.Do(ctx, &store.SetPause{Task: task, Paused: paused}, ev)
	if err != nil {
		return wrapStoreErr(err)
	}
	if !res[0].Applied {
		return fmt.Errorf("%w: %q", ErrUnknownTask, task)
	}
	// As for services: the owner applies it before this returns.
	if d := c.disp.Load(); d != nil {
		d.pausesChanged(ctx)
	}
	return nil
}

// storedPauseReasons says, from the database, whether the queue or task
// is paused (for Explain in a process that does not own the database).
func (c *Cue) storedPauseReasons(ctx context.Context, task string) ([]Reason, error) {
	p, err := c.st.Pauses(ctx)
	if err != nil {
		return nil, err
	}
	var out []Reason
	if p.Queue {
		out = append(out, queuePausedReason())
	}
	if slices.Contains(p.Tasks, task) {
		out = append(out, taskPausedReason(task))
	}
	return out, nil
}
