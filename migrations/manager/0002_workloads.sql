-- Workloads I: batch sessions (Backend.AI's session_type, result) and a session's command.
ALTER TABLE kernels ADD COLUMN session_type TEXT NOT NULL DEFAULT 'interactive';  -- interactive | batch
ALTER TABLE kernels ADD COLUMN command TEXT;                                      -- sh -c string, NULL: the image's
ALTER TABLE kernels ADD COLUMN batch_timeout DOUBLE PRECISION;                    -- seconds, batch only
ALTER TABLE kernels ADD COLUMN result TEXT NOT NULL DEFAULT 'UNDEFINED';          -- UNDEFINED | SUCCESS | FAILURE
