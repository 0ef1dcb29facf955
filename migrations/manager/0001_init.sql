-- The manager's store. One schema for SQLite and PostgreSQL: TEXT, BIGINT, DOUBLE PRECISION
-- only (times are Unix seconds; slot amounts are millicores, bytes and device counts).

CREATE TABLE agents (
    id              TEXT PRIMARY KEY,
    status          TEXT NOT NULL,          -- ALIVE, LOST, PENDING, TERMINATED
    addr            TEXT,                   -- tcp://host:port of its RPC server
    public_key      TEXT,                   -- Z85 CURVE key, NULL without CURVE
    region          TEXT,
    version         TEXT,
    cpu_millis      BIGINT NOT NULL DEFAULT 0,   -- slots total, from heartbeats
    mem_bytes       BIGINT NOT NULL DEFAULT 0,
    cuda_devices    BIGINT NOT NULL DEFAULT 0,
    first_contact   DOUBLE PRECISION NOT NULL,
    last_heartbeat  DOUBLE PRECISION,
    status_changed  DOUBLE PRECISION NOT NULL
);

CREATE TABLE access_keys (
    access_key        TEXT PRIMARY KEY,
    -- Invariant 2 of scenarios.md, enforced by the store itself.
    concurrency_used  BIGINT NOT NULL DEFAULT 0 CHECK (concurrency_used >= 0),
    concurrency_limit BIGINT NOT NULL DEFAULT 0,   -- 0 = unlimited
    created_at        DOUBLE PRECISION NOT NULL
);

CREATE TABLE kernels (
    id             TEXT PRIMARY KEY,
    session_id     TEXT NOT NULL,
    agent_id       TEXT NOT NULL,
    access_key     TEXT NOT NULL REFERENCES access_keys (access_key),
    image          TEXT NOT NULL,
    status         TEXT NOT NULL,    -- PENDING (placed, not yet created) … TERMINATED
    status_reason  TEXT,
    exit_code      BIGINT,
    cpu_millis     BIGINT NOT NULL,
    mem_bytes      BIGINT NOT NULL,
    cuda_devices   BIGINT NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    terminated_at  DOUBLE PRECISION
);
CREATE INDEX kernels_agent_status ON kernels (agent_id, status);
CREATE INDEX kernels_session ON kernels (session_id);
CREATE INDEX kernels_access_key ON kernels (access_key, status);

-- Event ids already applied: a resent event is acked again and not re-applied.
CREATE TABLE processed_events (
    id          TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL,
    name        TEXT NOT NULL,
    applied_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX processed_events_applied_at ON processed_events (applied_at);
