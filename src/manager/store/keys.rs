//! Access keys: who may call the API (a hashed secret, a role, an enabled flag) and how many
//! live sessions each may hold (`concurrency_used` / `concurrency_limit`, invariant 2).

use std::collections::HashMap;

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now, Store, StoreError};

/// `user`: its own sessions and vfolders only. `admin`: everything.
pub const ROLE_USER: &str = "user";
/// See [`ROLE_USER`].
pub const ROLE_ADMIN: &str = "admin";

/// One access key as the store has it (never its secret; `secret_hash` is SHA-256 hex).
#[derive(Clone, Debug, PartialEq)]
pub struct AccessKeyRow {
    /// `AK…`, the public id.
    pub access_key: String,
    /// `user` or `admin`.
    pub role: String,
    /// A label for people (may be empty).
    pub name: String,
    /// Refused at once when false.
    pub enabled: bool,
    /// Live sessions now.
    pub concurrency_used: i64,
    /// At most this many live sessions (0 = unlimited).
    pub concurrency_limit: i64,
    /// Unix seconds.
    pub created_at: f64,
    /// SHA-256 hex of the secret key; `None` for a key that cannot sign in.
    pub secret_hash: Option<String>,
    /// The default of `preemptible` for the key's sessions (issue 41: admins set it).
    pub preemptible: bool,
}

impl AccessKeyRow {
    /// Whether this key has the `admin` role.
    pub fn is_admin(&self) -> bool {
        self.role == ROLE_ADMIN
    }

    fn from_row(r: &AnyRow) -> Result<AccessKeyRow, sqlx::Error> {
        Ok(AccessKeyRow {
            access_key: r.try_get("access_key")?,
            role: r.try_get("role")?,
            name: r.try_get("name")?,
            enabled: r.try_get::<i64, _>("enabled")? != 0,
            concurrency_used: r.try_get("concurrency_used")?,
            concurrency_limit: r.try_get("concurrency_limit")?,
            created_at: r.try_get("created_at")?,
            secret_hash: r.try_get("secret_hash")?,
            preemptible: r.try_get::<i64, _>("preemptible")? != 0,
        })
    }
}

const COLUMNS: &str =
    "access_key, role, name, enabled, concurrency_used, concurrency_limit, created_at, secret_hash, preemptible";

/// A change to a key (`PATCH /v1/access-keys/{key}`); `None` keeps the value.
#[derive(Clone, Debug, Default)]
pub struct KeyChange {
    /// New limit (0 = unlimited).
    pub concurrency_limit: Option<i64>,
    /// Enable or disable.
    pub enabled: Option<bool>,
    /// New label.
    pub name: Option<String>,
    /// New default of `preemptible` for the key's sessions (preemption, issue 41).
    pub preemptible: Option<bool>,
}

