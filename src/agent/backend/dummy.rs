//! [`DummyBackend`]: containers simulated in memory, for scale tests and for agents on hosts
//! without an engine. Nothing runs: a "container" is a record with a state, and `exec` echoes.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::broadcast;

use super::{
    BackendError, ContainerBackend, ContainerDescription, ContainerExit, ContainerSpec,
    ContainerState, ExecProcess, ExecSession, ExecSpec, ExecStatus, ImageInfo, ImageSummary,
    OutputStream, PullProgress, RegistryAuth,
};
use crate::agent::node::normalize_image;

/// How long each simulated operation takes (all zero by default).
#[derive(Clone, Copy, Debug, Default)]
pub struct DummyDelays {
    /// `pull_image`.
    pub pull: Duration,
    /// `create_container`.
    pub create: Duration,
    /// `start_container` (and the start half of `restart_container`).
    pub start: Duration,
    /// `remove_container`.
    pub remove: Duration,
}

/// An in-memory engine. Every image reference is present unless [`forget_image`]d, but its
/// image list ([`list_images`]) shows only the images it was told it holds ([`hold_image`],
/// `[dummy] images`) and those it pulled or created a container of, as an engine lists what
/// it stored (so agents on it can hold distinct images); containers are created stopped, run once started, and exit only through [`kill`], a terminating
/// signal, a restart or a removal, each of which publishes a [`ContainerExit`] on [`exits`].
///
/// [`forget_image`]: DummyBackend::forget_image
/// [`hold_image`]: DummyBackend::hold_image
/// [`list_images`]: ContainerBackend::list_images
/// [`kill`]: DummyBackend::kill
/// [`exits`]: ContainerBackend::exits
#[derive(Debug)]
pub struct DummyBackend {
    delays: DummyDelays,
    state: Mutex<State>,
    exits: broadcast::Sender<ContainerExit>,
}

#[derive(Debug, Default)]
struct State {
    containers: HashMap<String, Container>,
    missing_images: HashSet<String>,
    /// What `list_images` shows, by the engine's name ([`normalize_image`]).
    held_images: BTreeSet<String>,
    /// Image id → the name it was inspected under: a container created from the id (as the
    /// container stage creates them) stores the image under that name.
    image_names: HashMap<String, String>,
    /// Networks by name, with their labels (`create_local_network`; cluster kernels join one
    /// by name).
    networks: HashMap<String, HashMap<String, String>>,
}

#[derive(Debug)]
struct Container {
    name: String,
    spec: ContainerSpec,
    running: bool,
    exit_code: Option<i64>,
    oom_killed: bool,
}

impl State {
    /// The container with this id or name.
    fn find(&mut self, id: &str) -> Result<(&String, &mut Container), BackendError> {
        self.containers
            .iter_mut()
            .find(|(cid, c)| *cid == id || c.name == id)
            .ok_or_else(|| BackendError::ContainerNotFound(id.to_owned()))
    }
}

impl Container {
    fn state(&self, id: &str) -> ContainerState {
        ContainerState {
            id: id.to_owned(),
            running: self.running,
            exit_code: self.exit_code,
            oom_killed: self.oom_killed,
            labels: self.spec.labels.clone(),
            ports: self.spec.ports.clone(),
            pid: None,
            ip_address: None,
            health: None,
        }
    }

    /// Marks it exited; the event to publish (the labels plus Docker's `exitCode`, `image`
    /// and `name` attributes), or `None` when it was not running.
    fn exit(&mut self, id: &str, exit_code: i64, oom: bool) -> Option<ContainerExit> {
        if !self.running {
            return None;
        }
        (self.running, self.exit_code, self.oom_killed) = (false, Some(exit_code), oom);
        let mut labels = self.spec.labels.clone();
        labels.insert("exitCode".to_owned(), exit_code.to_string());
        labels.insert("image".to_owned(), self.spec.image.clone());
        labels.insert("name".to_owned(), self.name.clone());
        Some(ContainerExit {
            container_id: id.to_owned(),
            labels,
            oom: false,
        })
    }
}

