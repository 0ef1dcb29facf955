//! `scratch`: the kernel's host directory `<scratch-root>/<kernel-id>` with `config/`
//! (`environ.txt`, `resource.txt`; mounted read-only at `/home/config`) and `work/`
//! (mounted at `/home/work`; a tmpfs of `[container] scratch-size` when set).

use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};

use actors::{BoxError, Provisioner, Resources, StageKey};

use super::{Found, KernelStage, Plan, PORTS, SLOTS};

pub use crate::agent::kernel::resources::ScratchDir;
use crate::agent::kernel::{KernelError, KernelHandle};

/// What goes into the config files: `KEY=VALUE` lines.
#[derive(Clone, Debug)]
pub struct ScratchSpec {
    /// The kernel's environment (`config/environ.txt`).
    pub environ: Vec<(String, String)>,
    /// Its slots and ports (`config/resource.txt`).
    pub resources: Vec<(String, String)>,
}

/// Creates and removes scratch directories.
pub struct ScratchStage(pub KernelHandle);

/// Where kernel `id`'s scratch directory is (`id` is checked to be one path component).
pub fn scratch_path(root: &Path, id: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(root)?;
    Ok(root.canonicalize()?.join(id))
}

/// Writes `K=V` lines. Not synced: the container reads them through the host's page cache, and
/// a host that crashes takes the kernel with it (an fsync costs ~20 ms on a busy disk, on every
/// create).
fn write_lines(path: &Path, lines: &[(String, String)]) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (k, v) in lines {
        writeln!(f, "{k}={v}")?;
    }
    f.flush()
}

fn mount_tmpfs(dir: &Path, bytes: u64) -> std::io::Result<()> {
    let target = CString::new(dir.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    let data = CString::new(format!("size={bytes},mode=0755")).map_err(std::io::Error::other)?;
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Unmounts `work/` if it is a tmpfs and removes the directory; a directory that is already
/// gone is fine (teardown must be idempotent, and recovery calls it for half-made kernels).
pub fn remove_scratch(path: &Path, tmpfs: bool) -> std::io::Result<()> {
    if tmpfs {
        let target = CString::new(path.join("work").as_os_str().as_encoded_bytes())
            .map_err(std::io::Error::other)?;
        // SAFETY: a valid NUL-terminated path; MNT_DETACH never blocks on busy mounts.
        let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
    }
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// This stage's key: its name, typed with its resource.
pub const SCRATCH: StageKey<ScratchDir> = StageKey::of::<ScratchStage>("scratch");

impl Provisioner for ScratchStage {
    type Spec = ScratchSpec;
    type Resource = ScratchDir;

    fn name(&self) -> &'static str {
        SCRATCH.name()
    }

    async fn setup(&self, spec: ScratchSpec) -> Result<ScratchDir, BoxError> {
        let c = &self.0.ctx.config.container;
        let io = |e: std::io::Error| KernelError::Engine(format!("scratch: {e}"));
        let path = scratch_path(&c.scratch_root, &self.0.id).map_err(io)?;
        if path.exists() {
            return Err(KernelError::InvalidConfig(format!(
                "scratch directory {} already exists",
                path.display()
            ))
            .into());
        }
        let dir = ScratchDir {
            path,
            tmpfs: c.scratch_size.is_some(),
        };
        let config = self.0.info().config;
        let owner = (
            config.uid.unwrap_or(c.kernel_uid),
            config.main_gid.unwrap_or(c.kernel_gid),
        );
        let made = (|| {
            std::fs::create_dir_all(dir.config_dir())?;
            std::fs::create_dir_all(dir.work_dir())?;
            if let Some(size) = c.scratch_size {
                mount_tmpfs(&dir.work_dir(), size.0)?;
            }
            // `/home/work` belongs to the kernel's user (Backend.AI chowns the scratch to the
            // kernel's uid/gid), so user code running as that user can write its home.
            std::os::unix::fs::chown(dir.work_dir(), Some(owner.0), Some(owner.1))?;
            write_lines(&dir.config_dir().join("environ.txt"), &spec.environ)?;
            write_lines(&dir.config_dir().join("resource.txt"), &spec.resources)
        })();
        if let Err(e) = made {
            // Leave nothing behind on failure (the provisioner contract).
            let _ = remove_scratch(&dir.path, dir.tmpfs);
            return Err(io(e).into());
        }
        Ok(dir)
    }

    async fn teardown(&self, dir: ScratchDir) -> Result<(), BoxError> {
        Ok(remove_scratch(&dir.path, dir.tmpfs)?)
    }
}

impl KernelStage for ScratchStage {
    fn new(handle: KernelHandle) -> Self {
        ScratchStage(handle)
    }

    fn spec(plan: &Plan, r: &Resources<'_>) -> Result<ScratchSpec, BoxError> {
        let alloc = r.of(SLOTS)?;
        let ports = r.of(PORTS)?;
        // Every slot held, then the devices: their ids in the agent's numbering and
        // the allocation per slot (`{slot: {device id: amount}}` as JSON).
        let mut resources: Vec<(String, String)> = alloc
            .slots
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_string()))
            .collect();
        resources.push((
            "CUDA_GLOBAL_DEVICE_IDS".into(),
            alloc.device_ids().join(","),
        ));
        resources.push((
            "ALLOCATED_DEVICES".into(),
            serde_json::to_string(&alloc.devices).unwrap_or_default(),
        ));
        resources.push((
            "HOST_PORTS".into(),
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ));
        Ok(ScratchSpec {
            environ: super::container::environ(&plan.handle, alloc),
            resources,
        })
    }

    /// This agent's scratch directory for the kernel, which the container's `/home/work` must
    /// be: a container bound elsewhere is not one this agent's stages made.
    fn rebuild(found: &Found<'_>) -> Result<ScratchDir, String> {
        let work = found
            .desc
            .spec
            .binds
            .iter()
            .find(|b| b.container_path == "/home/work")
            .ok_or("no scratch bind on /home/work")?;
        let c = found.container;
        let scratch = ScratchDir {
            path: scratch_path(&c.scratch_root, found.kernel_id).map_err(|e| e.to_string())?,
            tmpfs: c.scratch_size.is_some(),
        };
        if Path::new(&work.host_path) != scratch.work_dir() {
            return Err(format!(
                "its /home/work is {}, not this agent's scratch directory {}",
                work.host_path,
                scratch.work_dir().display()
            ));
        }
        Ok(scratch)
    }
}