/// Why a key could not be deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteKeyError {
    /// No such (undeleted) key.
    #[error("access key `{0}` not found")]
    NotFound(String),
    /// It still has live sessions.
    #[error("access key `{0}` has {1} live session(s); destroy them first")]
    InUse(String, i64),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    /// Creates a key with the hash of its secret.
    ///
    /// Errors: the id or the hash exists already (a constraint), the database.
    pub async fn create_access_key(
        &self,
        access_key: &str,
        secret_hash: &str,
        role: &str,
        name: &str,
        concurrency_limit: i64,
    ) -> Result<AccessKeyRow, StoreError> {
        sqlx::query(
            "INSERT INTO access_keys (access_key, concurrency_used, concurrency_limit, created_at, secret_hash, role, enabled, name) \
             VALUES ($1, 0, $2, $3, $4, $5, 1, $6)",
        )
        .bind(access_key)
        .bind(concurrency_limit)
        .bind(now())
        .bind(secret_hash)
        .bind(role)
        .bind(name)
        .execute(&self.pool)
        .await?;
        self.access_key(access_key)
            .await?
            .ok_or_else(|| StoreError::Db(sqlx::Error::RowNotFound))
    }

    /// The enabled, undeleted key whose secret hashes to `secret_hash`.
    pub async fn access_key_by_secret_hash(
        &self,
        secret_hash: &str,
    ) -> Result<Option<AccessKeyRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM access_keys WHERE secret_hash = $1 AND deleted_at IS NULL"
        ))
        .bind(secret_hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(AccessKeyRow::from_row).transpose()?)
    }

    /// One undeleted key, `None` when unknown.
    pub async fn access_key(&self, access_key: &str) -> Result<Option<AccessKeyRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM access_keys WHERE access_key = $1 AND deleted_at IS NULL"
        ))
        .bind(access_key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(AccessKeyRow::from_row).transpose()?)
    }

    /// Every undeleted key, oldest first.
    pub async fn access_keys(&self) -> Result<Vec<AccessKeyRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM access_keys WHERE deleted_at IS NULL ORDER BY created_at, access_key"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(AccessKeyRow::from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Whether any enabled admin key that can sign in exists (the bootstrap's question).
    pub async fn has_admin_key(&self) -> Result<bool, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM access_keys WHERE role = 'admin' AND enabled = 1 \
             AND deleted_at IS NULL AND secret_hash IS NOT NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)? > 0)
    }

    /// Applies `change` to an undeleted key; the key after it, `None` when unknown.
    pub async fn update_access_key(
        &self,
        access_key: &str,
        change: &KeyChange,
    ) -> Result<Option<AccessKeyRow>, StoreError> {
        // -1 / '' stand for "keep" (never a NULL parameter: see agents.rs).
        sqlx::query(
            "UPDATE access_keys SET \
               concurrency_limit = CASE WHEN $2 < 0 THEN concurrency_limit ELSE $2 END, \
               enabled = CASE WHEN $3 < 0 THEN enabled ELSE $3 END, \
               name = CASE WHEN $4 = 0 THEN name ELSE $5 END, \
               preemptible = CASE WHEN $6 < 0 THEN preemptible ELSE $6 END \
             WHERE access_key = $1 AND deleted_at IS NULL",
        )
        .bind(access_key)
        .bind(change.concurrency_limit.unwrap_or(-1))
        .bind(change.enabled.map_or(-1, i64::from))
        .bind(i64::from(change.name.is_some()))
        .bind(change.name.clone().unwrap_or_default())
        .bind(change.preemptible.map_or(-1, i64::from))
        .execute(&self.pool)
        .await?;
        self.access_key(access_key).await
    }

    /// Deletes a key with no live session: it can no longer sign in and is listed nowhere; its
    /// row stays (without the secret's hash) for its terminated sessions' history, its vfolder
    /// records go.
    ///
    /// Errors: [`DeleteKeyError::NotFound`], [`DeleteKeyError::InUse`], the database.
    pub async fn delete_access_key(
        &self,
        access_key: &str,
    ) -> Result<AccessKeyRow, DeleteKeyError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM access_keys WHERE access_key = $1 AND deleted_at IS NULL"
        ))
        .bind(access_key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        let key = row
            .as_ref()
            .map(AccessKeyRow::from_row)
            .transpose()
            .map_err(StoreError::from)?
            .ok_or_else(|| DeleteKeyError::NotFound(access_key.to_owned()))?;
        if key.concurrency_used > 0 {
            return Err(DeleteKeyError::InUse(
                access_key.to_owned(),
                key.concurrency_used,
            ));
        }
        sqlx::query(
            "UPDATE access_keys SET deleted_at = $2, enabled = 0, secret_hash = NULL WHERE access_key = $1",
        )
        .bind(access_key)
        .bind(now())
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        sqlx::query("DELETE FROM vfolders WHERE owner = $1")
            .bind(access_key)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(key)
    }

    /// Every access key with `concurrency_used`: `key → used`.
    pub async fn concurrency_used(&self) -> Result<HashMap<String, i64>, StoreError> {
        let rows = sqlx::query("SELECT access_key, concurrency_used FROM access_keys")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }
}