/// The exit code of a process killed by `signal` (`"SIGKILL"`, `"KILL"` or `"9"`);
/// `Some(None)` for a signal the simulated process ignores, `None` for an unknown signal.
fn signal_exit_code(signal: &str) -> Option<Option<i64>> {
    // (name, number, ends the process)
    const SIGNALS: [(&str, i64, bool); 10] = [
        ("HUP", 1, true),
        ("INT", 2, true),
        ("QUIT", 3, true),
        ("KILL", 9, true),
        ("USR1", 10, true),
        ("USR2", 12, false),
        ("TERM", 15, true),
        ("CHLD", 17, false),
        ("CONT", 18, false),
        ("WINCH", 28, false),
    ];
    let name = signal.strip_prefix("SIG").unwrap_or(signal);
    let number = name.parse::<i64>().ok();
    let &(_, n, ends) = SIGNALS
        .iter()
        .find(|&&(s, n, _)| s == name || Some(n) == number)?;
    Some(ends.then_some(128 + n))
}

/// A simulated image id: `sha256:` and a stable hash of the reference (64 hex digits).
fn image_id(reference: &str) -> String {
    let mut h = DefaultHasher::new();
    reference.hash(&mut h);
    let h = h.finish();
    format!("sha256:{h:016x}{h:016x}{h:016x}{h:016x}")
}

/// A Docker-like id: 64 lowercase hex digits.
fn new_id() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl DummyBackend {
    /// An empty engine whose operations take `delays`.
    pub fn new(delays: DummyDelays) -> DummyBackend {
        DummyBackend {
            delays,
            state: Mutex::default(),
            exits: broadcast::channel(1024).0,
        }
    }

    /// Makes `reference` absent and unpullable ([`BackendError::ImageNotFound`] from
    /// `pull_image` and `create_container`).
    pub fn forget_image(&self, reference: &str) {
        let mut state = self.state();
        state.missing_images.insert(reference.to_owned());
        state.held_images.remove(&normalize_image(reference));
    }

    /// Records `reference` as stored in the engine: [`list_images`](ContainerBackend::list_images)
    /// shows it from now on (under the engine's name, [`normalize_image`]).
    pub fn hold_image(&self, reference: &str) {
        self.state().held_images.insert(normalize_image(reference));
    }

    /// Simulates the container's main process exiting with `exit_code` (`oom`: killed by the
    /// OOM killer): marks it exited and publishes the exit. No-op unless it is running.
    pub fn kill(&self, id: &str, exit_code: i64, oom: bool) {
        let exit = self
            .state()
            .find(id)
            .ok()
            .and_then(|(id, c)| c.exit(id, exit_code, oom));
        self.publish(exit);
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, exit: Option<ContainerExit>) {
        if let Some(exit) = exit {
            let _ = self.exits.send(exit); // no subscriber: nobody to tell
        }
    }
}

fn no_filesystem() -> BackendError {
    BackendError::Engine("the dummy backend's containers have no filesystem".into())
}

