-- An image pull's progress while a kernel is PULLING (issue 28): JSON
-- {"current_bytes", "total_bytes", "layers_done", "layers_total"}, written at most once a second
-- by the replica that drives the pull; NULL when the kernel never pulled.
ALTER TABLE kernels ADD COLUMN pull_progress TEXT;
