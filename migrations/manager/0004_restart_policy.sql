-- The kernel supervision tree: a session's restart policy as it asked for it (JSON
-- `{"mode", "max_restarts", "window", "backoff"}`), and how many restarts it has had.
ALTER TABLE kernels ADD COLUMN restart_policy TEXT NOT NULL DEFAULT '{"mode":"never"}';
ALTER TABLE kernels ADD COLUMN restart_count BIGINT NOT NULL DEFAULT 0;
