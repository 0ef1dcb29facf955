//! A runner kernel's container, prepared as Backend.AI 26.9.6's Docker agent prepares it
//! (`DockerKernelCreationContext.start_container` and `mount_krunner`,
//! `src/ai/backend/agent/docker/agent.py`, `src/ai/backend/agent/agent.py`): the runner's
//! entrypoint and command, root with the kernel's user in `LOCAL_USER_ID`/`LOCAL_GROUP_ID`
//! (the entrypoint drops privileges with su-exec), `docker-init`, `SIGINT` to stop, the
//! runner's read-only binds, `libbaihook` preloaded, the corecount variables, repl-in/out on
//! 127.0.0.1, and the scratch files the runner reads (`/home/config/environ.txt` with the whole
//! environment, the sshd host key, `/home/work/bootstrap.sh`).

use std::io::Write;
use std::path::Path;

use super::client::RunnerPorts;
use super::keys::UserKeypair;
use super::krunner::Krunner;
use crate::agent::backend::{ContainerSpec, PortMapping};

/// The runner's PULL, in the container (`repl_in_port` publishes it).
pub const REPL_IN: u16 = 2000;
/// The runner's PUSH, in the container (`repl_out_port` publishes it).
pub const REPL_OUT: u16 = 2001;
/// The intrinsic `sshd` service's port (dropbear).
pub const SSHD_PORT: u16 = 2200;
/// The intrinsic `ttyd` service's port (a web terminal).
pub const TTYD_PORT: u16 = 7681;

/// Label kernelvisor puts on a runner kernel's container: its runtime type (recovery and
/// `ctl session show` read which path a kernel has from it).
pub const RUNNER_LABEL: &str = "ai.kernelvisor.kernel-runner";

/// What a runner container is made with, beyond the process-path spec.
pub struct RunnerLaunch<'a> {
    /// The provisioned runner.
    pub krunner: &'a Krunner,
    /// `python`, `app`, …
    pub runtime_type: &'a str,
    /// The image's `ai.backend.runtime-path`.
    pub runtime_path: Option<&'a str>,
    /// Host ports for repl-in/out.
    pub repl: RunnerPorts,
    /// The kernel's uid and main gid (the config's, else `[container] kernel-uid/gid`).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// Supplementary gids (`ADDITIONAL_GIDS`).
    pub supplementary_gids: &'a [u32],
    /// Variables set to the core count (the image's `ai.backend.envs.corecount`).
    pub corecount_vars: Vec<String>,
    /// The kernel's cores (its `cpu` slot, rounded up, at least 1).
    pub cores: u64,
}

/// Turns a process-path `spec` into the runner's.
pub fn prepare(spec: &mut ContainerSpec, l: &RunnerLaunch<'_>) {
    spec.entrypoint = Some(vec!["/opt/kernel/entrypoint.sh".into()]);
    let mut cmd: Vec<String> = [
        "/opt/backend.ai/bin/python",
        "-s",
        "-m",
        "ai.backend.kernel",
    ]
    .map(str::to_owned)
    .to_vec();
    cmd.push(l.runtime_type.to_owned());
    if let Some(p) = l.runtime_path {
        cmd.push(p.to_owned());
    }
    spec.cmd = Some(cmd);
    spec.working_dir = Some("/home/work".into());
    // Root: the entrypoint makes the user and drops to it with su-exec.
    spec.user = None;
    spec.group_add.clear();
    spec.init = true;
    spec.stop_signal = Some("SIGINT".into());
    // As upstream's `start_container`: locking memory and niceness for the REPL's libraries
    // (RDMA, NCCL). Upstream also raises `nofile` to 1048576 and `memlock` to unlimited; an
    // engine that may not raise its own limits (dockerd here runs with 20000 files) refuses
    // to start such a container, so the engine's limits stay.
    for cap in ["IPC_LOCK", "SYS_NICE"] {
        if !spec.cap_add.iter().any(|c| c == cap) {
            spec.cap_add.push(cap.into());
        }
    }
    spec.binds.extend(l.krunner.binds());
    spec.local_ports = vec![
        PortMapping {
            container_port: REPL_IN,
            host_port: l.repl.repl_in,
        },
        PortMapping {
            container_port: REPL_OUT,
            host_port: l.repl.repl_out,
        },
    ];
    let set = |env: &mut Vec<String>, k: &str, v: String| {
        env.retain(|e| !e.starts_with(&format!("{k}=")));
        env.push(format!("{k}={v}"));
    };
    set(&mut spec.env, "LOCAL_USER_ID", l.uid.to_string());
    set(&mut spec.env, "LOCAL_GROUP_ID", l.gid.to_string());
    if !l.supplementary_gids.is_empty() {
        let gids: Vec<String> = l.supplementary_gids.iter().map(u32::to_string).collect();
        set(&mut spec.env, "ADDITIONAL_GIDS", gids.join(","));
    }
    set(
        &mut spec.env,
        "LD_PRELOAD",
        "/opt/kernel/libbaihook.so".into(),
    );
    // Upstream's accelerator variables: the count of GPUs the kernel holds (0 without one).
    let gpus = spec.gpu_device_ids.len().to_string();
    set(&mut spec.env, "GPU_COUNT", gpus.clone());
    set(&mut spec.env, "N_GPUS", gpus);
    for var in &l.corecount_vars {
        set(&mut spec.env, var, l.cores.to_string());
    }
    // The runner and the entrypoint read these (upstream's manager always sends them).
    for (ours, theirs) in [
        ("BACKEND_KERNEL_ID", "BACKENDAI_KERNEL_ID"),
        ("BACKEND_SESSION_ID", "BACKENDAI_SESSION_ID"),
    ] {
        let has = spec
            .env
            .iter()
            .any(|e| e.starts_with(&format!("{theirs}=")));
        let value = spec
            .env
            .iter()
            .find_map(|e| e.strip_prefix(&format!("{ours}=")).map(str::to_owned));
        if let (false, Some(v)) = (has, value) {
            spec.env.push(format!("{theirs}={v}"));
        }
    }
    spec.labels
        .insert(RUNNER_LABEL.into(), l.runtime_type.to_owned());
}

