-- Dangling kernel reports (seed 001's kernel_dangling), kept until the leader resolves them
-- (issue 17): whichever replica takes the report writes it in the event's transaction, so a
-- standby's report, or one the leader had not resolved when it died, is never lost.
--   first_reported  Unix seconds (manager clock) of the first report: dangling-grace runs from it
--   adoptable       1 when the agent said it could rebuild the kernel, else 0
CREATE TABLE dangling_reports (
    agent_id        TEXT NOT NULL,
    kernel_id       TEXT NOT NULL,
    session_id      TEXT NOT NULL DEFAULT '',
    adoptable       BIGINT NOT NULL DEFAULT 0,
    first_reported  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (agent_id, kernel_id)
);
