//! A real container registry for the image tests: Debian's `docker-registry` (the CNCF
//! distribution registry 2.8; `just registry` installs it, its path from `KV_REGISTRY_SERVER`)
//! on a free loopback port, its own storage in a temp dir, basic auth from an htpasswd file
//! (bcrypt, made by `htpasswd` of Debian's `apache2-utils`, `KV_HTPASSWD`). The engine talks
//! plain HTTP to it: Docker treats registries on 127.0.0.0/8 as insecure without any setting.
//!
//! Images are pushed into it by the tests themselves ([`TestRegistry::push`], bollard with the
//! registry's credentials: nothing is written to `~/.docker/config.json`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bollard::auth::DockerCredentials;
use bollard::image::{PushImageOptions, TagImageOptions};
use futures::StreamExt;

use super::agent::free_port;
use super::bai::KillOnDrop;

/// The user and password every test registry admits.
pub const USER: &str = "kv";
/// See [`USER`].
pub const PASSWORD: &str = "kv-registry-secret";

/// A running registry; stopped (and its storage removed) on drop.
pub struct TestRegistry {
    /// `127.0.0.1:PORT`: the host part of image references in it.
    pub host: String,
    dir: tempfile::TempDir,
    child: Option<KillOnDrop>,
}

fn tool(var: &str, default: &str, package: &str) -> PathBuf {
    let bin = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    let runs = Command::new(&bin)
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        runs,
        "{} does not run: install it with `just registry` (Debian's {package}), or name it with {var}",
        bin.display()
    );
    bin
}

impl TestRegistry {
    /// Starts a registry with basic auth ([`USER`], [`PASSWORD`]) and waits until it answers.
    pub fn start() -> TestRegistry {
        let dir = tempfile::Builder::new()
            .prefix("kv-registry-")
            .tempdir()
            .unwrap();
        let htpasswd = Command::new(tool("KV_HTPASSWD", "htpasswd", "apache2-utils"))
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .expect("htpasswd");
        assert!(htpasswd.status.success(), "htpasswd failed");
        std::fs::write(dir.path().join("htpasswd"), &htpasswd.stdout).unwrap();
        let mut r = TestRegistry {
            host: format!("127.0.0.1:{}", free_port()),
            dir,
            child: None,
        };
        let config = format!(
            "version: 0.1\nlog: {{level: warn}}\n\
             storage: {{filesystem: {{rootdirectory: {root}/data}}, delete: {{enabled: true}}}}\n\
             http: {{addr: {host}, secret: kv-test}}\n\
             auth: {{htpasswd: {{realm: kv-test, path: {root}/htpasswd}}}}\n",
            root = r.dir.path().display(),
            host = r.host,
        );
        std::fs::write(r.dir.path().join("config.yml"), config).unwrap();
        r.up();
        r
    }

    /// Starts the registry process again (same port and storage) after [`TestRegistry::stop`].
    pub fn up(&mut self) {
        assert!(self.child.is_none(), "registry already running");
        let log = std::fs::File::create(self.dir.path().join("registry.log")).unwrap();
        let child = Command::new(tool(
            "KV_REGISTRY_SERVER",
            "docker-registry",
            "docker-registry",
        ))
        .arg("serve")
        .arg(self.dir.path().join("config.yml"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start docker-registry");
        self.child = Some(KillOnDrop(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&self.host).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not listen on {} within 20 s: {}",
                self.host,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the registry process (its storage stays).
    pub fn stop(&mut self) {
        self.child = None;
    }

    /// The registry's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// `http://127.0.0.1:PORT`: the URL a manager's `[[registry]]` names.
    pub fn url(&self) -> String {
        format!("http://{}", self.host)
    }

    /// The credentials the registry admits.
    pub fn credentials(&self) -> DockerCredentials {
        DockerCredentials {
            username: Some(USER.into()),
            password: Some(PASSWORD.into()),
            serveraddress: Some(self.host.clone()),
            ..DockerCredentials::default()
        }
    }

    /// An image of its own (a layer of `blob_bytes` random bytes at `/blob` on top of `base`,
    /// so the engine has none of it cached once the local tag is gone), pushed as
    /// `<host>/<repo>:<tag>` ([`TestRegistry::push`]). Returns the full reference.
    pub async fn push_unique(
        &self,
        base: &str,
        repo: &str,
        tag: &str,
        blob_bytes: usize,
    ) -> String {
        let name = format!("kv-unique-{}", super::agent::run_id());
        let run = Command::new("docker")
            .args(["run", "--name", &name, base, "sh", "-c"])
            .arg(format!("head -c {blob_bytes} /dev/urandom > /blob"))
            .output()
            .expect("docker run");
        assert!(run.status.success(), "docker run: {run:?}");
        // The base's command again (a commit keeps the one the container ran).
        let cmd = Command::new("docker")
            .args(["image", "inspect", "-f", "{{json .Config.Cmd}}", base])
            .output()
            .expect("docker image inspect");
        let cmd = String::from_utf8_lossy(&cmd.stdout).trim().to_owned();
        let local = format!("kv-unique:{name}");
        let commit = Command::new("docker")
            .args(["commit", "--change", &format!("CMD {cmd}"), &name, &local])
            .output()
            .expect("docker commit");
        let _ = Command::new("docker").args(["rm", "-f", &name]).output();
        assert!(commit.status.success(), "docker commit: {commit:?}");
        let reference = self.push(&local, repo, tag).await;
        let _ = Command::new("docker").args(["rmi", &local]).output();
        reference
    }

    /// Tags the local image `local` as `<host>/<repo>:<tag>`, pushes it with the registry's
    /// credentials, then removes that tag from the engine (the registry holds the only copy
    /// under that name). Returns the full reference.
    pub async fn push(&self, local: &str, repo: &str, tag: &str) -> String {
        let docker = bollard::Docker::connect_with_local_defaults().unwrap();
        let name = format!("{}/{repo}", self.host);
        docker
            .tag_image(
                local,
                Some(TagImageOptions {
                    repo: name.as_str(),
                    tag,
                }),
            )
            .await
            .expect("tag");
        let mut push = docker.push_image(
            &name,
            Some(PushImageOptions { tag }),
            Some(self.credentials()),
        );
        while let Some(step) = push.next().await {
            let step = step.expect("push");
            assert!(step.error.is_none(), "push {name}:{tag}: {:?}", step.error);
        }
        let reference = format!("{name}:{tag}");
        docker
            .remove_image(&reference, None, None)
            .await
            .expect("untag");
        reference
    }
}
