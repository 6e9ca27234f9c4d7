-- runcue schema version 3: subscriptions filtered by event type or task
-- (sse.Handler's ?type= and ?task=) read only the stretches of the log
-- that can hold what they deliver, not the whole retained log.
--
-- An index on events(type) or events(task) would cost an index entry per
-- event, three per unit: a quarter of the writer's throughput measured.
-- Instead each transaction records, per (task, type) it appended events
-- of, the first and last sequence numbers it used: a few rows per group
-- commit. A filtered read looks up the ranges of its tasks and types, then
-- reads events only inside them. A range may cover sequence numbers of
-- other tasks (or of a rolled-back op): the read filters those out.
CREATE TABLE event_ranges (
    task  TEXT    NOT NULL,  -- '' for events without a unit
    type  TEXT    NOT NULL,
    first INTEGER NOT NULL,
    last  INTEGER NOT NULL
);
CREATE INDEX event_ranges_task ON event_ranges(task, last);
CREATE INDEX event_ranges_type ON event_ranges(type, last);
-- The events already stored: one range per (task, type).
INSERT INTO event_ranges(task, type, first, last)
    SELECT coalesce(task, ''), type, min(seq), max(seq) FROM events GROUP BY coalesce(task, ''), type;
