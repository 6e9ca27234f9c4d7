-- runcue's schema on PostgreSQL, version 4: schedules (a unit submitted
-- each period).
--
-- def is the definition registered from code (JSON); timing a timing set
-- at run time (JSON, NULL: none), cleared with paused when def changes.
-- The cursor (last_at, Unix nanoseconds, and last_key) is the last period
-- handled, submitted or skipped; before the first it is (created_at, '').
-- last_unit is the last unit submitted.
CREATE TABLE schedules (
    name       TEXT    PRIMARY KEY COLLATE "C",
    def        BYTEA   NOT NULL,
    timing     BYTEA,
    paused     BOOLEAN NOT NULL DEFAULT false,
    created_at BIGINT  NOT NULL,
    last_at    BIGINT  NOT NULL,
    last_key   TEXT    NOT NULL DEFAULT '' COLLATE "C",
    last_unit  TEXT    NOT NULL DEFAULT ''
);