/// The variables named by an image's `ai.backend.envs.corecount` label (comma-separated).
pub fn corecount_vars(label: Option<&String>) -> Vec<String> {
    label
        .map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Writes what the runner reads from the scratch directory: `config/environ.txt` (the whole
/// container environment, `K=V` per line: the runner loads it into its children's), the sshd
/// host key `config/ssh/dropbear_rsa_host_key` (from `host_key`, made ahead by
/// [`RunnerKeys`](super::RunnerKeys): saving the runner its keygen; readable by the kernel's
/// user, who runs sshd; a container made anew for the same kernel keeps the key it had, so its
/// clients' `known_hosts` stay right), `work/bootstrap.sh` (the runner runs it as the user
/// before it answers `status`), and the user's SSH keys ([`write_user_keys`]). Nothing is synced: the container reads them through the same page cache, and a
/// host that crashes takes the kernel with it.
///
/// Errors: the file system's, or `host_key`'s.
pub fn write_scratch(
    config_dir: &Path,
    work_dir: &Path,
    spec: &ContainerSpec,
    host_key: impl FnOnce() -> std::io::Result<Vec<u8>>,
    user_keys: UserKeys<'_, impl FnOnce() -> std::io::Result<UserKeypair>>,
    owner: (u32, u32),
    bootstrap: Option<&str>,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::io::BufWriter::new(std::fs::File::create(config_dir.join("environ.txt"))?);
    for e in &spec.env {
        // A value with a newline would split into two entries: upstream writes them as they are.
        writeln!(f, "{e}")?;
    }
    f.flush()?;
    let ssh = config_dir.join("ssh");
    std::fs::create_dir_all(&ssh)?;
    let key = ssh.join("dropbear_rsa_host_key");
    if !key.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key)?
            .write_all(&host_key()?)?;
    }
    std::os::unix::fs::chown(&ssh, Some(owner.0), Some(owner.1))?;
    std::os::unix::fs::chown(&key, Some(owner.0), Some(owner.1))?;
    if let Some(script) = bootstrap {
        let path = work_dir.join("bootstrap.sh");
        std::fs::write(&path, script)?;
        std::os::unix::fs::chown(&path, Some(owner.0), Some(owner.1))?;
    }
    if !spec
        .binds
        .iter()
        .any(|b| b.container_path.trim_end_matches('/') == "/home/work/.ssh")
    {
        write_user_keys(work_dir, user_keys, owner)?;
    }
    Ok(())
}

/// Where a runner kernel's user keypair comes from.
pub enum UserKeys<'a, F> {
    /// The manager's (`internal_data.ssh_keypair`): the user's own.
    Given(&'a UserKeypair),
    /// None was sent: one made ahead (`Runners::user_keypair`), as the runner would make.
    MadeAhead(F),
}

/// Writes the user's SSH keys into `work_dir` (`/home/work`), owned by `owner`: with the
/// manager's keypair, as upstream's agent does (`.ssh/authorized_keys`, `.ssh/id_rsa` unless
/// the user has one, `id_container`; `prepare_scratch` in
/// `src/ai/backend/agent/docker/agent.py`); without one, what the runner would make at its start
/// (`.ssh/authorized_keys` and `id_container`; `init_sshd_service` in
/// `src/ai/backend/kernel/intrinsic.py`) from a keypair made ahead, unless
/// `.ssh/authorized_keys` is there already (a container made anew for the same kernel). `.ssh`
/// is 0700 and the keys 0600, as the runner wants them. [`write_scratch`] skips this when a
/// vfolder is mounted on `/home/work/.ssh` (upstream writes nothing then either).
///
/// Errors: the file system's, or the keygen's.
pub fn write_user_keys(
    work_dir: &Path,
    keys: UserKeys<'_, impl FnOnce() -> std::io::Result<UserKeypair>>,
    owner: (u32, u32),
) -> std::io::Result<()> {
    use std::os::unix::fs::{chown, PermissionsExt};
    let ssh = work_dir.join(".ssh");
    let authorized = ssh.join("authorized_keys");
    let (pair, id_rsa) = match keys {
        UserKeys::Given(pair) => (pair.clone(), true),
        UserKeys::MadeAhead(_) if authorized.exists() => return Ok(()),
        UserKeys::MadeAhead(make) => (make()?, false),
    };
    std::fs::create_dir_all(&ssh)?;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o700))?;
    chown(&ssh, Some(owner.0), Some(owner.1))?;
    let write = |path: &Path, text: &str| -> std::io::Result<()> {
        std::fs::write(path, text)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        chown(path, Some(owner.0), Some(owner.1))
    };
    let public = if pair.public_key.ends_with('\n') {
        pair.public_key.clone()
    } else {
        format!("{}\n", pair.public_key)
    };
    write(&authorized, &public)?;
    if id_rsa && !ssh.join("id_rsa").exists() {
        write(&ssh.join("id_rsa"), &pair.private_key)?;
    }
    write(&work_dir.join("id_container"), &pair.private_key)
}
