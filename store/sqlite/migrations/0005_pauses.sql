-- runcue schema version 5: a task type, or the whole queue, can be
-- paused (PauseTask, PauseQueue). The queue's pause is the meta row
-- 'paused'; a task's is its own column.
ALTER TABLE tasks ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
