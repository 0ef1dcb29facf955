-- Idle reclaim (issue 41, item 3; docs/design.md "Idle reclaim"). A session's policy, on its
-- kernel rows as created (the main row is the one the leader's reclaim duty reads):
--   max_lifetime        seconds it may run, counted from when it was placed; NULL: no limit
--   idle_timeout        seconds without activity before it ends `idle-timeout` (interactive
--                       sessions only; NULL: never)
--   utilization_window  seconds its utilization must stay under `min_utilization` to end
--                       `low-utilization`
--   min_utilization     JSON {slot: percent}: the utilization floor; NULL: none
-- What the agents report (their heartbeats; the agent's clock):
--   last_activity       Unix seconds of the kernel's last activity (execute, terminal, file
--                       transfer, a connection to a service port); NULL: none reported yet
--   activity_at         Unix seconds of the newest heartbeat that reported on it: its agent
--                       vouches that nothing happened between last_activity and then
--   low_since           Unix seconds since which every reading was under the floor; NULL when
--                       the last reading was at or above it (or none came)
-- What the leader did:
--   reclaim_warned      the deadline (Unix seconds) its `reclaim_warning` event was sent for:
--                       one warning per deadline, across restarts and failovers
ALTER TABLE kernels ADD COLUMN max_lifetime DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN idle_timeout DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN utilization_window DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN min_utilization TEXT;
ALTER TABLE kernels ADD COLUMN last_activity DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN activity_at DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN low_since DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN reclaim_warned DOUBLE PRECISION;
-- An access key's defaults for its sessions' policy: JSON {"max_lifetime", "idle_timeout",
-- "utilization_window", "min_utilization"} (each optional); NULL: the `[reclaim]` table's.
ALTER TABLE access_keys ADD COLUMN reclaim_defaults TEXT;
