-- runcue's schema on PostgreSQL, version 1: the SQLite backend's schema 12
-- in PostgreSQL's types. Times are nanoseconds since the Unix epoch (0:
-- none), as in SQLite, so that both backends store the same values.

CREATE TABLE work_units (
    seq                 BIGSERIAL PRIMARY KEY,
    id                  TEXT    NOT NULL UNIQUE,
    task                TEXT    NOT NULL,
    target              TEXT    NOT NULL DEFAULT '',
    params              BYTEA,
    state               TEXT    NOT NULL,
    runs                INTEGER NOT NULL DEFAULT 0,
    failures            INTEGER NOT NULL DEFAULT 0,
    deferrals           INTEGER NOT NULL DEFAULT 0,
    created_at          BIGINT  NOT NULL,
    run_at              BIGINT  NOT NULL DEFAULT 0,
    started_at          BIGINT  NOT NULL DEFAULT 0,
    finished_at         BIGINT  NOT NULL DEFAULT 0,
    timeout             BIGINT  NOT NULL DEFAULT 0,
    leased_by           TEXT,
    lease_expires_at    BIGINT  NOT NULL DEFAULT 0,
    heartbeat_at        BIGINT  NOT NULL DEFAULT 0,
    result              BYTEA,
    error               TEXT,
    error_kind          TEXT,
    idempotency_key     TEXT,
    dependency_deadline BIGINT  NOT NULL DEFAULT 0,
    retry               BYTEA,
    trace               BYTEA,
    cancel_requested    INTEGER NOT NULL DEFAULT 0,
    attempts            TEXT,
    epoch               BIGINT  NOT NULL DEFAULT 0,
    costs               BYTEA,
    -- the unit's record of its events (store.UnitRecord)
    events              BYTEA
);
CREATE UNIQUE INDEX work_units_idempotency ON work_units(idempotency_key) WHERE idempotency_key IS NOT NULL;
-- retention and List's finished-time filters
CREATE INDEX work_units_finished ON work_units(finished_at) WHERE finished_at > 0;
-- a start's load and the running-unit queries
CREATE INDEX work_units_open ON work_units(state, seq) WHERE state NOT IN ('completed', 'skipped');

-- A unit's dependencies, in the order they were given (n).
CREATE TABLE dependencies (
    n          BIGSERIAL,
    unit_id    TEXT NOT NULL,
    depends_on TEXT NOT NULL,
    PRIMARY KEY (unit_id, depends_on)
);
CREATE INDEX dependencies_reverse ON dependencies(depends_on);

CREATE TABLE tasks (
    name   TEXT PRIMARY KEY,
    def    BYTEA NOT NULL,
    paused BOOLEAN NOT NULL DEFAULT false
);

CREATE TABLE services (
    name     TEXT PRIMARY KEY,
    def      BYTEA,
    override BYTEA,
    paused   BOOLEAN NOT NULL DEFAULT false
);

-- The starts each service's meters counted (n: the log's order).
CREATE TABLE service_log (
    n          BIGSERIAL PRIMARY KEY,
    service    TEXT    COLLATE "C" NOT NULL,
    started_at BIGINT  NOT NULL,
    work_id    TEXT,
    meter      TEXT    NOT NULL DEFAULT 'requests',
    amount     BIGINT  NOT NULL DEFAULT 1,
    reconciled BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX service_log_window ON service_log(service, started_at);

CREATE TABLE meter_state (
    service TEXT  NOT NULL,
    meter   TEXT  NOT NULL,
    state   BYTEA NOT NULL,
    PRIMARY KEY (service, meter)
);

-- Settings and counters by key: 'paused' (the queue), 'events_last' (the
-- highest event sequence number ever assigned: the log's counter, see
-- events.go), 'schema' (this schema's version).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO meta(key, value) VALUES ('events_last', 0);

-- The event log: a transaction's events as one row per block
-- (store.BlockEncoder), first and last their sequence numbers.
CREATE TABLE event_blocks (
    last   BIGINT PRIMARY KEY,
    first  BIGINT NOT NULL,
    min_at BIGINT NOT NULL,
    max_at BIGINT NOT NULL,
    data   BYTEA  NOT NULL
);

-- The stretches of the log holding events of a task ('' for none) and type.
CREATE TABLE event_ranges (
    n     BIGSERIAL PRIMARY KEY,
    task  TEXT   NOT NULL,
    type  TEXT   NOT NULL,
    first BIGINT NOT NULL,
    last  BIGINT NOT NULL
);
CREATE INDEX event_ranges_task ON event_ranges(task, last);
CREATE INDEX event_ranges_type ON event_ranges(type, last);
CREATE INDEX event_ranges_last ON event_ranges(last);

CREATE TABLE unit_counts (
    task  TEXT   NOT NULL,
    state TEXT   NOT NULL,
    n     BIGINT NOT NULL,
    PRIMARY KEY (task, state)
);

CREATE TABLE activity (
    minute BIGINT NOT NULL,
    task   TEXT   NOT NULL,
    kind   TEXT   NOT NULL,
    n      BIGINT NOT NULL,
    PRIMARY KEY (minute, task, kind)
);

CREATE TABLE queue_wait (
    minute BIGINT  NOT NULL,
    bucket INTEGER NOT NULL,
    n      BIGINT  NOT NULL,
    PRIMARY KEY (minute, bucket)
);

CREATE TABLE subscriptions (
    name       TEXT   PRIMARY KEY,
    acked      BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    acked_at   BIGINT NOT NULL DEFAULT 0,
    types      TEXT   NOT NULL DEFAULT '',
    tasks      TEXT   NOT NULL DEFAULT ''
);

-- Ownership: the owner epoch, and the lease of its holder (holder NULL
-- when released). expires_at is the database's clock (clock_timestamp()).
CREATE TABLE owner_lease (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    epoch      BIGINT NOT NULL,
    holder     TEXT,
    expires_at TIMESTAMPTZ
);
INSERT INTO owner_lease(id, epoch) VALUES (1, 0);
