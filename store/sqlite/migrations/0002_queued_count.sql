-- runcue schema version 2: an exact count of queued units, maintained by
-- every transaction that changes it (one update per transaction), so that a
-- submission can be refused when the queue is full without counting rows.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO meta(key, value) SELECT 'queued', count(*) FROM work_units WHERE state = 'queued';
