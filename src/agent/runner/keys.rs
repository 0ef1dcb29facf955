//! A runner kernel's SSH keys, made ahead with the runner's own `dropbearmulti` off the create
//! path: its sshd host key (upstream's agent makes one while it creates each kernel,
//! `prepare_ssh` in `src/ai/backend/agent/docker/agent.py`), and, for a kernel whose manager
//! sent no user keypair (`internal_data.ssh_keypair`, which upstream's agent writes into
//! `/home/work/.ssh`), the keypair the runner would otherwise make at its start, before its REPL
//! (`init_sshd_service` in `src/ai/backend/kernel/intrinsic.py`: an RSA-2048 key, its public
//! half in `authorized_keys`, its private half in OpenSSH form in `/home/work/id_container`;
//! 0.3–0.7 s of every runner kernel's boot here).
//!
//! Each kind is a small [`Pool`] refilled on a thread of its own after each take; a key goes to
//! one kernel only, and an empty pool makes one on the spot.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::made_ahead::Pool;

/// Host keys kept ready (cheap: ed25519).
pub const HOST_KEYS: usize = 4;

/// User keypairs kept ready (RSA-2048: about 0.2 s of CPU each).
pub const USER_KEYPAIRS: usize = 2;

/// A user's SSH keypair as the runner's sshd and the user take it: the public key's
/// `authorized_keys` line and the private key in OpenSSH form.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UserKeypair {
    /// `ssh-rsa AAAA… comment`.
    pub public_key: String,
    /// `-----BEGIN OPENSSH PRIVATE KEY-----…`.
    pub private_key: String,
}

/// Where `dropbearkey` writes each key before it is read and removed: a directory of this
/// process's own (mode 0700), removed when the last pool using it goes.
pub struct KeyDir {
    dropbearmulti: PathBuf,
    dir: PathBuf,
}

