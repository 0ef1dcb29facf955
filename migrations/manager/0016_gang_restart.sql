-- Gang restarts (issue 40, "ends or requeues the session by its restart policy"; docs/design.md
-- "Cluster sessions"): a cluster session whose kernel was lost or whose create failed is ended
-- whole, then requeued as a NEW main row of the same session (the old rows `superseded_by` it)
-- when its restart policy restarts it, after the policy's backoff.
--   not_before  Unix seconds before which an admission round does not place the queued row
--               (the restart's backoff); NULL: at once
-- A cluster session's main row keeps its `request` when it ends (unless its user ended it) until
-- the leader decides: requeued from it, or cleared.
ALTER TABLE kernels ADD COLUMN not_before DOUBLE PRECISION;
