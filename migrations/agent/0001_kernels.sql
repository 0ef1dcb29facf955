-- The agent's kernel registry (no pickle): one row per kernel, its config and, once set up,
-- the resources of every stage as JSON (`resources_version` names that JSON's layout).
CREATE TABLE kernels (
    kernel_id         TEXT PRIMARY KEY NOT NULL,
    session_id        TEXT NOT NULL,
    status            TEXT NOT NULL,
    config            TEXT NOT NULL,
    resources         TEXT,
    resources_version INTEGER NOT NULL DEFAULT 1,
    reason            TEXT,
    exit_code         INTEGER,
    created_at        REAL NOT NULL,
    updated_at        REAL NOT NULL
);
CREATE INDEX kernels_status ON kernels (status);
