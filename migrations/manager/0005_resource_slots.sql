-- Resource slots as data (issue 16): any slot name an agent advertises. JSON text, amounts as
-- decimal strings (`{"cpu": "1.5", "mem": "268435456", "cuda.shares": "0.5"}`).
--   agents.slots_total     its heartbeat's `slots.total`
--   agents.slot_types      its heartbeat's `slot_key_and_units` (`{"cuda.device": "count"}`)
--   kernels.resource_slots what the session asked for, every slot
-- Rows written before this migration keep '' here: the store reads them from the old columns
-- (cpu_millis, mem_bytes, cuda_devices), which are still written for compatibility.
ALTER TABLE agents ADD COLUMN slots_total TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN slot_types TEXT NOT NULL DEFAULT '';
ALTER TABLE kernels ADD COLUMN resource_slots TEXT NOT NULL DEFAULT '';
