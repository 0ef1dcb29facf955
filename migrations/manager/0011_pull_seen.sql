-- Orphaned pulls (issue 27, "no state without a deadline"): a PULLING kernel is followed by the
-- manager process that created it (`image_pull_status` once a second). When that process dies
-- (a restart, a failover), nobody follows it and it would sit PULLING until image-pull-timeout
-- (2 h by default) even when the pull ended long before.
--   pull_seen_at  Unix seconds its follower last wrote (progress, or a touch every 5 s); NULL
--                 before the first write (status_changed_at stands in). The leader's sweep
--                 re-drives a PULLING kernel not seen for 30 s.
-- A directly created session now keeps its request (JSON) as a queued one does, so that it can
-- be re-driven from it; an ended session's is dropped.
ALTER TABLE kernels ADD COLUMN pull_seen_at DOUBLE PRECISION;
UPDATE kernels SET request = NULL WHERE status IN ('TERMINATED', 'CANCELLED');
