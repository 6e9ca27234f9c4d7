-- runcue's schema on PostgreSQL, version 6: debounce keys
-- (store.Debounce).
--
-- Each key names the unit that holds it, the latest inserted with it, and
-- since, the first insert of its burst (Unix nanoseconds); indexed by
-- unit, to read a unit's key.
CREATE TABLE debounces (
    key     TEXT   PRIMARY KEY COLLATE "C",
    unit_id TEXT   NOT NULL,
    since   BIGINT NOT NULL
);
CREATE INDEX debounces_unit ON debounces(unit_id);
