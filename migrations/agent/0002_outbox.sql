-- The durable event outbox (issue 5, seed 004: never drop a message). Every event is a row
-- before it is sent; the row is deleted when the manager acks its id. `seq` is the send
-- order, so events of one kernel reach the manager in the order they happened.
CREATE TABLE outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,     -- event id (UUID v4), the same on every resend
    name       TEXT NOT NULL,            -- kernel_started, agent_terminated, ...
    kernel_id  TEXT,                     -- NULL for agent events
    event      TEXT NOT NULL,            -- the event's fields as JSON (docs/events.md)
    created_at REAL NOT NULL             -- Unix time, seconds
);
CREATE INDEX outbox_kernel ON outbox (kernel_id, seq);
