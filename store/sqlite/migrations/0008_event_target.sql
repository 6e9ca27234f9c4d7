-- runcue schema version 8: events carry their unit's target, so that a
-- consumer (a UI, a log, the runcue command's tail) can show what a unit
-- works on without reading the unit, which may be pruned by then. Events
-- stored before have none.
ALTER TABLE events ADD COLUMN target TEXT;