#[async_trait]
impl ContainerBackend for DummyBackend {
    fn kind(&self) -> &'static str {
        "dummy"
    }

    /// Present unless forgotten; the id is a stable hash of the reference, no labels.
    async fn inspect_image(&self, reference: &str) -> Result<Option<ImageInfo>, BackendError> {
        let mut state = self.state();
        if state.missing_images.contains(reference) {
            return Ok(None);
        }
        let id = image_id(reference);
        state
            .image_names
            .insert(id.clone(), normalize_image(reference));
        Ok(Some(ImageInfo {
            id,
            reference: reference.to_owned(),
            labels: HashMap::new(),
        }))
    }

    /// The held images ([`DummyBackend::hold_image`], pulled, or run), by name; one tag each,
    /// the id as [`inspect_image`](ContainerBackend::inspect_image) gives it, size 0 (nothing
    /// is stored).
    async fn list_images(&self) -> Result<Vec<ImageSummary>, BackendError> {
        Ok(self
            .state()
            .held_images
            .iter()
            .map(|name| ImageSummary {
                id: image_id(name),
                tags: vec![name.clone()],
                size_bytes: 0,
                labels: Default::default(),
            })
            .collect())
    }

    /// Waits `delays.pull`, then reports one `Pull complete` line.
    async fn pull_image(
        &self,
        reference: &str,
        _auth: Option<&RegistryAuth>,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<ImageInfo, BackendError> {
        tokio::time::sleep(self.delays.pull).await;
        let image = self.inspect_image(reference).await?;
        let image = image.ok_or_else(|| BackendError::ImageNotFound(reference.to_owned()))?;
        self.hold_image(reference);
        progress(PullProgress {
            status: "Pull complete".to_owned(),
            ..PullProgress::default()
        });
        Ok(image)
    }

    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, BackendError> {
        tokio::time::sleep(self.delays.create).await;
        let mut state = self.state();
        if state.missing_images.contains(&spec.image) {
            return Err(BackendError::ImageNotFound(spec.image.clone()));
        }
        // A network it names is not checked here: an overlay of a Swarm is not this engine's
        // to list (the container stage checks a bridge network against `inspect_network`).
        let name = (state.image_names.get(&spec.image).cloned())
            .unwrap_or_else(|| normalize_image(&spec.image));
        state.held_images.insert(name);
        let id = new_id();
        let name = if spec.name.is_empty() {
            id[..12].to_owned()
        } else {
            spec.name.clone()
        };
        if state.containers.values().any(|c| c.name == name) {
            return Err(BackendError::Engine(format!(
                "container name {name:?} is already in use"
            )));
        }
        let container = Container {
            name,
            spec: spec.clone(),
            running: false,
            exit_code: None,
            oom_killed: false,
        };
        state.containers.insert(id.clone(), container);
        Ok(id)
    }

    async fn inspect_network(
        &self,
        name: &str,
    ) -> Result<Option<HashMap<String, String>>, BackendError> {
        Ok(self.state().networks.get(name).cloned())
    }

    async fn create_network(
        &self,
        name: &str,
        labels: &HashMap<String, String>,
    ) -> Result<bool, BackendError> {
        let mut state = self.state();
        if state.networks.contains_key(name) {
            return Ok(false);
        }
        state.networks.insert(name.to_owned(), labels.clone());
        Ok(true)
    }

    /// As Docker: refused while a container is attached.
    async fn remove_network(&self, name: &str) -> Result<bool, BackendError> {
        let mut state = self.state();
        let attached = state
            .containers
            .values()
            .any(|c| c.spec.network.as_ref().is_some_and(|n| n.mode == name));
        if attached {
            return Err(BackendError::Engine(format!(
                "network {name} has active endpoints"
            )));
        }
        Ok(state.networks.remove(name).is_some())
    }

    /// Waits `delays.start`; starting a running container is a no-op (as with Docker).
    async fn start_container(&self, id: &str) -> Result<(), BackendError> {
        tokio::time::sleep(self.delays.start).await;
        let mut state = self.state();
        let (_, c) = state.find(id)?;
        if !c.running {
            (c.running, c.exit_code, c.oom_killed) = (true, None, false);
        }
        Ok(())
    }

    async fn inspect_container(&self, id: &str) -> Result<Option<ContainerState>, BackendError> {
        Ok(self.state().find(id).ok().map(|(id, c)| c.state(id)))
    }

    async fn describe_container(
        &self,
        id: &str,
    ) -> Result<Option<ContainerDescription>, BackendError> {
        Ok(self
            .state()
            .find(id)
            .ok()
            .map(|(id, c)| ContainerDescription {
                id: id.clone(),
                running: c.running,
                spec: ContainerSpec {
                    name: c.name.clone(),
                    ..c.spec.clone()
                },
            }))
    }

    /// Waits `delays.remove`; a running container exits with 137 first (as with Docker).
    async fn remove_container(&self, id: &str) -> Result<(), BackendError> {
        tokio::time::sleep(self.delays.remove).await;
        let exit = {
            let mut state = self.state();
            let Ok((id, _)) = state.find(id) else {
                return Ok(());
            };
            let id = id.clone();
            let mut c = state.containers.remove(&id).expect("found above");
            c.exit(&id, 137, false)
        };
        self.publish(exit);
        Ok(())
    }

    /// A running container exits with 143 (stopped by SIGTERM), then runs again after
    /// `delays.start`.
    async fn restart_container(&self, id: &str, _timeout: Duration) -> Result<(), BackendError> {
        let exit = {
            let mut state = self.state();
            let (id, c) = state.find(id)?;
            c.exit(id, 143, false)
        };
        self.publish(exit);
        self.start_container(id).await
    }

    /// `HUP`, `INT`, `QUIT`, `KILL`, `USR1` and `TERM` end the container (exit 128 + signal
    /// number); `USR2`, `CHLD`, `CONT` and `WINCH` are ignored; others are an `Engine` error,
    /// as is signalling a container that is not running.
    async fn signal_container(&self, id: &str, signal: &str) -> Result<(), BackendError> {
        let exit = {
            let mut state = self.state();
            let (id, c) = state.find(id)?;
            if !c.running {
                return Err(BackendError::Engine(format!(
                    "container {id} is not running"
                )));
            }
            match signal_exit_code(signal) {
                None => return Err(BackendError::Engine(format!("invalid signal: {signal}"))),
                Some(None) => None,
                Some(Some(code)) => c.exit(id, code, false),
            }
        };
        self.publish(exit);
        Ok(())
    }

    async fn list_containers(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<ContainerState>, BackendError> {
        let state = self.state();
        Ok(state
            .containers
            .iter()
            .filter(|(_, c)| c.spec.labels.get(key).is_some_and(|v| v == value))
            .map(|(id, c)| c.state(id))
            .collect())
    }

    /// A simulation: exits 0 at once, its stdout the last element of `cmd` (the code, for
    /// `[runtime, "-c", code]`) plus a newline, in one chunk (its exec id is `dummy-exec`, always
    /// finished with exit code 0). No stdin. `Engine` error when the container is not running,
    /// `cmd` is empty, or a terminal is asked for (nothing runs that could use one).
    async fn exec_start(&self, id: &str, spec: ExecSpec) -> Result<ExecSession, BackendError> {
        if spec.tty.is_some() {
            return Err(BackendError::Engine(
                "the dummy engine has no terminals".to_owned(),
            ));
        }
        let cmd = spec.cmd;
        let mut state = self.state();
        let (id, c) = state.find(id)?;
        if !c.running {
            return Err(BackendError::Engine(format!(
                "container {id} is not running"
            )));
        }
        let last = cmd
            .last()
            .ok_or_else(|| BackendError::Engine("no exec command specified".to_owned()))?;
        let chunk = Ok((
            OutputStream::Stdout,
            bytes::Bytes::from(format!("{last}\n")),
        ));
        Ok(ExecSession {
            exec_id: "dummy-exec".into(),
            output: stream::iter([chunk]).boxed(),
            stdin: None,
        })
    }

    async fn exec_status(&self, _exec_id: &str) -> Result<ExecStatus, BackendError> {
        Ok(ExecStatus {
            running: false,
            exit_code: Some(0),
        })
    }

    async fn exec_kill(&self, _exec_id: &str) -> Result<(), BackendError> {
        Ok(())
    }

    /// None: simulated execs end at once.
    async fn exec_processes(&self, id: &str) -> Result<Vec<ExecProcess>, BackendError> {
        self.state().find(id)?;
        Ok(Vec::new())
    }

    /// Refused: a simulated container has no filesystem.
    fn archive_get(
        &self,
        _id: &str,
        _path: &str,
    ) -> BoxStream<'static, Result<bytes::Bytes, BackendError>> {
        stream::iter([Err(no_filesystem())]).boxed()
    }

    /// Refused: a simulated container has no filesystem.
    async fn archive_put(
        &self,
        _id: &str,
        _dir: &str,
        _tar: BoxStream<'static, bytes::Bytes>,
    ) -> Result<(), BackendError> {
        Err(no_filesystem())
    }

    /// Empty: nothing runs.
    fn follow_logs(
        &self,
        _id: &str,
        _since: i64,
    ) -> BoxStream<'static, Result<bytes::Bytes, BackendError>> {
        stream::empty().boxed()
    }

    /// Forgets the image (as [`DummyBackend::forget_image`]); refused without `force` while
    /// a container was created from that reference (Docker's conflict message).
    async fn remove_image(
        &self,
        reference: &str,
        force: bool,
        _noprune: bool,
    ) -> Result<Vec<String>, BackendError> {
        let Some(image) = self.inspect_image(reference).await? else {
            return Err(BackendError::ImageNotFound(format!(
                "{reference}: no such local image"
            )));
        };
        let mut state = self.state();
        let user = state
            .containers
            .iter()
            .find(|(_, c)| c.spec.image == reference || c.spec.image == image.id);
        if let (Some((id, _)), false) = (user, force) {
            return Err(BackendError::Engine(format!(
                "conflict: unable to remove repository reference \"{reference}\" (must force) - container {} is using its referenced image {}",
                &id[..12],
                &image.id["sha256:".len()..][..12]
            )));
        }
        state.missing_images.insert(reference.to_owned());
        Ok(vec![
            format!("Untagged: {reference}"),
            format!("Deleted: {}", image.id),
        ])
    }

    /// Makes `reference` present (its labels are not kept: `inspect_image` has none).
    async fn commit_container(
        &self,
        id: &str,
        reference: &str,
        labels: &HashMap<String, String>,
    ) -> Result<ImageInfo, BackendError> {
        {
            let mut state = self.state();
            state.find(id)?;
            state.missing_images.remove(reference);
        }
        let image = self.inspect_image(reference).await?;
        let image = image.ok_or_else(|| BackendError::ImageNotFound(reference.to_owned()))?;
        Ok(ImageInfo {
            labels: labels.clone(),
            ..image
        })
    }

    /// Waits `delays.pull`, then reports one `Pushed` line of 1 byte.
    async fn push_image(
        &self,
        reference: &str,
        _auth: Option<&RegistryAuth>,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<(), BackendError> {
        if self.inspect_image(reference).await?.is_none() {
            return Err(BackendError::ImageNotFound(format!(
                "{reference}: no such local image"
            )));
        }
        tokio::time::sleep(self.delays.pull).await;
        progress(PullProgress {
            status: "Pushed".to_owned(),
            current: Some(1),
            total: Some(1),
            ..PullProgress::default()
        });
        Ok(())
    }

    /// Exits published after this call. When the subscriber falls more than 1024 exits
    /// behind, it gets one `Engine` error and the stream ends.
    fn exits(
        &self,
        key: &str,
        value: &str,
    ) -> BoxStream<'static, Result<ContainerExit, BackendError>> {
        let (key, value) = (key.to_owned(), value.to_owned());
        stream::unfold(Some(self.exits.subscribe()), move |rx| {
            let (key, value) = (key.clone(), value.clone());
            async move {
                let mut rx = rx?;
                loop {
                    match rx.recv().await {
                        Ok(exit) if exit.labels.get(&key) == Some(&value) => {
                            return Some((Ok(exit), Some(rx)))
                        }
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            let e =
                                BackendError::Engine(format!("exit stream lagged by {n} events"));
                            return Some((Err(e), None));
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        })
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::super::labels;
    use super::*;

    fn cmd(argv: &[&str]) -> ExecSpec {
        ExecSpec {
            cmd: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn spec(name: &str, kernel: &str) -> ContainerSpec {
        ContainerSpec {
            name: name.to_owned(),
            image: "python:3.12".to_owned(),
            labels: HashMap::from([
                (labels::AGENT_ID.to_owned(), "agent-1".to_owned()),
                (labels::KERNEL_ID.to_owned(), kernel.to_owned()),
            ]),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn create_start_list_inspect() {
        let b = DummyBackend::new(DummyDelays::default());
        let id = b.create_container(&spec("k1", "kernel-1")).await.unwrap();
        assert_eq!(id.len(), 64);
        let state = b.inspect_container(&id).await.unwrap().unwrap();
        assert!(!state.running && state.exit_code.is_none());
        assert!(
            b.create_container(&spec("k1", "kernel-x")).await.is_err(),
            "name in use"
        );

        b.start_container(&id).await.unwrap();
        b.start_container("k1").await.unwrap(); // by name; already running
        assert!(b.inspect_container(&id).await.unwrap().unwrap().running);

        b.create_container(&spec("k2", "kernel-2")).await.unwrap();
        assert_eq!(
            b.list_containers(labels::AGENT_ID, "agent-1")
                .await
                .unwrap()
                .len(),
            2
        );
        let listed = b
            .list_containers(labels::KERNEL_ID, "kernel-1")
            .await
            .unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, id);
        assert!(listed[0].running);
        assert!(b
            .list_containers(labels::AGENT_ID, "agent-2")
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            b.start_container("nope").await,
            Err(BackendError::ContainerNotFound(_))
        ));
    }

    #[tokio::test]
    async fn lists_only_the_images_it_holds() {
        let b = DummyBackend::new(DummyDelays::default());
        assert!(b.list_images().await.unwrap().is_empty());
        b.hold_image("docker.io/library/python");
        b.hold_image("python:latest");
        b.hold_image("cr.example.com/team/cuda:12");
        // Present to `inspect_image` (every image is), yet not stored.
        assert!(b.inspect_image("other:1").await.unwrap().is_some());
        let tags = |v: Vec<ImageSummary>| v.into_iter().flat_map(|i| i.tags).collect::<Vec<_>>();
        assert_eq!(
            tags(b.list_images().await.unwrap()),
            ["cr.example.com/team/cuda:12", "python:latest"]
        );
        // A container of an image (by reference, or by the id inspecting it gave) stores it; a
        // forgotten image is gone.
        b.create_container(&ContainerSpec {
            image: "busybox".into(),
            ..spec("k", "x")
        })
        .await
        .unwrap();
        let alpine = b.inspect_image("alpine:3").await.unwrap().unwrap();
        assert_eq!(
            tags(b.list_images().await.unwrap()).len(),
            3,
            "inspected only"
        );
        b.create_container(&ContainerSpec {
            image: alpine.id,
            ..spec("k2", "y")
        })
        .await
        .unwrap();
        b.forget_image("python:latest");
        let listed = b.list_images().await.unwrap();
        assert_eq!(
            tags(listed.clone()),
            ["alpine:3", "busybox:latest", "cr.example.com/team/cuda:12"]
        );
        assert!(listed
            .iter()
            .all(|i| i.id.starts_with("sha256:") && i.id.len() == 71));
    }

    #[tokio::test]
    async fn images_and_exec() {
        let b = DummyBackend::new(DummyDelays::default());
        let lines = Mutex::new(Vec::new());
        let image = b
            .pull_image("python:3.12", None, &|p| {
                lines.lock().unwrap().push(p.status)
            })
            .await
            .unwrap();
        assert!(image.id.starts_with("sha256:"));
        assert_eq!(lines.into_inner().unwrap(), ["Pull complete"]);

        b.forget_image("gone:1");
        assert!(b.inspect_image("gone:1").await.unwrap().is_none());
        assert!(matches!(
            b.pull_image("gone:1", None, &|_| {}).await,
            Err(BackendError::ImageNotFound(_))
        ));
        let missing = ContainerSpec {
            image: "gone:1".into(),
            ..spec("k", "x")
        };
        assert!(matches!(
            b.create_container(&missing).await,
            Err(BackendError::ImageNotFound(_))
        ));

        let id = b.create_container(&spec("k", "kernel-k")).await.unwrap();
        assert!(
            b.exec_start(&id, cmd(&["sh"])).await.is_err(),
            "not running"
        );
        b.start_container(&id).await.unwrap();
        let session = b
            .exec_start(&id, cmd(&["python", "-c", "print(1)"]))
            .await
            .unwrap();
        let chunks: Vec<_> = session.output.map(Result::unwrap).collect().await;
        assert_eq!(
            chunks,
            vec![(OutputStream::Stdout, bytes::Bytes::from("print(1)\n"))]
        );
        assert_eq!(
            b.exec_status(&session.exec_id).await.unwrap(),
            ExecStatus {
                running: false,
                exit_code: Some(0)
            }
        );
        let tty = ExecSpec {
            tty: Some(crate::agent::backend::TtySize { rows: 24, cols: 80 }),
            ..cmd(&["sh"])
        };
        assert!(b.exec_start(&id, tty).await.is_err(), "no terminals");
        assert!(b
            .exec_resize(
                "dummy-exec",
                crate::agent::backend::TtySize { rows: 1, cols: 1 }
            )
            .await
            .is_err());
    }

    #[tokio::test]
    async fn exits_are_published_and_filtered() {
        let b = DummyBackend::new(DummyDelays::default());
        let mut exits = b.exits(labels::KERNEL_ID, "kernel-1");
        let id1 = b.create_container(&spec("k1", "kernel-1")).await.unwrap();
        let id2 = b.create_container(&spec("k2", "kernel-2")).await.unwrap();
        b.kill(&id1, 1, false); // not running: no exit
        for id in [&id1, &id2] {
            b.start_container(id).await.unwrap();
        }
        b.kill(&id2, 1, false); // other label
        b.kill(&id1, 137, true);
        let exit = exits.next().await.unwrap().unwrap();
        assert_eq!(exit.container_id, id1);
        assert_eq!(exit.labels[labels::KERNEL_ID], "kernel-1");
        assert_eq!(exit.labels["exitCode"], "137");
        let state = b.inspect_container(&id1).await.unwrap().unwrap();
        assert!(!state.running && state.oom_killed && state.exit_code == Some(137));

        b.start_container(&id1).await.unwrap();
        b.signal_container(&id1, "SIGWINCH").await.unwrap(); // ignored
        assert!(b.signal_container(&id1, "SIGBOGUS").await.is_err());
        b.signal_container(&id1, "SIGINT").await.unwrap();
        assert_eq!(
            exits.next().await.unwrap().unwrap().labels["exitCode"],
            "130"
        );
        assert!(
            b.signal_container(&id1, "SIGKILL").await.is_err(),
            "not running"
        );
    }

    #[tokio::test]
    async fn remove_is_idempotent() {
        let b = DummyBackend::new(DummyDelays {
            remove: Duration::from_millis(5),
            ..Default::default()
        });
        let mut exits = b.exits(labels::AGENT_ID, "agent-1");
        let id = b.create_container(&spec("k1", "kernel-1")).await.unwrap();
        b.start_container(&id).await.unwrap();
        b.remove_container(&id).await.unwrap();
        assert_eq!(
            exits.next().await.unwrap().unwrap().labels["exitCode"],
            "137"
        );
        b.remove_container(&id).await.unwrap();
        assert!(b.inspect_container(&id).await.unwrap().is_none());
        assert!(b
            .list_containers(labels::AGENT_ID, "agent-1")
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            b.exec_start(&id, cmd(&["true"])).await,
            Err(BackendError::ContainerNotFound(_))
        ));
        // The name is free again.
        b.create_container(&spec("k1", "kernel-1")).await.unwrap();
    }

    #[tokio::test]
    async fn images_are_removed_committed_and_pushed() {
        let b = DummyBackend::new(DummyDelays::default());
        let id = b.create_container(&spec("k1", "kernel-1")).await.unwrap();
        let e = b
            .remove_image("python:3.12", false, false)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("must force"), "{e}");
        let image = b
            .commit_container(
                &id,
                "r.io/saved:1",
                &HashMap::from([("a".into(), "b".into())]),
            )
            .await
            .unwrap();
        assert_eq!(image.labels["a"], "b");
        let lines = Mutex::new(Vec::new());
        b.push_image("r.io/saved:1", None, &|p| {
            lines.lock().unwrap().push(p.status)
        })
        .await
        .unwrap();
        assert_eq!(lines.into_inner().unwrap(), ["Pushed"]);
        let steps = b.remove_image("r.io/saved:1", false, false).await.unwrap();
        assert_eq!(steps[0], "Untagged: r.io/saved:1");
        assert!(b.inspect_image("r.io/saved:1").await.unwrap().is_none());
        assert!(matches!(
            b.remove_image("r.io/saved:1", false, false).await,
            Err(BackendError::ImageNotFound(_))
        ));
        assert!(matches!(
            b.push_image("r.io/saved:1", None, &|_| {}).await,
            Err(BackendError::ImageNotFound(_))
        ));
        // With force, an image a container uses goes (its tag, as with Docker).
        b.remove_image("python:3.12", true, false).await.unwrap();
    }
}
