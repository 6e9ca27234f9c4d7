-- runcue schema version 4: the skipped state (a handler's Skip).
--
-- Skipped units are finished, like completed ones, and can be as many (a
-- crawl that skips whatever has not changed): the index of open units
-- leaves them out as it leaves out completed ones. Prune deletes them.
-- No row changes: a database of schema 3 holds no skipped unit.
DROP INDEX work_units_open;
CREATE INDEX work_units_open ON work_units(state, seq) WHERE state NOT IN ('completed', 'skipped');
