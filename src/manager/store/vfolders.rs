//! vfolders: named folders owned by an access key. The store holds their names only; the data
//! lives under each agent's `[container] vfolder-root` as `<owner>/<name>` (shared storage in a
//! fleet), created by the agent on first mount.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now, Store, StoreError};

/// One vfolder.
#[derive(Clone, Debug, PartialEq)]
pub struct VfolderRow {
    /// The owning access key.
    pub owner: String,
    /// Its name: one path component (checked by the API).
    pub name: String,
    /// Unix seconds.
    pub created_at: f64,
}

impl VfolderRow {
    fn from_row(r: &AnyRow) -> Result<VfolderRow, sqlx::Error> {
        Ok(VfolderRow {
            owner: r.try_get("owner")?,
            name: r.try_get("name")?,
            created_at: r.try_get("created_at")?,
        })
    }
}

impl Store {
    /// Creates `owner`'s vfolder `name`; `false` when it exists already.
    pub async fn create_vfolder(&self, owner: &str, name: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "INSERT INTO vfolders (owner, name, created_at) VALUES ($1, $2, $3) ON CONFLICT (owner, name) DO NOTHING",
        )
        .bind(owner)
        .bind(name)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }

    /// `owner`'s vfolder `name`, if it exists.
    pub async fn vfolder(&self, owner: &str, name: &str) -> Result<Option<VfolderRow>, StoreError> {
        let row = sqlx::query(
            "SELECT owner, name, created_at FROM vfolders WHERE owner = $1 AND name = $2",
        )
        .bind(owner)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(VfolderRow::from_row).transpose()?)
    }

    /// `owner`'s vfolders by name, or everyone's when `owner` is `None`.
    pub async fn vfolders(&self, owner: Option<&str>) -> Result<Vec<VfolderRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT owner, name, created_at FROM vfolders WHERE ($1 = '' OR owner = $1) ORDER BY owner, name",
        )
        .bind(owner.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(VfolderRow::from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Deletes the record of `owner`'s vfolder `name`; `false` when there was none.
    pub async fn delete_vfolder(&self, owner: &str, name: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM vfolders WHERE owner = $1 AND name = $2")
            .bind(owner)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }
}
