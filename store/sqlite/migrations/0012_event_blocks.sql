-- runcue schema version 12: the event log in blocks.
--
-- A row per event cost the writer more than the state changes it records
-- (runcue-bench: 0.30-0.35 of the raw SQLite cycle with it, 0.44-0.48
-- without). Events are now stored a commit at a time: one row per block
-- of at most store.MaxBlockEvents events, keyed by its last sequence
-- number (blocks are appended in order, at the right edge of the table),
-- with its first, the range of its events' times (for retention by time)
-- and the events encoded (store.BlockEncoder). event_ranges still says
-- where each (task, type) is.
CREATE TABLE event_blocks (
    last   INTEGER PRIMARY KEY,
    first  INTEGER NOT NULL,
    min_at INTEGER NOT NULL,
    max_at INTEGER NOT NULL,
    data   BLOB    NOT NULL
);

-- A unit's record of its own events' sequence numbers (uvarints, bounded:
-- store.MaxUnitRecord), instead of an index of the log by unit.
ALTER TABLE work_units ADD COLUMN events BLOB;

-- The highest sequence number pruning deleted: numbers continue after it
-- when every block is pruned. It starts as the highest the events table
-- ever assigned.
INSERT INTO meta(key, value)
    SELECT 'events_floor', coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0);

-- The events table is converted into blocks after this script, a chunk
-- per transaction (convertEvents in sqlite.go): a conversion killed
-- midway resumes at the next Open. The table is dropped once empty.
