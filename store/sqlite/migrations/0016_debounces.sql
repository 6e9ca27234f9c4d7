-- runcue schema version 16: debounce keys (store.Debounce).
--
-- Each key names the unit that holds it, the latest inserted with it, and
-- since, the first insert of its burst (Unix nanoseconds); indexed by
-- unit, to read a unit's key.
CREATE TABLE debounces (
    key     TEXT    PRIMARY KEY,
    unit_id TEXT    NOT NULL,
    since   INTEGER NOT NULL
);
CREATE INDEX debounces_unit ON debounces(unit_id);
