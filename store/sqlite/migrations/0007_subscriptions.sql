-- runcue schema version 7: durable subscriptions. A named subscription's
-- position (the last event sequence number its consumer acknowledged)
-- outlives its process; retention keeps the events it has not
-- acknowledged, up to a bound (store.Prune's EventsHardBefore).
CREATE TABLE subscriptions (
    name       TEXT    PRIMARY KEY,
    acked      INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    acked_at   INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
