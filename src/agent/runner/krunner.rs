//! The runner `just krunner` provisioned (`scripts/krunner-fetch.sh`): the unpacked
//! `ai/backend/{kernel,helpers,runner}` of the pinned `backend.ai-kernel*` wheels and the
//! static Python env extracted once into `env/v<N>.<arch>.static-gnu/`, and the read-only
//! binds a runner container gets from them (upstream's `mount_krunner`,
//! `src/ai/backend/agent/agent.py`, with a directory bind where upstream uses a named volume).

use std::path::{Path, PathBuf};

use crate::agent::backend::Bind;

/// A located runner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Krunner {
    /// The `[kernel-runner] dir`.
    pub root: PathBuf,
    /// `env/v<N>.<arch>.static-gnu`: mounted at `/opt/backend.ai`.
    pub env: PathBuf,
    /// Its `VERSION` (the krunner version, 14 for `backend.ai-krunner-static-gnu` 4.4.0).
    pub version: u32,
    /// The env's Python (`3.13`): where the kernel package is mounted in it.
    pub python: String,
    /// `x86_64` or `aarch64`.
    pub arch: &'static str,
    /// The `libbaihook.<distro>.<arch>.so` used (the newest glibc one).
    pub baihook: String,
}

/// The runner's files a container gets, by their names in `ai/backend/runner/`
/// (`{arch}` filled in), and where; all read-only. The optional ones upstream mounts with
/// `skip_missing` (all-smi, bssh: 40 MB of tools) are left out.
const RUNNER_FILES: &[(&str, &str)] = &[
    ("su-exec.{arch}.bin", "/opt/kernel/su-exec"),
    ("dropbearmulti.{arch}.bin", "/opt/kernel/dropbearmulti"),
    ("sftp-server.{arch}.bin", "/opt/kernel/sftp-server"),
    ("tmux.{arch}.bin", "/opt/kernel/tmux"),
    ("ttyd_linux.{arch}.bin", "/opt/kernel/ttyd"),
    ("yank.sh", "/opt/kernel/yank.sh"),
    ("extract_dotfiles.py", "/opt/kernel/extract_dotfiles.py"),
    ("entrypoint.sh", "/opt/kernel/entrypoint.sh"),
    ("fantompass.py", "/opt/kernel/fantompass.py"),
    ("hash_phrase.py", "/opt/kernel/hash_phrase.py"),
    ("words.json", "/opt/kernel/words.json"),
];

/// The host's architecture in the runner's file names.
pub fn arch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "aarch64"
    } else {
        "x86_64"
    }
}

impl Krunner {
    /// Finds the runner in `root`: the newest complete `env/v<N>.<arch>.static-gnu/`
    /// (`VERSION` written last), its `lib/python3.*`, the runner files and the kernel and
    /// helpers packages.
    ///
    /// Errors: what is missing, by path.
    pub fn locate(root: &Path) -> Result<Krunner, String> {
        let arch = arch();
        let suffix = format!(".{arch}.static-gnu");
        let envs = root.join("env");
        let mut best: Option<(u32, PathBuf)> = None;
        let entries = std::fs::read_dir(&envs)
            .map_err(|e| format!("{}: {e} (run `just krunner`)", envs.display()))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(n) = name
                .strip_prefix('v')
                .and_then(|r| r.strip_suffix(&suffix))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let written = std::fs::read_to_string(entry.path().join("VERSION"))
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok());
            if written == Some(n) && best.as_ref().is_none_or(|(b, _)| n > *b) {
                best = Some((n, entry.path()));
            }
        }
        let (version, env) =
            best.ok_or_else(|| format!("no complete env/v<N>{suffix} in {}", root.display()))?;
        let python = std::fs::read_dir(env.join("lib"))
            .map_err(|e| format!("{}/lib: {e}", env.display()))?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.strip_prefix("python")
                    .filter(|v| v.starts_with('3') && e.path().join("site-packages").is_dir())
                    .map(str::to_owned)
            })
            .max()
            .ok_or_else(|| format!("no lib/python3.*/site-packages in {}", env.display()))?;
        let runner = root.join("ai/backend/runner");
        for (file, _) in RUNNER_FILES {
            let path = runner.join(file.replace("{arch}", arch));
            if !path.is_file() {
                return Err(format!("{} is missing", path.display()));
            }
        }
        for pkg in ["kernel", "helpers"] {
            let path = root.join("ai/backend").join(pkg);
            if !path.join("__init__.py").is_file() {
                return Err(format!("{} is not the {pkg} package", path.display()));
            }
        }
        // Upstream picks the newest hook at most the image's distro; a glibc image here is
        // newer than every Ubuntu the wheel has a build for (`match_distro_data`).
        let baihook = std::fs::read_dir(&runner)
            .map_err(|e| format!("{}: {e}", runner.display()))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("libbaihook.ubuntu") && n.ends_with(&format!(".{arch}.so")))
            .max_by_key(|n| {
                n.trim_start_matches("libbaihook.ubuntu")
                    .split('.')
                    .take(2)
                    .map(|p| p.parse::<u32>().unwrap_or(0))
                    .collect::<Vec<_>>()
            })
            .ok_or_else(|| format!("no libbaihook.ubuntu*.{arch}.so in {}", runner.display()))?;
        Ok(Krunner {
            root: root.to_owned(),
            env,
            version,
            python,
            arch,
            baihook,
        })
    }

    /// The container's read-only binds: the runner files under `/opt/kernel`, the env at
    /// `/opt/backend.ai`, and the kernel and helpers packages over its empty package dirs.
    pub fn binds(&self) -> Vec<Bind> {
        let runner = self.root.join("ai/backend/runner");
        let bind = |host: PathBuf, container: String| Bind {
            host_path: host.display().to_string(),
            container_path: container,
            read_only: true,
        };
        let mut binds: Vec<Bind> = RUNNER_FILES
            .iter()
            .map(|(file, at)| {
                bind(
                    runner.join(file.replace("{arch}", self.arch)),
                    (*at).to_owned(),
                )
            })
            .collect();
        binds.push(bind(
            runner.join(&self.baihook),
            "/opt/kernel/libbaihook.so".into(),
        ));
        binds.push(bind(self.env.clone(), "/opt/backend.ai".into()));
        let site = format!(
            "/opt/backend.ai/lib/python{}/site-packages/ai/backend",
            self.python
        );
        for pkg in ["kernel", "helpers"] {
            binds.push(bind(
                self.root.join("ai/backend").join(pkg),
                format!("{site}/{pkg}"),
            ));
        }
        binds
    }

    /// The static `dropbearmulti` on the host (the agent makes each kernel's host key with it).
    pub fn dropbearmulti(&self) -> PathBuf {
        self.root
            .join("ai/backend/runner")
            .join(format!("dropbearmulti.{}.bin", self.arch))
    }
}
