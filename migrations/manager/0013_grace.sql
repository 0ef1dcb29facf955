-- Graceful termination (issue 41): how a session's workload is stopped, and while it is
-- TERMINATING, by when its agent kills what still runs.
--   stop_signal         SIGTERM | SIGINT | …; NULL: the agent's default (SIGTERM, SIGINT for a
--                       runner kernel)
--   grace_period        seconds after the stop signal before SIGKILL; NULL for rows stored
--                       before this migration (the agent's [container] grace-period)
--   terminate_deadline  Unix seconds: while TERMINATING, when its agent kills it (the end's grace
--                       from when it began); the sweep counts terminating-timeout from it
ALTER TABLE kernels ADD COLUMN stop_signal TEXT;
ALTER TABLE kernels ADD COLUMN grace_period DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN terminate_deadline DOUBLE PRECISION;
