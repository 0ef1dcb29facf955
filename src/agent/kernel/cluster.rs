//! A cluster kernel's share of `create_kernels`' `cluster_info`, applied as Backend.AI 26.9.6's
//! Docker agent applies it: the network the container joins (`apply_network` in
//! `src/ai/backend/agent/docker/agent.py`, the `overlay` and `host` network plugins in
//! `docker/intrinsic.py`), the cluster's SSH keys in the scratch's `config/ssh/` (`prepare_ssh`,
//! same file) and `config/cluster.json` (`create_kernel` in `agent.py` stores it for
//! `restart_kernel`), and which kernel publishes the service ports (`create_kernel`: only the
//! main one).
//!
//! [`ClusterConfig`] is what the agent keeps of it per kernel (in the kernel's config in the
//! agent's store, and as `config/cluster.json`), so that a restart, a restart policy's new
//! container and a recovered kernel join the same network with the same alias again.
//!
//! In the container, Backend.AI's kernel runner (`init_sshd_service` in
//! `src/ai/backend/kernel/intrinsic.py`) appends `id_cluster.pub` to `authorized_keys` and
//! writes `~/.ssh/config` (`Host <role>*`, port 2200, `IdentityFile
//! /home/config/ssh/id_cluster`; per host from `port-mapping.json` in host mode), so that
//! `ssh sub1` reaches the kernel `sub1`'s sshd (dropbear on 2200) by its alias.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use super::error::KernelError;
use super::resources::ServicePortInfo;
use crate::agent::backend::{ContainerSpec, NetworkAttachment, PortMapping, HOST_NETWORK};
use crate::agent::runner::launch::{SSHD_PORT, TTYD_PORT};
use crate::agent::runner::RunnerPorts;
use crate::rpc::agent_api::kernel::{ClusterInfo, ClusterMode};

/// The roles whose kernel publishes the image's service ports and the preopen ports
/// (upstream's `cluster_role in ("main", "master")`); every other role gets the runner's
/// intrinsic ports only.
pub const MAIN_ROLES: [&str; 2] = ["main", "master"];

/// Whether a kernel of `role` is its session's main kernel: one of [`MAIN_ROLES`], or no role
/// at all (a config without `cluster_role`: a single kernel; upstream's default role is
/// `main`).
pub fn is_main(role: Option<&str>) -> bool {
    role.is_none_or(|r| MAIN_ROLES.contains(&r))
}

/// The endpoint driver option an overlay kernel's interface is named by (upstream's
/// `OverlayNetworkPlugin.join_network`).
pub const OVERLAY_IFNAME_OPT: &str = "com.docker.network.endpoint.ifname";

/// The interface name an overlay kernel gets on the session's overlay network.
pub const OVERLAY_IFNAME: &str = "baimulti0";

/// The Swarm bridge every overlay container also sits on; MPI must not use it (upstream reads
/// its subnet at start, `DockerAgent.__ainit__`).
pub const GWBRIDGE: &str = "docker_gwbridge";

/// The variable that keeps Open MPI's TCP transport off the loopback and `docker_gwbridge`.
pub const OMPI_EXCLUDE_VAR: &str = "OMPI_MCA_btl_tcp_if_exclude";

/// `network_config.mode`: how the session's kernels reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// A bridge network of this agent's engine (`create_local_network`, single-node), joined by
    /// name with the kernel's hostname as its alias.
    Bridge,
    /// A Swarm overlay network (multi-node), joined as a bridge is, its interface named
    /// [`OVERLAY_IFNAME`].
    Overlay,
    /// The host's network namespace: peers by `/etc/hosts` entries and sshd on an assigned host
    /// port.
    Host,
}

/// `cluster_info.network_config` (`{"mode", "network_name", "network_id"}`; `{}` for a session
/// of one kernel).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// `None`: the engine's default network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<NetworkMode>,
    /// The network's name (bridge and overlay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_name: Option<String>,
    /// The overlay network's engine id (kept, unused: the name is joined).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_id: Option<String>,
}