impl KeyDir {
    /// A new private directory under the system's temp dir, for keys made with `dropbearmulti`.
    pub fn new(dropbearmulti: PathBuf) -> Arc<KeyDir> {
        Arc::new(KeyDir {
            dropbearmulti,
            dir: std::env::temp_dir().join(format!(
                "kv-runner-keys-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            )),
        })
    }

    /// A new sshd host key: `dropbearkey -t ed25519`'s file.
    ///
    /// Errors: the keygen's (its exit and stderr), or the file system's.
    pub fn host_key(&self) -> std::io::Result<Vec<u8>> {
        let path = self.path()?;
        let made = self
            .dropbear(&["dropbearkey", "-t", "ed25519", "-f"], &path)
            .and_then(|_| std::fs::read(&path));
        let _ = std::fs::remove_file(&path);
        made
    }

    /// A new user keypair as the runner makes one: `dropbearkey -t rsa -s 2048`'s public key
    /// line, and the private key converted to OpenSSH form (`dropbearconvert`).
    ///
    /// Errors: the keygen's or the conversion's, or the file system's.
    pub fn user_keypair(&self) -> std::io::Result<UserKeypair> {
        let (key, openssh) = (self.path()?, self.path()?);
        let made = (|| {
            let out = self.dropbear(&["dropbearkey", "-t", "rsa", "-s", "2048", "-f"], &key)?;
            // "Public key portion is:", then the key's line (the runner takes the same line).
            let public_key = String::from_utf8_lossy(&out)
                .lines()
                .find(|l| l.starts_with("ssh-"))
                .map(str::to_owned)
                .ok_or_else(|| std::io::Error::other("dropbearkey printed no public key"))?;
            let mut convert = std::process::Command::new(&self.dropbearmulti);
            convert
                .args(["dropbearconvert", "dropbear", "openssh"])
                .arg(&key)
                .arg(&openssh);
            checked(convert, "dropbearconvert")?;
            let private_key = std::fs::read_to_string(&openssh)?;
            Ok(UserKeypair {
                public_key,
                private_key,
            })
        })();
        let _ = std::fs::remove_file(&key);
        let _ = std::fs::remove_file(&openssh);
        made
    }

    /// A fresh path in the directory (made, mode 0700, if missing).
    fn path(&self) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        Ok(self
            .dir
            .join(format!("key-{}", uuid::Uuid::new_v4().simple())))
    }

    /// `dropbearmulti <args> <path>`: its stdout.
    fn dropbear(&self, args: &[&str], path: &Path) -> std::io::Result<Vec<u8>> {
        let mut cmd = std::process::Command::new(&self.dropbearmulti);
        cmd.args(args).arg(path);
        checked(cmd, args[0])
    }
}

impl Drop for KeyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `cmd` (named `what` in errors): its stdout, or its exit with its stderr.
fn checked(mut cmd: std::process::Command, what: &str) -> std::io::Result<Vec<u8>> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(std::io::Error::other(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The runner kernels' keys made ahead: sshd host keys and user keypairs.
pub struct RunnerKeys {
    /// sshd host keys (`config/ssh/dropbear_rsa_host_key`).
    pub host: Arc<Pool<Vec<u8>>>,
    /// User keypairs for kernels whose manager sent none.
    pub user: Arc<Pool<UserKeypair>>,
}

impl RunnerKeys {
    /// Both pools, made with `dropbearmulti`, filling from now.
    pub fn new(dropbearmulti: PathBuf) -> RunnerKeys {
        let dir = KeyDir::new(dropbearmulti);
        let d = dir.clone();
        let host = Pool::new("sshd host keys", HOST_KEYS, move || d.host_key());
        let user = Pool::new("user keypairs", USER_KEYPAIRS, move || dir.user_keypair());
        RunnerKeys { host, user }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runner's `dropbearmulti` (`KV_KRUNNER_DIR`, which `just test-all` sets); `None`
    /// skips the test, said on stderr.
    fn dropbearmulti(test: &str) -> Option<PathBuf> {
        let Some(dir) = std::env::var_os("KV_KRUNNER_DIR") else {
            eprintln!("SKIPPED {test}: KV_KRUNNER_DIR is not set (`just test-all` sets it after `just krunner`)");
            return None;
        };
        let k = crate::agent::runner::Krunner::locate(Path::new(&dir)).expect("the runner");
        Some(k.dropbearmulti())
    }

    /// The public key dropbear reads back from a private key file's bytes (`dropbearkey -y`;
    /// `dropbearconvert openssh dropbear` first for an OpenSSH one): a key dropbear cannot read
    /// fails here.
    fn public_of(db: &Path, key: &[u8], openssh: bool) -> String {
        let dir = tempfile::tempdir().unwrap();
        let mut path = dir.path().join("key");
        std::fs::write(&path, key).unwrap();
        if openssh {
            let converted = dir.path().join("converted");
            let mut c = std::process::Command::new(db);
            c.args(["dropbearconvert", "openssh", "dropbear"])
                .arg(&path)
                .arg(&converted);
            checked(c, "dropbearconvert").unwrap();
            path = converted;
        }
        let mut c = std::process::Command::new(db);
        c.args(["dropbearkey", "-y", "-f"]).arg(&path);
        let out = String::from_utf8(checked(c, "dropbearkey -y").unwrap()).unwrap();
        let line = out.lines().find(|l| l.starts_with("ssh-")).unwrap();
        // Type and key, without the comment (the host's name).
        line.split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn wait_full<T: Send + 'static>(pool: &Pool<T>, size: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while pool.ready() < size {
            assert!(
                std::time::Instant::now() < deadline,
                "the pool did not refill"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn every_kernel_gets_keys_of_its_own_and_the_pools_refill() {
        let test = "every_kernel_gets_keys_of_its_own_and_the_pools_refill";
        let Some(db) = dropbearmulti(test) else {
            return;
        };
        let keys = RunnerKeys::new(db.clone());
        // More than a pool holds: the first made ahead (or now, if the filler is behind), the
        // rest on the spot; each a key dropbear reads, no two alike.
        let hosts: std::collections::HashSet<String> = (0..HOST_KEYS + 2)
            .map(|_| public_of(&db, &keys.host.take().unwrap(), false))
            .collect();
        assert_eq!(
            hosts.len(),
            HOST_KEYS + 2,
            "a host key was handed out twice"
        );
        assert!(hosts.iter().all(|k| k.starts_with("ssh-ed25519 ")));
        let mut users = std::collections::HashSet::new();
        for _ in 0..USER_KEYPAIRS + 1 {
            let pair = keys.user.take().unwrap();
            // The private key (OpenSSH form, as the user downloads it) is the public key's.
            let public: String = pair
                .public_key
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            assert!(public.starts_with("ssh-rsa "), "{public}");
            assert!(pair
                .private_key
                .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"));
            assert_eq!(public_of(&db, pair.private_key.as_bytes(), true), public);
            users.insert(public);
        }
        assert_eq!(
            users.len(),
            USER_KEYPAIRS + 1,
            "a keypair was handed out twice"
        );
        // The fillers put both pools back on their own threads.
        wait_full(&keys.host, HOST_KEYS);
        wait_full(&keys.user, USER_KEYPAIRS);
    }
}
