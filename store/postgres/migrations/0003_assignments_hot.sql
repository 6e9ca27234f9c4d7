-- runcue's schema on PostgreSQL, version 3: an assignment's reports (its
-- state, start and ending) change no indexed column, and its pages keep
-- room, so that an executor's report is a HOT update (no index entries
-- written). The scheduler's read of the reported assignments scans the
-- table, which holds only the runs in flight (the store vacuums it).
ALTER TABLE assignments SET (fillfactor = 50);
DROP INDEX assignments_reported;
DROP INDEX assignments_executor;
CREATE INDEX assignments_executor ON assignments(executor);