/// `cluster_info.ssh_keypair`: the session-wide keypair its kernels log in to each other with
/// (the manager's RSA-2048: an OpenSSH public key, a PEM private key).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterKeypair {
    /// `ssh-rsa AAAA… work@cluster.backend.ai.local`.
    pub public_key: String,
    /// `-----BEGIN RSA PRIVATE KEY-----…`.
    pub private_key: String,
}

impl std::fmt::Debug for ClusterKeypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterKeypair")
            .field("public_key", &self.public_key)
            .field("private_key", &"<redacted>")
            .finish()
    }
}

/// What a kernel keeps of `cluster_info`, checked; its JSON is upstream's `ClusterInfo`
/// (`{mode, size, replicas, network_config, ssh_keypair, cluster_ssh_port_mapping}`), as
/// `config/cluster.json` holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// `single-node` or `multi-node`.
    pub mode: ClusterMode,
    /// Kernels in the session.
    pub size: u32,
    /// Kernels per role (`{"main": 1, "sub": 2}`).
    pub replicas: BTreeMap<String, u32>,
    /// The network.
    pub network_config: NetworkConfig,
    /// The session's keypair (every upstream session has one).
    pub ssh_keypair: Option<ClusterKeypair>,
    /// Host mode: `{hostname: [agent host, sshd host port]}` per kernel (the manager's
    /// `assign_port` on each kernel's agent).
    pub cluster_ssh_port_mapping: Option<BTreeMap<String, (String, u16)>>,
}

fn invalid(msg: String) -> KernelError {
    KernelError::InvalidConfig(format!("cluster_info: {msg}"))
}

fn text(v: &Value) -> Option<&str> {
    v.as_str().filter(|s| !s.is_empty())
}

fn field<'a>(m: &'a Value, k: &str) -> Option<&'a Value> {
    m.as_map()?
        .iter()
        .find(|(n, _)| n.as_str() == Some(k))
        .map(|(_, v)| v)
        .filter(|v| !v.is_nil())
}

impl ClusterConfig {
    /// Checks `create_kernels`' `cluster_info`.
    ///
    /// Errors: [`KernelError::InvalidConfig`] naming the key: a `network_config.mode` other
    /// than `bridge`, `overlay` and `host` (upstream: `Network plugin <mode> not loaded!`),
    /// a bridge or overlay without `network_name`, an `ssh_keypair` that is not two key texts,
    /// a `cluster_ssh_port_mapping` entry that is not `[host, port]`.
    pub fn from_info(info: &ClusterInfo) -> Result<ClusterConfig, KernelError> {
        let net = &info.network_config;
        let get = |k: &str| net.get(k).filter(|v| !v.is_nil());
        let mode = match get("mode") {
            None => None,
            Some(m) => Some(match m.as_str() {
                Some("bridge") => NetworkMode::Bridge,
                Some("overlay") => NetworkMode::Overlay,
                Some("host") => NetworkMode::Host,
                _ => {
                    return Err(invalid(format!(
                        "network_config.mode {m} is not a network this agent joins (bridge, overlay, host)"
                    )))
                }
            }),
        };
        let network_name = get("network_name").and_then(text).map(str::to_owned);
        if matches!(mode, Some(NetworkMode::Bridge | NetworkMode::Overlay))
            && network_name.is_none()
        {
            return Err(invalid(
                "network_config of a bridge or overlay network needs its `network_name`".into(),
            ));
        }
        let ssh_keypair = match info.ssh_keypair.as_ref().filter(|v| !v.is_nil()) {
            None => None,
            Some(pair) => {
                let key = |k: &str| {
                    field(pair, k)
                        .and_then(text)
                        .map(str::to_owned)
                        .ok_or_else(|| invalid(format!("ssh_keypair.{k} is not a key's text")))
                };
                Some(ClusterKeypair {
                    public_key: key("public_key")?,
                    private_key: key("private_key")?,
                })
            }
        };
        let cluster_ssh_port_mapping = match info
            .cluster_ssh_port_mapping
            .as_ref()
            .filter(|v| !v.is_nil())
        {
            None => None,
            Some(m) => {
                let entries = m.as_map().ok_or_else(|| {
                    invalid("cluster_ssh_port_mapping is not a map of hostnames".into())
                })?;
                let mut out = BTreeMap::new();
                for (host, to) in entries {
                    let host = text(host).ok_or_else(|| {
                        invalid("cluster_ssh_port_mapping has a key that is not a hostname".into())
                    })?;
                    let pair = match to.as_array().map(Vec::as_slice) {
                        Some([addr, port]) => text(addr).zip(
                            port.as_u64()
                                .and_then(|p| u16::try_from(p).ok())
                                .filter(|&p| p > 0),
                        ),
                        _ => None,
                    };
                    let (addr, port) = pair.ok_or_else(|| {
                        invalid(format!(
                            "cluster_ssh_port_mapping[{host}] is {to}, not [host, port]"
                        ))
                    })?;
                    out.insert(host.to_owned(), (addr.to_owned(), port));
                }
                Some(out)
            }
        };
        Ok(ClusterConfig {
            mode: info.mode,
            size: info.size,
            replicas: info.replicas.clone(),
            network_config: NetworkConfig {
                mode,
                network_name,
                network_id: get("network_id").and_then(text).map(str::to_owned),
            },
            ssh_keypair,
            cluster_ssh_port_mapping,
        })
    }

