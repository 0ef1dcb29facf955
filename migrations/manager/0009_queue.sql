-- The session queue, cordon/drain and transient-state deadlines (issue 27).
--
-- kernels.status gains PENDING's Backend.AI meaning (queued: waiting for capacity, agent_id '',
-- no concurrency taken), SCHEDULED (placed and reserved, the agent not answered yet; what
-- PENDING meant before) and CANCELLED (a pending session deleted; final, like TERMINATED).
--   priority          0..100, higher first (Backend.AI's default 10)
--   queued_at         Unix seconds it entered the queue; NULL when it never queued
--   admitted_at       Unix seconds it left the queue (placed); NULL while pending / never queued
--   pending_reason    JSON {"code", "message"} while PENDING: why it waits
--   head_skips        admission rounds it blocked its priority as a head that did not fit
--   request           the SessionRequest as JSON of a session that was queued (created from it on admission)
--   status_changed_at Unix seconds of the last status change: the transient states' deadlines
ALTER TABLE kernels ADD COLUMN priority BIGINT NOT NULL DEFAULT 10;
ALTER TABLE kernels ADD COLUMN queued_at DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN admitted_at DOUBLE PRECISION;
ALTER TABLE kernels ADD COLUMN pending_reason TEXT;
ALTER TABLE kernels ADD COLUMN head_skips BIGINT NOT NULL DEFAULT 0;
ALTER TABLE kernels ADD COLUMN request TEXT;
ALTER TABLE kernels ADD COLUMN status_changed_at DOUBLE PRECISION NOT NULL DEFAULT 0;
UPDATE kernels SET status_changed_at = created_at;
UPDATE kernels SET status = 'SCHEDULED' WHERE status = 'PENDING';
CREATE INDEX kernels_status ON kernels (status, priority, queued_at);

-- Cordon and drain (Backend.AI's `schedulable`; Nomad's drain with a deadline):
--   schedulable     1 = takes new sessions, 0 = cordoned
--   draining        1 = cordoned by a drain: its sessions end by themselves or at the deadline
--   drain_deadline  Unix seconds its remaining sessions are terminated (`agent-drained`);
--                   NULL = no deadline
ALTER TABLE agents ADD COLUMN schedulable BIGINT NOT NULL DEFAULT 1;
ALTER TABLE agents ADD COLUMN draining BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN drain_deadline DOUBLE PRECISION;
