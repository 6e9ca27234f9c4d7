-- runcue schema version 13: executors (handlers in other processes).
--
-- An executor registers the tasks it runs and its capacity, and keeps its
-- registration (seen_at) and its runs' leases alive with heartbeats.
-- Times are Unix nanoseconds on the store's clock (SQLite: the host's).
CREATE TABLE executors (
    id            TEXT    PRIMARY KEY,
    host          TEXT    NOT NULL,
    pid           INTEGER NOT NULL,
    tasks         TEXT    NOT NULL,
    capacity      INTEGER NOT NULL,
    poll_ns       INTEGER NOT NULL,
    ttl_ns        INTEGER NOT NULL,
    registered_at INTEGER NOT NULL,
    seen_at       INTEGER NOT NULL
);

-- A run the scheduler handed to an executor: one per running unit at most
-- (the row of an earlier run is replaced). state: 0 pending, 1 started,
-- 2 ended (store.AssignState); ending is the executor's report.
CREATE TABLE assignments (
    work_id    TEXT    PRIMARY KEY,
    run        INTEGER NOT NULL,
    executor   TEXT    NOT NULL,
    task       TEXT    NOT NULL,
    start_by   INTEGER NOT NULL,
    timeout_ns INTEGER NOT NULL,
    state      INTEGER NOT NULL DEFAULT 0,
    cancel     TEXT,
    started_at INTEGER NOT NULL DEFAULT 0,
    ending     BLOB
);
-- An executor's reads of its assignments, and its heartbeat's leases.
CREATE INDEX assignments_executor ON assignments(executor, state);
-- The scheduler's read of the reports.
CREATE INDEX assignments_reported ON assignments(state) WHERE state > 0;