    /// The network a kernel joins by name (bridge or overlay), which must exist on the engine
    /// before its container is created.
    pub fn joined_network(&self) -> Option<&str> {
        match self.network_config.mode {
            Some(NetworkMode::Bridge | NetworkMode::Overlay) => {
                self.network_config.network_name.as_deref()
            }
            _ => None,
        }
    }

    /// The sshd host port the manager assigned to the kernel `hostname` (id `kernel_id`) in
    /// host mode: its `cluster_ssh_port_mapping` entry by hostname (upstream's agent looks it up
    /// so), else by `node-<kernel_id>` (the key the 26.9.6 `SessionLauncher` writes).
    pub fn ssh_host_port(&self, hostname: Option<&str>, kernel_id: &str) -> Option<u16> {
        let mapping = self.cluster_ssh_port_mapping.as_ref()?;
        hostname
            .and_then(|h| mapping.get(h))
            .or_else(|| mapping.get(&format!("node-{kernel_id}")))
            .map(|(_, port)| *port)
    }

    /// Whether its kernels run on the host's network (mode `host`).
    pub fn on_host(&self) -> bool {
        self.network_config.mode == Some(NetworkMode::Host)
    }

    /// A host-network kernel's service ports as its runner serves them (upstream's
    /// `start_container` with the host plugin): sshd on the port the manager assigned for the
    /// kernel `hostname` (id `kernel_id`, [`ClusterConfig::ssh_host_port`]) when it did, and
    /// every service's container ports its host ports (nothing maps one to the other there).
    pub fn on_host_network(
        &self,
        ports: &mut [ServicePortInfo],
        hostname: Option<&str>,
        kernel_id: &str,
    ) {
        let sshd = self.ssh_host_port(hostname, kernel_id);
        for p in ports.iter_mut() {
            if let (Some(port), "sshd") = (sshd, p.name.as_str()) {
                p.host_ports = vec![port];
            }
            p.container_ports = p.host_ports.clone();
        }
    }

