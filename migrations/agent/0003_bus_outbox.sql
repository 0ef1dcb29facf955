-- The durable outbox towards Backend.AI's event bus (issue 25, `[redis]`): the same shape and
-- rules as `outbox` (0002), its own rows, so that neither destination's outage holds the
-- other back. A row is deleted once Redis accepted the event (src/agent/bus/sender.rs).
CREATE TABLE bus_outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,     -- event id (UUID v4): the bus's dedup key
    name       TEXT NOT NULL,            -- kernel_started, agent_terminated, ...
    kernel_id  TEXT,                     -- NULL for agent events
    event      TEXT NOT NULL,            -- the AgentEvent as JSON
    created_at REAL NOT NULL             -- Unix time, seconds
);
CREATE INDEX bus_outbox_kernel ON bus_outbox (kernel_id, seq);
