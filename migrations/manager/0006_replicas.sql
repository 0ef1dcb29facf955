-- Several managers on one store (issue 17). Liveness that placement needs lives here, not in one
-- replica's memory:
--   agents.seen_at     Unix seconds (manager clock) when any replica last heard from the agent
--                      (heartbeat or event); the leader's heartbeat-timeout sweep reads it
--   agents.updated_at  Unix seconds of the row's last write, and
--   agents.updated_by  the replica that wrote it: each replica re-reads rows other replicas
--                      changed (one indexed range scan a second)
ALTER TABLE agents ADD COLUMN seen_at DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN updated_at DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN updated_by TEXT NOT NULL DEFAULT '';
CREATE INDEX agents_updated_at ON agents (updated_at);
