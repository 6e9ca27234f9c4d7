-- runcue schema version 3: subscriptions filtered by event type or task
-- read only the events they deliver (sse.Handler's ?type= and ?task=), not
-- the whole retained log.
CREATE INDEX events_type ON events(type, seq);
CREATE INDEX events_task ON events(task, seq) WHERE task IS NOT NULL;
