-- runcue schema version 14: schedules (a unit submitted each period).
--
-- def is the definition registered from code (JSON); timing a timing set
-- at run time (JSON, NULL: none), cleared with paused when def changes.
-- The cursor (last_at, Unix nanoseconds, and last_key) is the last period
-- handled, submitted or skipped; before the first it is (created_at, '').
-- last_unit is the last unit submitted.
CREATE TABLE schedules (
    name       TEXT    PRIMARY KEY,
    def        BLOB    NOT NULL,
    timing     BLOB,
    paused     INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    last_at    INTEGER NOT NULL,
    last_key   TEXT    NOT NULL DEFAULT '',
    last_unit  TEXT    NOT NULL DEFAULT ''
);
