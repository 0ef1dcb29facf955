//! `mounts`: vfolders bound to `/home/work/<name>`, host paths confined to the vfolder root.

use std::path::Path;

use actors::{BoxError, Provisioner};

use crate::agent::backend::Bind;
use crate::agent::kernel::config::{check_mount_name, MountRequest};
use crate::agent::kernel::{KernelError, KernelHandle};

/// Checks every vfolder and produces its bind. The binds go away with the container, so
/// teardown has nothing to release.
pub struct MountStage(pub KernelHandle);

impl Provisioner for MountStage {
    type Spec = Vec<MountRequest>;
    type Resource = Vec<Bind>;

    fn name(&self) -> &'static str {
        "mounts"
    }

    async fn setup(&self, mounts: Vec<MountRequest>) -> Result<Vec<Bind>, BoxError> {
        let root = self.0.ctx.config.container.vfolder_root.as_deref();
        Ok(mounts
            .iter()
            .map(|m| bind(root, m))
            .collect::<Result<_, _>>()?)
    }

    async fn teardown(&self, _binds: Vec<Bind>) -> Result<(), BoxError> {
        Ok(())
    }
}

/// The bind for `m`, after resolving symlinks on both the root and the path so neither `..`
/// nor a link can escape the root.
///
/// Errors: `InvalidKernelConfig` when no vfolder root is configured, the path does not
/// exist, or it lies outside the root.
pub fn bind(root: Option<&Path>, m: &MountRequest) -> Result<Bind, KernelError> {
    check_mount_name(&m.name)?;
    let root = root.ok_or_else(|| {
        KernelError::InvalidConfig(format!(
            "vfolder `{}`: this agent has no [container] vfolder-root",
            m.name
        ))
    })?;
    let root = root
        .canonicalize()
        .map_err(|e| KernelError::InvalidConfig(format!("vfolder root {}: {e}", root.display())))?;
    let path = Path::new(&m.host_path).canonicalize().map_err(|e| {
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
        container_path: format!("/home/work/{}", m.name),
        read_only: m.read_only,
    })
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
        };

        let b = bind(
            Some(root.path()),
            &req("data", inside.display().to_string()),
        )
        .unwrap();
        assert_eq!(b.container_path, "/home/work/data");
        for escape in [
            format!("{}/../", root.path().display()),
            root.path().join("link").display().to_string(),
            outside.path().display().to_string(),
        ] {
            let e = bind(Some(root.path()), &req("x", escape.clone())).unwrap_err();
            assert_eq!(e.name(), "InvalidKernelConfig", "{escape}");
        }
        assert!(bind(None, &req("data", inside.display().to_string())).is_err());
        assert!(bind(Some(root.path()), &req("..", inside.display().to_string())).is_err());
    }
}