    /// Puts the network into `spec` as upstream's `apply_network` does: bridge →
    /// `NetworkMode = network_name` with `hostname` as the alias; overlay → the same with the
    /// interface named [`OVERLAY_IFNAME`] and, when the engine has [`GWBRIDGE`] (its subnet
    /// `gwbridge_subnet`), [`OMPI_EXCLUDE_VAR`] = `127.0.0.1/32,<subnet>`; host →
    /// `NetworkMode = host` and one `/etc/hosts` entry per `cluster_ssh_port_mapping` host.
    /// Nothing for a session without a network.
    pub fn apply_network(
        &self,
        spec: &mut ContainerSpec,
        hostname: Option<&str>,
        gwbridge_subnet: Option<&str>,
    ) {
        let aliases: Vec<String> = hostname.map(str::to_owned).into_iter().collect();
        match (self.network_config.mode, self.joined_network()) {
            (Some(NetworkMode::Bridge), Some(name)) => {
                spec.network = Some(NetworkAttachment {
                    mode: name.to_owned(),
                    aliases,
                    driver_opts: HashMap::new(),
                });
            }
            (Some(NetworkMode::Overlay), Some(name)) => {
                spec.network = Some(NetworkAttachment {
                    mode: name.to_owned(),
                    aliases,
                    driver_opts: HashMap::from([(
                        OVERLAY_IFNAME_OPT.to_owned(),
                        OVERLAY_IFNAME.to_owned(),
                    )]),
                });
                if let Some(subnet) = gwbridge_subnet {
                    let prefix = format!("{OMPI_EXCLUDE_VAR}=");
                    spec.env.retain(|e| !e.starts_with(&prefix));
                    spec.env.push(format!("{prefix}127.0.0.1/32,{subnet}"));
                }
            }
            (Some(NetworkMode::Host), _) => {
                spec.network = Some(NetworkAttachment {
                    mode: HOST_NETWORK.to_owned(),
                    ..NetworkAttachment::default()
                });
                spec.extra_hosts = self
                    .cluster_ssh_port_mapping
                    .iter()
                    .flatten()
                    .map(|(host, (addr, _))| format!("{host}:{addr}"))
                    .collect();
            }
            _ => {}
        }
    }

    /// Writes what upstream's `prepare_ssh` writes into the scratch's `config_dir`, owned by
    /// `owner` (the kernel's uid and gid, whose ssh client and sshd read them):
    /// `ssh/id_cluster` (0600) and `ssh/id_cluster.pub` from the keypair, and with a port
    /// mapping (host mode) `ssh/port-mapping.json`; then `cluster.json` (this config, root's,
    /// 0600: what a restart and recovery re-apply). Files already there are replaced (a
    /// container made anew).
    ///
    /// Errors: the file system's.
    pub fn write_files(&self, config_dir: &Path, owner: (u32, u32)) -> std::io::Result<()> {
        use std::os::unix::fs::{chown, OpenOptionsExt};
        let write = |path: &Path, bytes: &[u8], mode: u32| -> std::io::Result<()> {
            // A fresh file: an old one's mode (or a link put there) is not kept.
            let _ = std::fs::remove_file(path);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(path)?;
            f.write_all(bytes)
        };
        if let Some(pair) = &self.ssh_keypair {
            let ssh = config_dir.join("ssh");
            std::fs::create_dir_all(&ssh)?;
            chown(&ssh, Some(owner.0), Some(owner.1))?;
            let mut files = vec![
                (ssh.join("id_cluster"), pair.private_key.clone(), 0o600),
                (ssh.join("id_cluster.pub"), pair.public_key.clone(), 0o644),
            ];
            if let Some(mapping) = &self.cluster_ssh_port_mapping {
                files.push((
                    ssh.join("port-mapping.json"),
                    serde_json::to_string(mapping).map_err(std::io::Error::other)?,
                    0o644,
                ));
            }
            for (path, text, mode) in files {
                write(&path, text.as_bytes(), mode)?;
                chown(&path, Some(owner.0), Some(owner.1))?;
            }
        }
        let json = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        write(&config_dir.join(CLUSTER_JSON), &json, 0o600)
    }

