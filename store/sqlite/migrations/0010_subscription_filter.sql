-- runcue schema version 10: a durable subscription's filter (the event
-- types and task types of its latest Subscribe, JSON arrays; '' for all).
-- Its position passes the events the filter skips once every earlier
-- match is acknowledged, so Drain and retention do not wait for
-- acknowledgements of events its consumer never receives.
ALTER TABLE subscriptions ADD COLUMN types TEXT NOT NULL DEFAULT '';
ALTER TABLE subscriptions ADD COLUMN tasks TEXT NOT NULL DEFAULT '';
