//! Private Docker engines the tests start themselves, and two of them joined in a Docker Swarm.
//!
//! [`PrivateEngine`]: its own containerd and dockerd under a temp dir (socket, data and exec
//! roots, pid file), the test images copied in from the main engine (`docker save | docker load`:
//! no registry is reachable). `tests/it/engine_restart.rs` SIGKILLs and restarts one.
//!
//! [`Swarm`]: two private engines, each in a network namespace of its own on one private
//! bridge, joined in a Swarm (the first engine is the manager, the second a worker), for
//! Backend.AI's multi-node cluster sessions: the manager's `OverlayNetworkPlugin`
//! (`manager/network/overlay.py`) creates an attachable overlay `bai-multinode-<session id>` on
//! a Swarm manager and the agents' containers join it (`tests/it/swarm_overlay.rs`,
//! `docs/scenarios.md`, "Two engines in a Swarm").
//!
//! Both need root, `dockerd`, `containerd` and `docker` (Debian's `docker.io`; `just docker`
//! installs it) and the test image on the main engine (`just test-image`); the Swarm also needs
//! `ip` (iproute2) and a kernel with VXLAN. Every check fails with a message naming what is
//! missing. Dropping either removes everything it made, also when the test failed.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::agent::{docker, read, TEST_IMAGE};

/// How a private engine's daemons are networked.
#[derive(Clone, Debug)]
pub enum EngineNetwork {
    /// Each dockerd start `unshare`s a fresh, empty network namespace (containerd stays in the
    /// host's); dockerd runs `--bridge=none --iptables=false`: its containers have no network.
    /// Why a namespace at all: a dockerd with `--bridge=none` deletes the host's `docker0` at
    /// start, which would cut the main engine's containers off their network.
    Isolated,
    /// Both daemons enter the named namespace (`/run/netns/<name>`, made by `ip netns add`) and
    /// a UTS namespace with `hostname` (the Swarm node's name); dockerd runs with its default
    /// bridge and `--iptables` (Swarm's overlay driver and published ports need them), all of
    /// which live in that namespace, never in the host's. The mount namespace stays the host's:
    /// runc, started by containerd's shims, opens the network namespace files dockerd
    /// bind-mounts under its exec root, so both must see the same mounts.
    Namespace { netns: String, hostname: String },
}

/// What a private engine is started with.
#[derive(Clone, Debug)]
pub struct EngineSpec {
    /// dockerd's `--live-restore`.
    pub live_restore: bool,
    pub network: EngineNetwork,
}

/// A private Docker engine: its own containerd and dockerd under a temp dir. Dropping it
/// removes its containers, stops both daemons, kills any shim left, unmounts what the daemons
/// mounted under the dir and removes it, also when the test failed.
pub struct PrivateEngine {
    dir: tempfile::TempDir,
    containerd: Option<Child>,
    dockerd: Option<Child>,
    spec: EngineSpec,
}