    /// The config a kernel's scratch `config_dir` holds (`cluster.json`), if any.
    ///
    /// Errors: the file system's but "not found", or a file that does not parse.
    pub fn read(config_dir: &Path) -> std::io::Result<Option<ClusterConfig>> {
        match std::fs::read(config_dir.join(CLUSTER_JSON)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl ClusterConfig {
    /// On the host's network a runner binds its intrinsic ports on host ports
    /// ([`write_intrinsic_ports`]): repl-in/out on the kernel's (`repl`), sshd on the one the
    /// manager assigned the kernel `hostname` (id `kernel_id`) for the cluster
    /// ([`ClusterConfig::ssh_host_port`]) else its own, ttyd on its own; its own are the host
    /// ports `published` maps container ports 2200 and 7681 to. `None` off the host's network.
    pub fn intrinsic_ports(
        &self,
        hostname: Option<&str>,
        kernel_id: &str,
        repl: RunnerPorts,
        published: &[PortMapping],
    ) -> Option<BTreeMap<&'static str, u16>> {
        if !self.on_host() {
            return None;
        }
        let host_port = |container: u16| {
            published
                .iter()
                .find(|p| p.container_port == container)
                .map(|p| p.host_port)
        };
        let mut ports = BTreeMap::from([("replin", repl.repl_in), ("replout", repl.repl_out)]);
        let sshd = self
            .ssh_host_port(hostname, kernel_id)
            .or_else(|| host_port(SSHD_PORT));
        if let Some(p) = sshd {
            ports.insert("sshd", p);
        }
        if let Some(p) = host_port(TTYD_PORT) {
            ports.insert("ttyd", p);
        }
        Some(ports)
    }
}

/// The file in the scratch's `config/` that keeps the cluster config (upstream's name).
pub const CLUSTER_JSON: &str = "cluster.json";

/// Writes `config/intrinsic-ports.json` for a runner kernel on the host's network: the host
/// ports its runner binds instead of the container ports (`{"replin", "replout", "sshd",
/// "ttyd"}` → port; upstream's `HostNetworkPlugin.prepare_port_forward`, read by the runner's
/// `BaseRunner._init`).
///
/// Errors: the file system's.
pub fn write_intrinsic_ports(
    config_dir: &Path,
    ports: &BTreeMap<&'static str, u16>,
) -> std::io::Result<()> {
    let json = serde_json::to_vec(ports).map_err(std::io::Error::other)?;
    std::fs::write(config_dir.join("intrinsic-ports.json"), json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(network: Vec<(&str, Value)>) -> ClusterInfo {
        ClusterInfo {
            mode: ClusterMode::SingleNode,
            size: 2,
            replicas: BTreeMap::from([("main".into(), 1), ("sub".into(), 1)]),
            network_config: network
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            ssh_keypair: Some(Value::Map(vec![
                ("public_key".into(), "ssh-rsa AAAA work@cluster".into()),
                (
                    "private_key".into(),
                    "-----BEGIN RSA PRIVATE KEY-----".into(),
                ),
            ])),
            cluster_ssh_port_mapping: None,
        }
    }

    #[test]
    fn main_roles() {
        assert!(is_main(None));
        assert!(is_main(Some("main")));
        assert!(is_main(Some("master")));
        assert!(!is_main(Some("sub")));
        assert!(!is_main(Some("worker")));
    }

    #[test]
    fn bridge_joins_the_named_network_with_the_hostname_as_alias() {
        let c = ClusterConfig::from_info(&info(vec![
            ("mode", "bridge".into()),
            ("network_name", "bai-singlenode-s".into()),
        ]))
        .unwrap();
        assert_eq!(c.joined_network(), Some("bai-singlenode-s"));
        let mut spec = ContainerSpec::default();
        c.apply_network(&mut spec, Some("sub1"), Some("172.18.0.0/16"));
        let net = spec.network.unwrap();
        assert_eq!(net.mode, "bai-singlenode-s");
        assert_eq!(net.aliases, vec!["sub1".to_owned()]);
        assert!(net.driver_opts.is_empty());
        // The gwbridge variable is the overlay's only.
        assert!(spec.env.is_empty());
        assert!(spec.extra_hosts.is_empty());
    }

    #[test]
    fn overlay_names_the_interface_and_keeps_mpi_off_the_gwbridge() {
        let c = ClusterConfig::from_info(&info(vec![
            ("mode", "overlay".into()),
            ("network_name", "bai-multinode-s".into()),
            ("network_id", "abc".into()),
        ]))
        .unwrap();
        let mut spec = ContainerSpec::default();
        c.apply_network(&mut spec, Some("main1"), Some("172.18.0.0/16"));
        let net = spec.network.unwrap();
        assert_eq!(net.mode, "bai-multinode-s");
        assert_eq!(net.aliases, vec!["main1".to_owned()]);
        assert_eq!(net.driver_opts[OVERLAY_IFNAME_OPT], "baimulti0");
        assert_eq!(
            spec.env,
            vec!["OMPI_MCA_btl_tcp_if_exclude=127.0.0.1/32,172.18.0.0/16".to_owned()]
        );
        // No docker_gwbridge: no variable.
        let mut spec = ContainerSpec::default();
        c.apply_network(&mut spec, Some("main1"), None);
        assert!(spec.env.is_empty());
    }

    #[test]
    fn host_mode_adds_the_peers_and_finds_the_sshd_port() {
        let mut i = info(vec![("mode", "host".into())]);
        i.cluster_ssh_port_mapping = Some(Value::Map(vec![
            (
                "node-k1".into(),
                Value::Array(vec!["10.0.0.1".into(), 30001.into()]),
            ),
            (
                "sub1".into(),
                Value::Array(vec!["10.0.0.2".into(), 30002.into()]),
            ),
        ]));
        let c = ClusterConfig::from_info(&i).unwrap();
        assert_eq!(c.joined_network(), None);
        let mut spec = ContainerSpec::default();
        c.apply_network(&mut spec, Some("main1"), None);
        assert_eq!(spec.network.unwrap().mode, HOST_NETWORK);
        assert_eq!(
            spec.extra_hosts,
            vec!["node-k1:10.0.0.1".to_owned(), "sub1:10.0.0.2".to_owned()]
        );
        assert_eq!(c.ssh_host_port(Some("sub1"), "k2"), Some(30002));
        assert_eq!(c.ssh_host_port(Some("main1"), "k1"), Some(30001));
        assert_eq!(c.ssh_host_port(Some("main1"), "k9"), None);
        // Its services listen on their host ports; sshd on the assigned one.
        let mut ports = vec![
            ServicePortInfo {
                name: "sshd".into(),
                protocol: "tcp".into(),
                container_ports: vec![2200],
                host_ports: vec![31000],
            },
            ServicePortInfo {
                name: "ttyd".into(),
                protocol: "http".into(),
                container_ports: vec![7681],
                host_ports: vec![31001],
            },
        ];
        // The runner's host ports: sshd on the assigned one, the rest its own.
        let published = [
            PortMapping {
                container_port: 2200,
                host_port: 31000,
            },
            PortMapping {
                container_port: 7681,
                host_port: 31001,
            },
        ];
        let repl = RunnerPorts {
            repl_in: 31002,
            repl_out: 31003,
        };
        let intrinsic = c
            .intrinsic_ports(Some("sub1"), "k2", repl, &published)
            .unwrap();
        assert_eq!(
            intrinsic.into_iter().collect::<Vec<_>>(),
            vec![
                ("replin", 31002),
                ("replout", 31003),
                ("sshd", 30002),
                ("ttyd", 31001)
            ]
        );
        let unassigned = c
            .intrinsic_ports(Some("main9"), "k9", repl, &published)
            .unwrap();
        assert_eq!(unassigned["sshd"], 31000);
        c.on_host_network(&mut ports, Some("sub1"), "k2");
        assert_eq!(
            (
                ports[0].container_ports.clone(),
                ports[0].host_ports.clone()
            ),
            (vec![30002], vec![30002])
        );
        assert_eq!(
            (
                ports[1].container_ports.clone(),
                ports[1].host_ports.clone()
            ),
            (vec![31001], vec![31001])
        );
    }

    #[test]
    fn a_session_of_one_kernel_has_no_network() {
        let c = ClusterConfig::from_info(&info(vec![])).unwrap();
        let mut spec = ContainerSpec::default();
        c.apply_network(&mut spec, Some("main1"), None);
        assert_eq!(spec.network, None);
        let repl = RunnerPorts {
            repl_in: 1,
            repl_out: 2,
        };
        assert_eq!(c.intrinsic_ports(Some("main1"), "k", repl, &[]), None);
    }

    #[test]
    fn bad_cluster_info_is_refused_by_name() {
        let err = |net: Vec<(&str, Value)>| {
            ClusterConfig::from_info(&info(net))
                .unwrap_err()
                .to_string()
        };
        assert!(err(vec![("mode", "macvlan".into())]).contains("network_config.mode"));
        assert!(err(vec![("mode", "bridge".into())]).contains("network_name"));
        let mut i = info(vec![]);
        i.ssh_keypair = Some(Value::Map(vec![("public_key".into(), "k".into())]));
        assert!(ClusterConfig::from_info(&i)
            .unwrap_err()
            .to_string()
            .contains("ssh_keypair.private_key"));
        let mut i = info(vec![("mode", "host".into())]);
        i.cluster_ssh_port_mapping = Some(Value::Map(vec![("a".into(), "b".into())]));
        assert!(ClusterConfig::from_info(&i)
            .unwrap_err()
            .to_string()
            .contains("cluster_ssh_port_mapping[a]"));
    }

    #[test]
    fn files_are_written_with_their_modes_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let mut i = info(vec![("mode", "host".into())]);
        i.cluster_ssh_port_mapping = Some(Value::Map(vec![(
            "sub1".into(),
            Value::Array(vec!["10.0.0.2".into(), 30002.into()]),
        )]));
        let c = ClusterConfig::from_info(&i).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let me = (unsafe { libc::getuid() }, unsafe { libc::getgid() });
        c.write_files(dir.path(), me).unwrap();
        // Again: a container made anew for the same kernel.
        c.write_files(dir.path(), me).unwrap();
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("ssh/id_cluster"), 0o600);
        assert_eq!(mode("ssh/id_cluster.pub"), 0o644);
        assert_eq!(mode("cluster.json"), 0o600);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("ssh/port-mapping.json")).unwrap(),
            r#"{"sub1":["10.0.0.2",30002]}"#
        );
        assert_eq!(ClusterConfig::read(dir.path()).unwrap(), Some(c));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(ClusterConfig::read(empty.path()).unwrap(), None);
    }

    #[test]
    fn the_stored_json_is_upstreams_cluster_info_shape() {
        let c = ClusterConfig::from_info(&info(vec![
            ("mode", "bridge".into()),
            ("network_name", "n".into()),
        ]))
        .unwrap();
        let v: serde_json::Value = serde_json::to_value(&c).unwrap();
        assert_eq!(v["mode"], "single-node");
        assert_eq!(v["size"], 2);
        assert_eq!(v["replicas"]["sub"], 1);
        assert_eq!(v["network_config"]["mode"], "bridge");
        assert_eq!(v["network_config"]["network_name"], "n");
        assert!(v["ssh_keypair"]["private_key"].is_string());
        assert!(v["cluster_ssh_port_mapping"].is_null());
    }
}
