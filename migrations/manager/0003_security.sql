-- Security and tenancy: access keys carry a hashed secret, a role and an enabled flag; vfolders
-- are named per owner. Secrets are never stored: only SHA-256 of the secret key (hex).
ALTER TABLE access_keys ADD COLUMN secret_hash TEXT;                    -- NULL: cannot sign in
ALTER TABLE access_keys ADD COLUMN role TEXT NOT NULL DEFAULT 'user';   -- user | admin
ALTER TABLE access_keys ADD COLUMN enabled BIGINT NOT NULL DEFAULT 1;   -- 0 | 1
ALTER TABLE access_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE access_keys ADD COLUMN deleted_at DOUBLE PRECISION;         -- kept for its sessions' history
CREATE UNIQUE INDEX access_keys_secret_hash ON access_keys (secret_hash);

-- A session's vfolders as it asked for them: JSON `[{"name", "permission"}]`.
ALTER TABLE kernels ADD COLUMN mounts TEXT NOT NULL DEFAULT '[]';

CREATE TABLE vfolders (
    owner       TEXT NOT NULL REFERENCES access_keys (access_key),
    name        TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (owner, name)
);
