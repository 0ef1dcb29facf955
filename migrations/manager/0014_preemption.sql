-- Preemption (issue 41 item 2): a pending session of a higher priority that fits nowhere evicts
-- preemptible RUNNING sessions of strictly lower priority; each victim is `PREEMPTED`, ended on
-- its agent, then requeued as a NEW kernel row of the same session (or ended `TERMINATED`
-- `preempted` when its restart policy says no).
--   preemptible   0 | 1: the session may be a victim (every row of the session the same)
--   superseded_by the kernel id of the row that requeued this one (NULL: the session's current
--                 row); a superseded row is history: lists and session look-ups skip it
--   preempted_at  Unix seconds of the session's last preemption (carried to the requeued row:
--                 `[scheduler] preemption-cooldown` counts from it)
-- access_keys.preemptible: the default of `preemptible` for the key's sessions (admins set it).
ALTER TABLE kernels ADD COLUMN preemptible BIGINT NOT NULL DEFAULT 0;
ALTER TABLE kernels ADD COLUMN superseded_by TEXT;
ALTER TABLE kernels ADD COLUMN preempted_at DOUBLE PRECISION;
ALTER TABLE access_keys ADD COLUMN preemptible BIGINT NOT NULL DEFAULT 0;
