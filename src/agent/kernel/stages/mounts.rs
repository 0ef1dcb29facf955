//! `mounts`: vfolders bound to `/home/work/<name>`, host paths confined to the vfolder root.
//!
//! The manager names a vfolder by a path relative to the root (`<owner access key>/<name>`);
//! the first mount creates it, owned by the kernel's user so the kernel can write to it. An
//! absolute host path (an operator's direct RPC call) must already exist under the root.

use std::path::{Component, Path, PathBuf};

use actors::{BoxError, Provisioner, Resources, StageKey};

use super::{Found, KernelStage, Plan};

use crate::agent::backend::Bind;
use crate::agent::kernel::config::{check_mount_name, MountRequest};
use crate::agent::kernel::{KernelError, KernelHandle};

/// Checks every vfolder and produces its bind. The binds go away with the container, so
/// teardown has nothing to release.
pub struct MountStage(pub KernelHandle);

/// This stage's key: its name, typed with its resource.
pub const MOUNTS: StageKey<Vec<Bind>> = StageKey::of::<MountStage>("mounts");

impl Provisioner for MountStage {
    type Spec = Vec<MountRequest>;
    type Resource = Vec<Bind>;

    fn name(&self) -> &'static str {
        MOUNTS.name()
    }

    async fn setup(&self, mounts: Vec<MountRequest>) -> Result<Vec<Bind>, BoxError> {
        let c = &self.0.ctx.config.container;
        // A new vfolder belongs to the kernel's user, so what it writes there is not root's.
        let config = self.0.info().config;
        let owner = (
            config.uid.unwrap_or(c.kernel_uid),
            config.main_gid.unwrap_or(c.kernel_gid),
        );
        Ok(mounts
            .iter()
            .map(|m| bind(c.vfolder_root.as_deref(), m, owner))
            .collect::<Result<_, _>>()?)
    }

    async fn teardown(&self, _binds: Vec<Bind>) -> Result<(), BoxError> {
        Ok(())
    }
}

impl KernelStage for MountStage {
    fn new(handle: KernelHandle) -> Self {
        MountStage(handle)
    }

    /// The config's vfolders.
    fn spec(plan: &Plan, _: &Resources<'_>) -> Result<Vec<MountRequest>, BoxError> {
        Ok(plan.config.mounts.clone())
    }

    /// The container's binds but the scratch directory's (`/home/work`, `/home/config`).
    fn rebuild(found: &Found<'_>) -> Result<Vec<Bind>, String> {
        Ok(found
            .desc
            .spec
            .binds
            .iter()
            .filter(|b| b.container_path != "/home/work" && b.container_path != "/home/config")
            .cloned()
            .collect())
    }
}

/// The bind for `m`, after resolving symlinks on both the root and the path so neither `..`
/// nor a link can escape the root. A relative host path is under the root and created when
/// missing (mode 0755, owned by `owner` = (uid, gid)).
///
/// Errors: `InvalidKernelConfig` when no vfolder root is configured, a relative path has a
/// component other than a plain name, the directory cannot be created, an absolute path does
/// not exist, or the path lies outside the root.
pub fn bind(root: Option<&Path>, m: &MountRequest, owner: (u32, u32)) -> Result<Bind, KernelError> {
    check_mount_name(&m.name)?;
    let root = root.ok_or_else(|| {
        KernelError::InvalidConfig(format!(
            "vfolder `{}`: this agent has no [container] vfolder-root",
            m.name
        ))
    })?;
    if Path::new(&m.host_path).is_relative() {
        // The manager's vfolders live under the root: the first one makes it.
        std::fs::create_dir_all(root).map_err(|e| {
            KernelError::InvalidConfig(format!("vfolder root {}: {e}", root.display()))
        })?;
    }
    let root = root
        .canonicalize()
        .map_err(|e| KernelError::InvalidConfig(format!("vfolder root {}: {e}", root.display())))?;
    let host_path = Path::new(&m.host_path);
    let host_path = if host_path.is_relative() {
        create_under(&root, host_path, owner).map_err(|e| {
            KernelError::InvalidConfig(format!(
                "vfolder `{}`: host path {}: {e}",
                m.name, m.host_path
            ))
        })?
    } else {
        host_path.to_path_buf()
    };
    let path = host_path.canonicalize().map_err(|e| {
        KernelError::InvalidConfig(format!(
            "vfolder `{}`: host path {}: {e}",
            m.name, m.host_path
        ))
    })?;
    if !path.starts_with(&root) {
        return Err(KernelError::InvalidConfig(format!(
            "vfolder `{}`: host path {} is outside the vfolder root {}",
            m.name,
            m.host_path,
            root.display()
        )));
    }
    Ok(Bind {
        host_path: path.display().to_string(),
        container_path: m
            .kernel_path
            .clone()
            .unwrap_or_else(|| format!("/home/work/{}", m.name)),
        read_only: m.read_only,
    })
}

