-- Cluster sessions (issue 40): a session of N kernel rows sharing `session_id`, placed as one
-- gang. A queued cluster session is its main kernel's row alone (one queue entry); the sub
-- kernels' rows are inserted when the gang is placed, in the same transaction.
--   cluster_mode      single-node | multi-node (every row of the session the same)
--   cluster_size      kernels in the session (every row the same)
--   cluster_role      main | sub; only the main row takes the access key's concurrency
--   cluster_idx       1-based within the role
--   cluster_hostname  <role><idx>: main1, sub1, …
--   network           the session's network (bai-singlenode-<sid> / bai-multinode-<sid>) on the
--                     main row, NULL for a session of one kernel; removed after the last kernel
--   service_ports     names of the service ports the kernel's agent published (JSON list):
--                     the main kernel's; a sub kernel publishes none
ALTER TABLE kernels ADD COLUMN cluster_mode TEXT NOT NULL DEFAULT 'single-node';
ALTER TABLE kernels ADD COLUMN cluster_size BIGINT NOT NULL DEFAULT 1;
ALTER TABLE kernels ADD COLUMN cluster_role TEXT NOT NULL DEFAULT 'main';
ALTER TABLE kernels ADD COLUMN cluster_idx BIGINT NOT NULL DEFAULT 1;
ALTER TABLE kernels ADD COLUMN cluster_hostname TEXT NOT NULL DEFAULT 'main1';
ALTER TABLE kernels ADD COLUMN network TEXT;
ALTER TABLE kernels ADD COLUMN service_ports TEXT NOT NULL DEFAULT '[]';
