-- Preemption's candidates in the victim choice's order (issue 41): an admission round that
-- leaves a session unplaced reads the most evictable preemptible `RUNNING` sessions first
-- (`Store::preemption_candidates_first`: lowest priority, then youngest), a few hundred rows,
-- and every one only when those do not settle the choice. Without this index that read
-- visited every running row and sorted them (40,000 at 10,000 agents in `just bench
-- scheduler`); with it, the first rows in order. Partial: only the candidates are in it, so
-- queueing and admitting (PENDING, SCHEDULED, …) write nothing to it. `status` is in the key
-- as well as in the condition: without statistics (a fresh database) SQLite chose
-- `kernels_queue` (status, priority) over an index keyed on `priority` alone.
CREATE INDEX kernels_preemptible ON kernels (status, priority, created_at DESC, session_id)
    WHERE status = 'RUNNING' AND preemptible = 1 AND superseded_by IS NULL;
