-- runcue's schema on PostgreSQL, version 2: executors (handlers on other
-- hosts), as the SQLite backend's schema 13. Times are nanoseconds on the
-- server's clock (clock_timestamp()).
CREATE TABLE executors (
    id            TEXT    PRIMARY KEY,
    host          TEXT    NOT NULL,
    pid           INTEGER NOT NULL,
    tasks         TEXT    NOT NULL,
    capacity      INTEGER NOT NULL,
    poll_ns       BIGINT  NOT NULL,
    ttl_ns        BIGINT  NOT NULL,
    registered_at BIGINT  NOT NULL,
    seen_at       BIGINT  NOT NULL
);

-- A run the scheduler handed to an executor (store.Assignment): state 0
-- pending, 1 started, 2 ended; ending is the executor's report.
CREATE TABLE assignments (
    work_id    TEXT    PRIMARY KEY,
    run        INTEGER NOT NULL,
    executor   TEXT    NOT NULL,
    task       TEXT    NOT NULL,
    start_by   BIGINT  NOT NULL,
    timeout_ns BIGINT  NOT NULL,
    state      INTEGER NOT NULL DEFAULT 0,
    cancel     TEXT,
    started_at BIGINT  NOT NULL DEFAULT 0,
    ending     BYTEA
);
CREATE INDEX assignments_executor ON assignments(executor, state);
CREATE INDEX assignments_reported ON assignments(state) WHERE state > 0;
