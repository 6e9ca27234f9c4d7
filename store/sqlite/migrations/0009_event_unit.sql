-- runcue schema version 9: a unit's events by unit, for its page in the
-- dashboard and `runcue events --id`: read through this index, they cost
-- what they are, however long the log. Ordered by seq (the rowid).
CREATE INDEX events_work ON events(work_id) WHERE work_id IS NOT NULL;
