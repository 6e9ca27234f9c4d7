-- runcue schema version 1.
-- Times are Unix nanoseconds; 0 means "not set".

CREATE TABLE work_units (
    seq                 INTEGER PRIMARY KEY,
    id                  TEXT    NOT NULL,
    task                TEXT    NOT NULL,
    target              TEXT    NOT NULL DEFAULT '',
    params              BLOB,
    state               TEXT    NOT NULL,
    runs                INTEGER NOT NULL DEFAULT 0,
    failures            INTEGER NOT NULL DEFAULT 0,
    deferrals           INTEGER NOT NULL DEFAULT 0,
    created_at          INTEGER NOT NULL,
    run_at              INTEGER NOT NULL DEFAULT 0,
    started_at          INTEGER NOT NULL DEFAULT 0,
    finished_at         INTEGER NOT NULL DEFAULT 0,
    timeout             INTEGER NOT NULL DEFAULT 0,
    leased_by           TEXT,
    lease_expires_at    INTEGER NOT NULL DEFAULT 0,
    heartbeat_at        INTEGER NOT NULL DEFAULT 0,
    result              BLOB,
    error               TEXT,
    error_kind          TEXT,
    idempotency_key     TEXT,
    dependency_deadline INTEGER NOT NULL DEFAULT 0,
    retry               BLOB,
    trace               BLOB,
    cancel_requested    INTEGER NOT NULL DEFAULT 0,
    attempts            TEXT
);
-- Lookups by ID (Get, every transition).
CREATE UNIQUE INDEX work_units_id ON work_units(id);
-- Idempotent submission.
CREATE UNIQUE INDEX work_units_idempotency ON work_units(idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Every state but the common terminal one: start-up load and recovery
-- (queued, running), listing and retrying failed or cancelled units.
CREATE INDEX work_units_open ON work_units(state, seq) WHERE state <> 'completed';
-- Retention: finished units by finish time.
CREATE INDEX work_units_finished ON work_units(finished_at) WHERE finished_at > 0;

-- rowid keeps each unit's dependencies in submission order.
CREATE TABLE dependencies (
    unit_id    TEXT NOT NULL,
    depends_on TEXT NOT NULL,
    UNIQUE (unit_id, depends_on)
);
CREATE INDEX dependencies_reverse ON dependencies(depends_on);

-- The durable event log: one row per important event, in commit order.
-- AUTOINCREMENT keeps sequence numbers from being reused after pruning.
CREATE TABLE events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    type    TEXT    NOT NULL,
    at      INTEGER NOT NULL,
    work_id TEXT,
    task    TEXT,
    attempt INTEGER NOT NULL DEFAULT 0,
    data    BLOB
);

CREATE TABLE tasks (
    name TEXT PRIMARY KEY,
    def  BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE services (
    name     TEXT PRIMARY KEY,
    def      BLOB,
    override BLOB,
    paused   INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE circuit_state (
    service TEXT PRIMARY KEY,
    state   BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE service_log (
    service    TEXT    NOT NULL,
    started_at INTEGER NOT NULL,
    work_id    TEXT
);
CREATE INDEX service_log_window ON service_log(service, started_at);