/// `root/rel`, creating what is missing one directory at a time (never through a link that
/// leaves `root`, the canonical root); the last directory, when created, is owned by `owner`.
///
/// Errors: a component that is not a plain name, a link out of the root, a file in the way,
/// I/O.
fn create_under(root: &Path, rel: &Path, (uid, gid): (u32, u32)) -> Result<PathBuf, String> {
    let parts: Vec<_> = rel.components().collect();
    if parts.is_empty() || !parts.iter().all(|c| matches!(c, Component::Normal(_))) {
        return Err("must be plain names under the vfolder root".into());
    }
    let mut cur = root.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        cur.push(part);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                cur = cur.canonicalize().map_err(|e| e.to_string())?;
                if !cur.starts_with(root) || !cur.is_dir() {
                    return Err("leads out of the vfolder root".into());
                }
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{} is not a directory", cur.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&cur)
                    .map_err(|e| format!("cannot create {}: {e}", cur.display()))?;
                if i + 1 == parts.len() {
                    match std::os::unix::fs::chown(&cur, Some(uid), Some(gid)) {
                        // An agent that is not root cannot give it away; kernels running as
                        // the agent's own user can still use it.
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
                        r => r.map_err(|e| e.to_string())?,
                    }
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confines_host_paths_to_the_root() {
        let root = tempfile::tempdir().unwrap();
        let inside = root.path().join("data");
        std::fs::create_dir(&inside).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        let req = |name: &str, p: String| MountRequest {
            name: name.into(),
            host_path: p,
            read_only: true,
            kernel_path: None,
        };

        let me = (unsafe { libc::getuid() }, unsafe { libc::getgid() });
        let b = bind(
            Some(root.path()),
            &req("data", inside.display().to_string()),
            me,
        )
        .unwrap();
        assert_eq!(b.container_path, "/home/work/data");
        for escape in [
            format!("{}/../", root.path().display()),
            root.path().join("link").display().to_string(),
            outside.path().display().to_string(),
            "AK1/../../x".into(),
            "link/inner".into(),
        ] {
            let e = bind(Some(root.path()), &req("x", escape.clone()), me).unwrap_err();
            assert_eq!(e.name(), "InvalidKernelConfig", "{escape}");
        }
        assert!(
            !outside.path().join("inner").exists(),
            "nothing created through the link"
        );
        assert!(bind(None, &req("data", inside.display().to_string()), me).is_err());
        assert!(bind(
            Some(root.path()),
            &req("..", inside.display().to_string()),
            me
        )
        .is_err());

        // A relative path is created under the root on first mount, then reused.
        let b = bind(Some(root.path()), &req("nb", "AK1/nb".into()), me).unwrap();
        let made = root.path().join("AK1/nb").canonicalize().unwrap();
        assert_eq!(b.host_path, made.display().to_string());
        assert!(made.is_dir());
        assert_eq!(
            bind(Some(root.path()), &req("nb", "AK1/nb".into()), me)
                .unwrap()
                .host_path,
            b.host_path
        );
    }
}