/// Whether `tool --version` runs.
fn has_tool(tool: &str, version_arg: &str) -> bool {
    Command::new(tool)
        .arg(version_arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Panics with what is missing unless this runs as root with dockerd, containerd and the docker
/// CLI installed and `images` on the main engine.
pub fn require_engine_tools(images: &[&str]) {
    // SAFETY: geteuid(2) has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "a private Docker engine (tests/common/engines.rs) starts its own dockerd and containerd: \
         run the test as root"
    );
    for tool in ["dockerd", "containerd", "docker"] {
        assert!(
            has_tool(tool, "--version"),
            "`{tool}` not found: install Debian's docker.io (`just docker` does)"
        );
    }
    for image in images {
        assert!(
            !docker(&["image", "inspect", "-f", "{{.Id}}", image]).is_empty(),
            "{image} is not on the main engine: run `just test-image`"
        );
    }
}

/// `docker save`s `images` from the main engine into `<dir>/images.tar`; returns its path.
fn save_images(dir: &Path, images: &[&str]) -> PathBuf {
    let tar = dir.join("images.tar");
    let out = Command::new("docker")
        .arg("save")
        .arg("-o")
        .arg(&tar)
        .args(images)
        .output()
        .expect("docker CLI");
    assert!(
        out.status.success(),
        "docker save {images:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    tar
}

impl PrivateEngine {
    /// Starts containerd and dockerd as `spec` says and copies the test image into it.
    pub fn start(spec: EngineSpec) -> PrivateEngine {
        require_engine_tools(&[TEST_IMAGE]);
        let engine = PrivateEngine::start_bare(spec);
        let tar = save_images(engine.dir.path(), &[TEST_IMAGE]);
        engine.load(&tar);
        engine
    }

    /// Starts containerd and dockerd as `spec` says, with no image.
    pub fn start_bare(spec: EngineSpec) -> PrivateEngine {
        // Short: the daemons' sockets live under it (at most 108 bytes a path).
        let dir = tempfile::Builder::new()
            .prefix("kv-eng-")
            .tempdir_in("/tmp")
            .unwrap();
        let d = dir.path().display();
        std::fs::create_dir_all(dir.path().join("containerd")).unwrap();
        std::fs::write(
            dir.path().join("containerd.toml"),
            format!(
                "version = 2\nroot = \"{d}/containerd/root\"\nstate = \"{d}/containerd/state\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{d}/containerd/containerd.sock\"\n\
                 [ttrpc]\n  address = \"{d}/containerd/containerd.sock.ttrpc\"\n\
                 [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{d}/containerd/opt\"\n"
            ),
        )
        .unwrap();
        // Its own (empty) daemon.json: the host's may name another data-root or storage driver.
        std::fs::write(dir.path().join("daemon.json"), "{}\n").unwrap();
        let mut engine = PrivateEngine {
            dir,
            containerd: None,
            dockerd: None,
            spec,
        };
        let (out, err) = engine.log("containerd.log");
        let mut cmd = Command::new("containerd");
        cmd.arg("--config")
            .arg(engine.path("containerd.toml"))
            .args(["--log-level", "warn"])
            .stdout(out)
            .stderr(err);
        if let EngineNetwork::Namespace { netns, .. } = &engine.spec.network {
            enter_netns(&mut cmd, netns, None);
        }
        engine.containerd = Some(cmd.spawn().expect("spawn containerd"));
        let sock = engine.path("containerd/containerd.sock");
        let start = Instant::now();
        while !sock.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "containerd did not come up; log:\n{}",
                read(&engine.path("containerd.log"))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        engine.start_dockerd();
        engine
    }

    /// Loads an image archive (`docker save`'s) into this engine.
    pub fn load(&self, tar: &Path) {
        let out = Command::new("docker")
            .arg("-H")
            .arg(self.host())
            .arg("load")
            .arg("-q")
            .arg("-i")
            .arg(tar)
            .output()
            .expect("docker CLI");
        assert!(
            out.status.success(),
            "cannot load {} into the private engine: {}",
            tar.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The engine's temp dir (daemons' configs, logs, sockets, roots).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An append-mode log file under the dir, as stdout and stderr.
    fn log(&self, name: &str) -> (Stdio, Stdio) {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(name))
            .unwrap();
        (Stdio::from(f.try_clone().unwrap()), Stdio::from(f))
    }

    /// `unix://<dir>/docker.sock`: an agent's `[container] docker-host`. The socket is a file,
    /// so a process in any network namespace reaches it.
    pub fn host(&self) -> String {
        format!("unix://{}", self.path("docker.sock").display())
    }

    /// The docker CLI against this engine; stdout trimmed (empty on failure).
    pub fn docker(&self, args: &[&str]) -> String {
        self.try_docker(args).unwrap_or_default()
    }

    /// The docker CLI against this engine: stdout trimmed, or stderr when it failed.
    pub fn try_docker(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("docker")
            .arg("-H")
            .arg(self.host())
            .args(args)
            .output()
            .expect("docker CLI");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// The docker CLI against this engine, panicking with its error and `what` when it fails.
    pub fn must_docker(&self, what: &str, args: &[&str]) -> String {
        self.try_docker(args).unwrap_or_else(|e| {
            panic!(
                "{what}: `docker {}` failed: {e}; dockerd log tail:\n{}",
                args.join(" "),
                tail(&self.path("dockerd.log"), 30)
            )
        })
    }

    pub fn answers(&self) -> bool {
        Command::new("docker")
            .arg("-H")
            .arg(self.host())
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts dockerd with the same flags every time; waits until it answers.
    pub fn start_dockerd(&mut self) {
        assert!(self.dockerd.is_none(), "dockerd already runs");
        let (out, err) = self.log("dockerd.log");
        let mut cmd = Command::new("dockerd");
        cmd.arg("--config-file")
            .arg(self.path("daemon.json"))
            .arg("--containerd")
            .arg(self.path("containerd/containerd.sock"))
            .arg("--host")
            .arg(self.host())
            .arg("--data-root")
            .arg(self.path("data"))
            .arg("--exec-root")
            .arg(self.path("exec"))
            .arg("--pidfile")
            .arg(self.path("docker.pid"))
            // vfs: works on any filesystem (no overlay-on-overlay), nothing mounted per layer.
            .args(["--storage-driver=vfs", "--log-level=warn"]);
        if self.spec.live_restore {
            cmd.arg("--live-restore");
        }
        match &self.spec.network {
            EngineNetwork::Isolated => {
                cmd.args(["--bridge=none", "--iptables=false", "--ip6tables=false"]);
                // SAFETY: unshare(2) only, between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::unshare(libc::CLONE_NEWNET) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            EngineNetwork::Namespace { netns, hostname } => {
                cmd.arg("--iptables=true");
                enter_netns(&mut cmd, netns, Some(hostname));
            }
        }
        self.dockerd = Some(cmd.stdout(out).stderr(err).spawn().expect("spawn dockerd"));
        let start = Instant::now();
        while !self.answers() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "dockerd did not come up; log:\n{}",
                read(&self.path("dockerd.log"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs dockerd (only dockerd: containerd and the shims live on) and reaps it.
    pub fn kill_dockerd(&mut self) {
        let mut child = self.dockerd.take().expect("dockerd runs");
        child.kill().unwrap();
        child.wait().unwrap();
        // A SIGKILLed dockerd leaves its pid file, which would stop the next start.
        let _ = std::fs::remove_file(self.path("docker.pid"));
    }

    /// Sends `signal` to dockerd.
    pub fn signal_dockerd(&self, signal: i32) {
        let pid = self.dockerd.as_ref().expect("dockerd runs").id();
        // SAFETY: signalling our own child process by pid.
        unsafe { libc::kill(pid as i32, signal) };
    }

    /// Container ids (running or not) carrying `agent_id`'s label.
    pub fn containers(&self, agent_id: &str, running_only: bool) -> Vec<String> {
        let label = format!("label=ai.backend.agent-id={agent_id}");
        let mut args = vec!["ps", "-q", "--no-trunc", "--filter", &label];
        if !running_only {
            args.push("-a");
        }
        let mut ids: Vec<String> = self.docker(&args).lines().map(str::to_owned).collect();
        ids.sort();
        ids
    }
}

/// Makes `cmd` enter network namespace `netns` (`/run/netns/<netns>`) and, with `hostname`, a
/// UTS namespace of its own with that host name, between fork and exec.
pub fn enter_netns(cmd: &mut Command, netns: &str, hostname: Option<&str>) {
    let path = std::ffi::CString::new(format!("/run/netns/{netns}")).unwrap();
    let hostname = hostname.map(|h| h.as_bytes().to_vec());
    // SAFETY: open(2), setns(2), unshare(2), sethostname(2) and close(2) only, between fork and
    // exec, on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let entered = libc::setns(fd, libc::CLONE_NEWNET);
            libc::close(fd);
            if entered != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(h) = &hostname {
                if libc::unshare(libc::CLONE_NEWUTS) != 0
                    || libc::sethostname(h.as_ptr().cast(), h.len()) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = read(path);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether the host has a `docker0` interface (the main engine's bridge).
pub fn host_has_docker0() -> bool {
    Path::new("/sys/class/net/docker0").exists()
}

/// SIGTERM, then SIGKILL after `grace`; reaps it.
pub fn stop(child: &mut Child, grace: Duration) {
    // SAFETY: signalling our own child process by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Pids whose command line contains `needle`, with every descendant of each.
pub fn process_trees(needle: &str) -> Vec<i32> {
    let mut parents = Vec::new();
    let mut roots = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .contains(needle)
        {
            roots.push(pid);
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
        {
            parents.push((pid, ppid));
        }
    }
    let mut tree = roots;
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        if self.dockerd.is_some() {
            self.signal_dockerd(libc::SIGCONT);
        }
        if self.dockerd.is_some() && self.answers() {
            let ids = self.docker(&["ps", "-aq"]);
            let ids: Vec<&str> = ids.lines().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f"];
                args.extend(ids);
                self.docker(&args);
            }
        }
        if let Some(mut d) = self.dockerd.take() {
            stop(&mut d, Duration::from_secs(15));
        }
        if let Some(mut c) = self.containerd.take() {
            stop(&mut c, Duration::from_secs(10));
        }
        // Shims (and their containers) of a failed run: found by our containerd's address.
        let address = self.path("containerd/containerd.sock");
        for pid in process_trees(&format!("-address {}", address.display())) {
            // SAFETY: kill(2) on processes this test's containerd started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        unmount_under(self.dir.path());
    }
}

/// Mount points under `dir` (this process's view, the host's mount namespace).
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|p| p.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Lazily unmounts everything mounted under `dir`, deepest first (the daemons' bind of the
/// data root onto itself, network namespaces, containers' shm).
pub fn unmount_under(dir: &Path) {
    let mut points = mounts_under(dir);
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let c = std::ffi::CString::new(p).unwrap();
        // SAFETY: umount2(2) with a valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// `ip <args>`, panicking with its error and `what` when it fails.
fn ip(what: &str, args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("`ip` (iproute2) not runnable ({e}): install iproute2 for the Swarm fixture")
    });
    assert!(
        out.status.success(),
        "{what}: `ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// `ip <args>`, errors ignored (cleanup).
fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// What a [`Swarm`] made on the host, by name, to check after its drop that none of it is
/// left (its drop removes it all).
#[derive(Clone, Debug)]
pub struct SwarmTrace {
    /// Network namespaces (`/run/netns/<name>`).
    pub netns: Vec<String>,
    /// Interfaces in the host's namespace.
    pub links: Vec<String>,
    /// The engines' temp dirs (every daemon's and shim's command line names one).
    pub dirs: Vec<PathBuf>,
    /// The fixture's owner file (`sweep_dead_swarms`).
    pub owner: PathBuf,
}

impl SwarmTrace {
    /// What a Swarm fixture's owner file (`/tmp/kv-swarm-<id>.owner`) says it made: for a
    /// fixture in another process.
    pub fn from_owner_file(owner: &Path) -> SwarmTrace {
        let text =
            std::fs::read_to_string(owner).unwrap_or_else(|e| panic!("{}: {e}", owner.display()));
        let values = |key: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .map(str::to_owned)
                .collect()
        };
        SwarmTrace {
            netns: values("netns"),
            links: values("link"),
            dirs: values("dir").into_iter().map(PathBuf::from).collect(),
            owner: owner.to_owned(),
        }
    }

    /// Whatever of it is still there, named: a namespace, an interface, a process whose
    /// command line names a dir (a daemon, a shim) or a descendant of one, a mount under a
    /// dir, a dir.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for ns in &self.netns {
            if Path::new("/run/netns").join(ns).exists() {
                left.push(format!("network namespace {ns}"));
            }
        }
        for link in &self.links {
            if Path::new("/sys/class/net").join(link).exists() {
                left.push(format!("interface {link}"));
            }
        }
        for dir in &self.dirs {
            for pid in process_trees(&dir.display().to_string()) {
                left.push(format!("process {pid} under {}", dir.display()));
            }
            for m in mounts_under(dir) {
                left.push(format!("mount {m}"));
            }
            if dir.exists() {
                left.push(format!("dir {}", dir.display()));
            }
        }
        if self.owner.exists() {
            left.push(format!("owner file {}", self.owner.display()));
        }
        left
    }
}

/// One engine of a [`Swarm`]: its network namespace and address there.
pub struct SwarmNode {
    /// `kvs-<run>-<letter>`: the network namespace, also the engine's (and Swarm node's) host
    /// name.
    pub netns: String,
    /// Its address on the Swarm's private bridge, `10.250.<n>.<index + 1>`.
    pub ip: std::net::Ipv4Addr,
}

/// Two (or more) private Docker engines joined in a Docker Swarm, for multi-node cluster
/// sessions (Backend.AI: the manager host is a Swarm manager, the agents' hosts workers).
///
/// Layout on the host (`<id>` a random 6-hex-digit run id, `<n>` a free third octet):
/// - network namespace `kvs-<id>-hub` holds bridge `br0`; the host's namespace joins it with
///   veth `kvs<id>r` (`10.250.<n>.254/24`): the host reaches every engine, and routes nothing
///   (bridged traffic in the host's namespace would pass the host's `FORWARD` chain, which the
///   main engine sets to `DROP`);
/// - per engine, network namespace `kvs-<id>-<a|b|…>`: `eth0` (`10.250.<n>.<i + 1>/24`) on
///   the hub's bridge, its containerd and dockerd (their own data/exec roots, pid file,
///   `--iptables`; the engine's default bridge, `docker_gwbridge`, the overlay's VXLAN and
///   iptables rules all live in it), in a UTS namespace named as the netns;
/// - engine 0 runs `docker swarm init --advertise-addr <its ip>`, the others join as workers.
///
/// Containers live in their engine's namespace. An agent per engine runs there too, as on a
/// host of its own ([`enter_netns`]; `docker-host = host(i)`, `bind-host = advertised-host` =
/// its RPC's address = `ip(i)`), its manager in the host's namespace with its intake on
/// [`Swarm::host_ip`]: see `docs/scenarios.md`, "Two engines in a Swarm".
///
/// Dropping it removes every container, leaves the Swarm, stops the daemons, kills any shim,
/// unmounts and removes their dirs, deletes the namespaces (and with them every veth and
/// bridge), also when the test failed or the start did. A fixture whose process was killed (no
/// drop runs) is swept by the next [`Swarm::start`] ([`sweep_dead_swarms`], by its owner file).
pub struct Swarm {
    /// The run id in every name.
    pub id: String,
    /// The third octet of `10.250.<n>.0/24`.
    pub subnet: u8,
    hub: String,
    root_veth: String,
    /// Made so far, also on a failed start (cleanup).
    namespaces: Vec<String>,
    pub nodes: Vec<SwarmNode>,
    engines: Vec<PrivateEngine>,
    /// How long [`Swarm::start`] took: namespaces, daemons, images, Swarm formed.
    pub up_took: Duration,
}

/// A third octet `n` for `10.250.<n>.0/24` that no address of the host's namespace uses.
fn free_subnet() -> u8 {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let start = uuid::Uuid::new_v4().as_bytes()[0];
    (0..=255u8)
        .map(|k| start.wrapping_add(k))
        .find(|n| !out.contains(&format!("10.250.{n}.")))
        .expect("every 10.250.<n>.0/24 is in use on the host")
}

impl Swarm {
    /// Starts `engines` (≥ 2) engines, copies `images` (from the main engine) into each, forms
    /// the Swarm and waits until the manager lists every node `Ready`.
    pub fn start(engines: usize, images: &[&str]) -> Swarm {
        assert!(
            (2..=26).contains(&engines),
            "a Swarm fixture has 2 to 26 engines"
        );
        require_engine_tools(images);
        assert!(
            has_tool("ip", "-V"),
            "`ip` not found: install iproute2 (the Swarm fixture makes network namespaces)"
        );
        sweep_dead_swarms();
        let started = Instant::now();
        let id = super::agent::run_id()[..6].to_owned();
        let mut swarm = Swarm {
            subnet: free_subnet(),
            hub: format!("kvs-{id}-hub"),
            root_veth: format!("kvs{id}r"),
            id,
            namespaces: Vec::new(),
            nodes: Vec::new(),
            engines: Vec::new(),
            up_took: Duration::ZERO,
        };
        swarm.record();
        swarm.make_hub();
        for i in 0..engines {
            swarm.make_node(i);
        }
        let tar_dir = tempfile::Builder::new()
            .prefix("kv-swarm-img-")
            .tempdir_in("/tmp")
            .unwrap();
        let tar = (!images.is_empty()).then(|| save_images(tar_dir.path(), images));
        for node in &swarm.nodes {
            let engine = PrivateEngine::start_bare(EngineSpec {
                live_restore: false,
                network: EngineNetwork::Namespace {
                    netns: node.netns.clone(),
                    hostname: node.netns.clone(),
                },
            });
            // Pushed before loading: a failed load still stops this engine.
            swarm.engines.push(engine);
            swarm.record();
            if let Some(tar) = &tar {
                swarm.engines.last().unwrap().load(tar);
            }
        }
        drop(tar_dir);
        swarm.form();
        swarm.up_took = started.elapsed();
        swarm
    }

    /// The hub namespace with its bridge, the host's veth onto it, and a VXLAN check.
    fn make_hub(&mut self) {
        let hub = self.hub.clone();
        self.namespaces.push(hub.clone());
        self.record();
        ip("the hub's network namespace", &["netns", "add", &hub]);
        ip("hub lo", &["-n", &hub, "link", "set", "lo", "up"]);
        ip(
            "the hub's bridge",
            &["-n", &hub, "link", "add", "br0", "type", "bridge"],
        );
        ip("hub bridge up", &["-n", &hub, "link", "set", "br0", "up"]);
        // Swarm's overlay driver makes a VXLAN interface per network: fail here, clearly,
        // rather than at the first container.
        let vxlan = Command::new("ip")
            .args([
                "-n", &hub, "link", "add", "kvsvx0", "type", "vxlan", "id", "4242", "dstport",
                "4789", "dev", "br0",
            ])
            .output()
            .unwrap();
        assert!(
            vxlan.status.success(),
            "the kernel cannot make a VXLAN interface ({}): Swarm's overlay networks need \
             CONFIG_VXLAN (`modprobe vxlan`)",
            String::from_utf8_lossy(&vxlan.stderr).trim()
        );
        ip("vxlan check", &["-n", &hub, "link", "del", "kvsvx0"]);
        let root = self.root_veth.clone();
        ip(
            "the host's veth onto the hub",
            &[
                "link", "add", &root, "type", "veth", "peer", "name", "host", "netns", &hub,
            ],
        );
        ip(
            "hub side of the host's veth",
            &["-n", &hub, "link", "set", "host", "master", "br0", "up"],
        );
        let addr = format!("10.250.{}.254/24", self.subnet);
        ip("the host's address", &["addr", "add", &addr, "dev", &root]);
        ip("the host's veth up", &["link", "set", &root, "up"]);
    }

    /// Engine `i`'s namespace, `eth0` on the hub's bridge with its address.
    fn make_node(&mut self, i: usize) {
        let letter = (b'a' + i as u8) as char;
        let ns = format!("kvs-{}-{letter}", self.id);
        self.namespaces.push(ns.clone());
        self.record();
        ip("an engine's network namespace", &["netns", "add", &ns]);
        ip("engine lo", &["-n", &ns, "link", "set", "lo", "up"]);
        let port = format!("ve-{letter}");
        ip(
            "an engine's veth onto the hub",
            &[
                "-n", &self.hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ],
        );
        ip(
            "hub side of an engine's veth",
            &["-n", &self.hub, "link", "set", &port, "master", "br0", "up"],
        );
        let ip_addr = std::net::Ipv4Addr::new(10, 250, self.subnet, i as u8 + 1);
        let cidr = format!("{ip_addr}/24");
        ip(
            "an engine's address",
            &["-n", &ns, "addr", "add", &cidr, "dev", "eth0"],
        );
        ip("engine eth0 up", &["-n", &ns, "link", "set", "eth0", "up"]);
        self.nodes.push(SwarmNode {
            netns: ns,
            ip: ip_addr,
        });
    }

    /// `swarm init` on engine 0, `swarm join` of the others as workers, then every node
    /// `Ready` in the manager's `node ls`.
    fn form(&self) {
        let manager_ip = self.nodes[0].ip.to_string();
        self.engines[0].must_docker(
            "swarm init",
            &[
                "swarm",
                "init",
                "--advertise-addr",
                &manager_ip,
                "--listen-addr",
                &format!("{manager_ip}:2377"),
            ],
        );
        let token = self.engines[0].must_docker(
            "the worker join token",
            &["swarm", "join-token", "-q", "worker"],
        );
        for (node, engine) in self.nodes.iter().zip(&self.engines).skip(1) {
            let ip = node.ip.to_string();
            engine.must_docker(
                "swarm join",
                &[
                    "swarm",
                    "join",
                    "--token",
                    &token,
                    "--advertise-addr",
                    &ip,
                    "--listen-addr",
                    &format!("{ip}:2377"),
                    &format!("{manager_ip}:2377"),
                ],
            );
        }
        let start = Instant::now();
        loop {
            let ready = self.node_states();
            if ready.iter().filter(|(_, s)| s == "Ready").count() == self.nodes.len() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the Swarm's nodes did not all turn Ready: {ready:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The manager's `docker node ls`: (host name, status) per node.
    pub fn node_states(&self) -> Vec<(String, String)> {
        self.engines[0]
            .docker(&["node", "ls", "--format", "{{.Hostname}} {{.Status}}"])
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(h, s)| (h.to_owned(), s.to_owned()))
            .collect()
    }

    /// Engine `i` (0: the Swarm manager).
    pub fn engine(&self, i: usize) -> &PrivateEngine {
        &self.engines[i]
    }

    /// Engine `i`'s socket, `unix://…/docker.sock` (an agent's `docker-host`).
    pub fn host(&self, i: usize) -> String {
        self.engines[i].host()
    }

    /// Engine `i`'s address on the private bridge.
    pub fn ip(&self, i: usize) -> std::net::Ipv4Addr {
        self.nodes[i].ip
    }

    /// The host's own address on the private bridge (`10.250.<n>.254`): what a process in an
    /// engine's namespace reaches the host's at (a manager's intake).
    pub fn host_ip(&self) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 250, self.subnet, 254)
    }

    /// What to check for after the drop.
    pub fn trace(&self) -> SwarmTrace {
        SwarmTrace {
            netns: self.namespaces.clone(),
            links: vec![self.root_veth.clone()],
            dirs: self.engines.iter().map(|e| e.dir().to_owned()).collect(),
            owner: owner_file(&self.id),
        }
    }

    /// Creates the overlay network Backend.AI's manager makes for a multi-node session
    /// (`manager/network/overlay.py`, `OverlayNetworkPlugin.create_network`): driver `overlay`,
    /// attachable, label `ai.backend.cluster-network=1`, named `bai-multinode-<session_id>`, on
    /// the Swarm manager. Returns the network's id.
    pub fn create_overlay(&self, session_id: &str) -> String {
        self.engines[0].must_docker(
            "create the session's overlay network",
            &[
                "network",
                "create",
                "--driver",
                "overlay",
                "--attachable",
                "--label",
                "ai.backend.cluster-network=1",
                &format!("bai-multinode-{session_id}"),
            ],
        )
    }
}

/// `/tmp/kv-swarm-<id>.owner`: the process running Swarm fixture `<id>` and what the fixture has
/// made so far, one `key value` a line (`pid`, `link`, `netns`, `dir`), for
/// [`sweep_dead_swarms`].
pub fn owner_file(id: &str) -> PathBuf {
    PathBuf::from(format!("/tmp/kv-swarm-{id}.owner"))
}

impl Swarm {
    /// Rewrites this fixture's owner file (before each namespace is made, after each engine
    /// started).
    fn record(&self) {
        let mut text = format!("pid {}\nlink {}\n", std::process::id(), self.root_veth);
        for ns in &self.namespaces {
            text.push_str(&format!("netns {ns}\n"));
        }
        for engine in &self.engines {
            text.push_str(&format!("dir {}\n", engine.dir().display()));
        }
        std::fs::write(owner_file(&self.id), text).unwrap();
    }
}

/// Removes what the Swarm fixtures of processes that no longer run left behind: a test killed
/// (nextest's timeout, a SIGKILL) never runs its fixture's drop. By their owner files: every
/// process under an engine's dir (daemons, shims, and their containers), whatever else runs in
/// their namespaces, the mounts under the dirs, the dirs, the namespaces, the host's veth.
/// [`Swarm::start`] calls it first.
pub fn sweep_dead_swarms() {
    for entry in std::fs::read_dir("/tmp").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("kv-swarm-") && name.ends_with(".owner")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let values = |key: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .map(str::to_owned)
                .collect()
        };
        let owner_runs = values("pid")
            .first()
            .is_some_and(|pid| Path::new("/proc").join(pid).exists());
        if owner_runs {
            continue;
        }
        for dir in values("dir") {
            for pid in process_trees(&dir) {
                // SAFETY: kill(2) on a process of a dead fixture's engine.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        for ns in values("netns").iter().rev() {
            kill_in_netns(ns);
            ip_quiet(&["netns", "delete", ns]);
        }
        for dir in values("dir") {
            unmount_under(Path::new(&dir));
            let _ = std::fs::remove_dir_all(&dir);
        }
        for link in values("link") {
            ip_quiet(&["link", "delete", &link]);
        }
        let _ = std::fs::remove_file(entry.path());
    }
}

/// SIGKILLs every process in network namespace `ns`.
fn kill_in_netns(ns: &str) {
    let pids = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: kill(2) on a process in a namespace a Swarm fixture made.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        // Containers first (a worker leaving keeps its attached containers' endpoints), then
        // the workers leave, then the manager.
        for engine in &self.engines {
            if engine.answers() {
                let ids = engine.docker(&["ps", "-aq"]);
                let ids: Vec<&str> = ids.lines().collect();
                if !ids.is_empty() {
                    let mut args = vec!["rm", "-f"];
                    args.extend(ids);
                    engine.docker(&args);
                }
            }
        }
        for engine in self.engines.iter().rev() {
            if engine.answers() {
                engine.docker(&["swarm", "leave", "--force"]);
            }
        }
        // Each engine's own drop: daemons stopped, shims killed, mounts undone, dir removed.
        self.engines.clear();
        for ns in self.namespaces.iter().rev() {
            // Anything still running in it (nothing, unless a daemon would not stop).
            kill_in_netns(ns);
            // Deleting a namespace deletes its interfaces, and a veth goes with its peer.
            ip_quiet(&["netns", "delete", ns]);
        }
        ip_quiet(&["link", "delete", &self.root_veth]);
        let _ = std::fs::remove_file(owner_file(&self.id));
    }
}
