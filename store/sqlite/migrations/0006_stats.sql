-- runcue schema version 6: what Stats reads, kept as it changes, so that
-- Stats never scans the units.
--
-- unit_counts: units by task and state. Each transaction adds the
-- changes its statements made, once per task and state, at commit.
-- Triggers kept it exactly too, but cut runcue-bench's ratio from
-- 0.36-0.38 to 0.25-0.28. It replaces the meta row 'queued' of schema 2.
CREATE TABLE unit_counts (
    task  TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (task, state)
) WITHOUT ROWID;
INSERT INTO unit_counts(task, state, n) SELECT task, state, count(*) FROM work_units GROUP BY task, state;
DELETE FROM meta WHERE key = 'queued';

-- activity: events per minute (Unix minutes of their times), task and
-- type (work_started, work_completed, ..., and work_failed_retry for a
-- failure that will be retried, work_deferred for a Retry-After). Each
-- transaction adds its counts once, at commit. Pruned after a day.
CREATE TABLE activity (
    minute INTEGER NOT NULL,
    task   TEXT    NOT NULL,
    kind   TEXT    NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (minute, task, kind)
) WITHOUT ROWID;

-- queue_wait: per minute of dispatch, how many units waited how long from
-- becoming eligible to their dispatch, in buckets (bucket i counts waits
-- up to the ith bound of the histogram in store/sqlite/stats.go). Pruned
-- after a day.
CREATE TABLE queue_wait (
    minute INTEGER NOT NULL,
    bucket INTEGER NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (minute, bucket)
) WITHOUT ROWID;
