-- runcue schema version 11: the engine's store port.
--
-- The owner epoch: taking ownership moves it on (Acquire); every write an
-- owner makes checks it in its transaction, so a deposed owner's writes
-- fail (store.ErrNotOwner). A running unit records the epoch of the owner
-- whose run it is: a new owner requeues it once that owner is proven gone
-- or the run's lease has expired.
CREATE TABLE owner_epoch (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    epoch  INTEGER NOT NULL,
    holder TEXT
);
INSERT INTO owner_epoch(id, epoch) VALUES (1, 0);
ALTER TABLE work_units ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;

-- A unit's costs by meter (a JSON object; NULL: one request), stored at
-- submit so that every process sees the same figures.
ALTER TABLE work_units ADD COLUMN costs BLOB;

-- The service log: one row per start, service and meter, with the amount
-- the start charged; the amount may be replaced once by the actual charge
-- (reconciled). Rows written before are one request each.
ALTER TABLE service_log ADD COLUMN meter TEXT NOT NULL DEFAULT 'requests';
ALTER TABLE service_log ADD COLUMN amount INTEGER NOT NULL DEFAULT 1;
ALTER TABLE service_log ADD COLUMN reconciled INTEGER NOT NULL DEFAULT 0;

-- Per-meter state (opaque to the store): the circuit breaker's record,
-- and what later meters keep (buckets, adaptive limits). The circuit
-- states move here.
CREATE TABLE meter_state (
    service TEXT NOT NULL,
    meter   TEXT NOT NULL,
    state   BLOB NOT NULL,
    PRIMARY KEY (service, meter)
) WITHOUT ROWID;
INSERT INTO meter_state(service, meter, state) SELECT service, 'circuit', state FROM circuit_state;
DROP TABLE circuit_state;
