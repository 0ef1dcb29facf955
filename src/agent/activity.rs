//! What each kernel did lately, for the manager's idle reclaim (`docs/design.md`, "Idle
//! reclaim"): when it was last active and how much of its slots it used since the last
//! heartbeat. The agent is where every kind of activity is seen (Backend.AI's manager calls
//! `execute` on the agent directly, and no proxy stands between a user and a service port), so
//! the agent keeps the facts and the heartbeat carries them (`heartbeat.rs`); the manager
//! decides.
//!
//! Activity is:
//! - an RPC call that uses the kernel: `execute` (any mode, so polling a long run counts),
//!   `pty_*`, and every file method (`methods/`), each [`Activity::touch`]ed when called;
//! - a run still going, of `execute` or a terminal ([`crate::agent::exec::Runs::live_kernels`]),
//!   seen at each heartbeat;
//! - an established TCP connection to one of the kernel's service ports, read from its
//!   container's network namespace (`/proc/<container pid>/net/tcp` and `tcp6`, state `01`
//!   ESTABLISHED, local port one of the service ports' container ports) by the stats sampler at
//!   each container round ([`Connections`]).
//!
//! Reading a namespace's `tcp` table is not cheap: the kernel walks the host's whole TCP hash
//! table for it, every bucket of every namespace (262,144 here: ~7 ms of system time per table
//! on this 2-core VM, the same through `sock_diag`). Read every 5 s for every kernel it cost the
//! agent 2 % of a core with 8 idle kernels (`just bench backend-ai`, 2026-11-29). So a
//! namespace's tables are walked only when its TCP socket counts (`/proc/<pid>/net/sockstat`
//! and `sockstat6`, `inuse`: per-namespace counters, microseconds to read) changed since the
//! last walk — a connection opened or closed — and at least every [`RECHECK`] (a close and an
//! open within one round leave the counts as they were); a table whose count is 0 is not
//! walked at all.
//!
//! Utilization is a mean per slot over the stats sampler's readings since the last heartbeat
//! took them ([`Activity::take`]): `cpu` (% of the cores the kernel holds), `mem` (% of its
//! limit) and each `cuda.*` slot it holds (the device utilization NVML or the mock accelerator
//! reports, as `backendai_container_utilization{cuda_util}`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One kernel's facts.
#[derive(Clone, Debug, Default, PartialEq)]
struct Entry {
    /// Unix seconds of its last activity; `None` before any.
    last: Option<f64>,
    /// `{slot: (sum of readings in %, readings)}` since the last [`Activity::take`].
    util: BTreeMap<String, (f64, u32)>,
}

/// The kernels' activity, shared by the RPC methods, the stats sampler and the heartbeat.
/// Locked only for a map update, never across an await.
#[derive(Debug, Default)]
pub struct Activity {
    kernels: Mutex<HashMap<String, Entry>>,
}

/// What a heartbeat tells of one kernel.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Unix seconds of its last activity (`None`: none seen since the agent started).
    pub last_activity: Option<f64>,
    /// `{slot: percent}`: mean utilization since the previous report (empty: no reading).
    pub utilization: BTreeMap<String, f64>,
}

impl Activity {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.kernels.lock().expect("activity lock")
    }

    /// `kernel_id` is active now.
    pub fn touch(&self, kernel_id: &str) {
        self.touch_at(kernel_id, super::store::now());
    }

    /// `kernel_id` was active at `at` (Unix seconds); an earlier time than one known is kept
    /// out (the last activity only moves forward).
    pub fn touch_at(&self, kernel_id: &str, at: f64) {
        let mut t = self.table();
        let e = t.entry(kernel_id.to_owned()).or_default();
        if e.last.is_none_or(|l| l < at) {
            e.last = Some(at);
        }
    }

    /// One reading of `kernel_id`'s `slot` utilization, in percent.
    pub fn sample(&self, kernel_id: &str, slot: &str, pct: f64) {
        if !pct.is_finite() {
            return;
        }
        let mut t = self.table();
        let e = t.entry(kernel_id.to_owned()).or_default();
        let (sum, n) = e.util.entry(slot.to_owned()).or_default();
        *sum += pct;
        *n += 1;
    }

    /// `kernel_id`'s report: its last activity and its mean utilization per slot since the
    /// previous call (whose readings it then forgets).
    pub fn take(&self, kernel_id: &str) -> Report {
        let mut t = self.table();
        let Some(e) = t.get_mut(kernel_id) else {
            return Report::default();
        };
        let utilization = std::mem::take(&mut e.util)
            .into_iter()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(slot, (sum, n))| (slot, sum / f64::from(n)))
            .collect();
        Report {
            last_activity: e.last,
            utilization,
        }
    }

    /// Forgets every kernel but those `live` keeps.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.table().retain(|id, _| live(id));
    }
}

/// The TCP connection state ESTABLISHED in `/proc/net/tcp`'s `st` column.
const ESTABLISHED: &str = "01";

/// The local ports of the ESTABLISHED connections in `text`, a `/proc/<pid>/net/tcp` or
/// `tcp6` table (`sl local_address rem_address st …`, addresses `HEXIP:HEXPORT`). Lines that do
/// not parse (the header among them) are skipped.
pub fn established_local_ports(text: &str) -> HashSet<u16> {
    text.lines()
        .filter_map(|line| {
            let mut cols = line.split_whitespace();
            let (_sl, local, _remote, st) =
                (cols.next()?, cols.next()?, cols.next()?, cols.next()?);
            if st != ESTABLISHED {
                return None;
            }
            let (_, port) = local.rsplit_once(':')?;
            u16::from_str_radix(port, 16).ok()
        })
        .collect()
}

/// Longest a namespace's answer is reused while its socket counts stay the same.
pub const RECHECK: Duration = Duration::from_secs(60);

/// `TCP: inuse N` of a `/proc/<pid>/net/sockstat` (or `TCP6: inuse N` of `sockstat6`): the
/// namespace's TCP sockets in use (listening and connected; not `TIME_WAIT`).
pub fn tcp_inuse(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line
            .strip_prefix("TCP: ")
            .or_else(|| line.strip_prefix("TCP6: "))?;
        let mut words = rest.split_whitespace();
        while let Some(w) = words.next() {
            if w == "inuse" {
                return words.next()?.parse().ok();
            }
        }
        None
    })
}

/// The IPv4 and IPv6 TCP sockets in use in the network namespace of process `pid`; `None`
/// when it cannot be read (the process is gone).
fn sockets_in_use(pid: u32) -> Option<(u64, u64)> {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok();
    let v4 = tcp_inuse(&read("sockstat")?)?;
    // No IPv6 in the namespace: no sockstat6, and no tcp6 table to walk.
    let v6 = read("sockstat6").and_then(|t| tcp_inuse(&t)).unwrap_or(0);
    Some((v4, v6))
}

/// What a namespace's last walk found.
struct Walked {
    in_use: (u64, u64),
    connected: bool,
    at: Instant,
}

/// Whether someone is connected to a kernel's service ports, per container, walking its
/// namespace's TCP tables only when its socket counts changed (the module's doc says why).
#[derive(Default)]
pub struct Connections {
    walked: HashMap<String, Walked>,
}

impl Connections {
    /// Whether the network namespace of container `container_id`'s init process `pid` holds
    /// an ESTABLISHED TCP connection whose local port is one of `ports` (its service ports'
    /// container ports). Tables that cannot be read (the process is gone) count as none.
    pub fn connected(&mut self, container_id: &str, pid: u32, ports: &[u16]) -> bool {
        if ports.is_empty() {
            return false;
        }
        self.connected_by(container_id, sockets_in_use(pid), |tables| {
            tables.iter().any(|table| {
                std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
                    .map(|text| {
                        let open = established_local_ports(&text);
                        ports.iter().any(|p| open.contains(p))
                    })
                    .unwrap_or(false)
            })
        })
    }

    /// [`Connections::connected`] given the namespace's socket counts (`None`: unreadable) and
    /// how to walk its tables (`walk(&["tcp", "tcp6"])`, only those with sockets in use).
    fn connected_by(
        &mut self,
        container_id: &str,
        in_use: Option<(u64, u64)>,
        walk: impl FnOnce(&[&str]) -> bool,
    ) -> bool {
        let Some(in_use) = in_use else {
            self.walked.remove(container_id);
            return false;
        };
        if let Some(w) = self.walked.get(container_id) {
            if w.in_use == in_use && w.at.elapsed() < RECHECK {
                return w.connected;
            }
        }
        let tables: Vec<&str> = [("tcp", in_use.0), ("tcp6", in_use.1)]
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(t, _)| *t)
            .collect();
        let connected = !tables.is_empty() && walk(&tables);
        self.walked.insert(
            container_id.to_owned(),
            Walked {
                in_use,
                connected,
                at: Instant::now(),
            },
        );
        connected
    }

    /// Forgets every container but those `live` keeps.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.walked.retain(|id, _| live(id));
    }

    /// Walks made so far that are still remembered (for tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.walked.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_established_local_ports_of_tcp_and_tcp6() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n\
           1: 0200A8C0:1F90 0100A8C0:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1\n\
           2: 0200A8C0:C350 08080808:0050 01 00000000:00000000 00:00000000 00000000     0        0 3 1\n\
           3: 0200A8C0:1F91 0100A8C0:D2F1 06 00000000:00000000 00:00000000 00000000     0        0 0 1\n\
           garbage\n";
        // 8080 established, 50000 (an outgoing connection's local port) established; 8080's
        // listener (0A) and 8081 in TIME_WAIT (06) are not.
        assert_eq!(established_local_ports(tcp), HashSet::from([8080, 50000]));
        let tcp6 = "  sl  local_address                         remote_address                        st\n\
           0: 0000000000000000FFFF00000200A8C0:22B8 0000000000000000FFFF00000100A8C0:E0D2 01 00000000:00000000 00:00000000 00000000  0 0 9 1\n";
        assert_eq!(established_local_ports(tcp6), HashSet::from([8888]));
        assert!(established_local_ports("").is_empty());
    }

    #[test]
    fn touches_only_move_forward_and_readings_are_means_since_the_last_take() {
        let a = Activity::default();
        assert_eq!(a.take("k"), Report::default());
        a.touch_at("k", 10.0);
        a.touch_at("k", 5.0);
        a.sample("k", "cpu", 10.0);
        a.sample("k", "cpu", 30.0);
        a.sample("k", "cuda.device", 90.0);
        a.sample("k", "mem", f64::NAN);
        let r = a.take("k");
        assert_eq!(r.last_activity, Some(10.0));
        assert_eq!(
            r.utilization,
            BTreeMap::from([("cpu".to_owned(), 20.0), ("cuda.device".to_owned(), 90.0)])
        );
        // The readings were taken; the last activity stays.
        assert_eq!(
            a.take("k"),
            Report {
                last_activity: Some(10.0),
                utilization: BTreeMap::new()
            }
        );
        a.retain(|id| id != "k");
        assert_eq!(a.take("k"), Report::default());
    }

    #[test]
    fn reads_the_tcp_sockets_in_use() {
        let v4 =
            "sockets: used 39\nTCP: inuse 26 orphan 0 tw 3 alloc 556 mem 228\nUDP: inuse 0 mem 0\n";
        assert_eq!(tcp_inuse(v4), Some(26));
        let v6 = "TCP6: inuse 2\nUDP6: inuse 0\n";
        assert_eq!(tcp_inuse(v6), Some(2));
        assert_eq!(tcp_inuse("UDP: inuse 4\n"), None);
        assert_eq!(tcp_inuse(""), None);
    }

    #[test]
    fn tables_are_walked_only_when_the_counts_change() {
        let mut c = Connections::default();
        let walks = std::cell::Cell::new(0);
        let ask = |c: &mut Connections, in_use, answer: bool| {
            c.connected_by("k", in_use, |tables: &[&str]| {
                walks.set(walks.get() + 1);
                assert!(!tables.is_empty());
                answer
            })
        };
        assert!(!ask(&mut c, Some((3, 0)), false));
        assert_eq!(walks.get(), 1);
        // The same counts: the last answer, no walk (even if a walk would say otherwise).
        assert!(!ask(&mut c, Some((3, 0)), true));
        assert_eq!(walks.get(), 1);
        // A socket more: walked.
        assert!(ask(&mut c, Some((4, 0)), true));
        assert!(ask(&mut c, Some((4, 0)), false));
        assert_eq!(walks.get(), 2);
        // An IPv6 one: walked.
        assert!(!ask(&mut c, Some((4, 1)), false));
        assert_eq!(walks.get(), 3);
        // No sockets at all: nothing to walk, not connected.
        assert!(!ask(&mut c, Some((0, 0)), true));
        assert_eq!(walks.get(), 3);
        // Unreadable (the container is gone): forgotten.
        assert!(!ask(&mut c, None, true));
        assert_eq!(c.remembered(), 0);
        // Past RECHECK the same counts are walked again.
        assert!(!ask(&mut c, Some((5, 0)), false));
        c.walked.get_mut("k").unwrap().at -= RECHECK;
        assert!(ask(&mut c, Some((5, 0)), true));
        assert_eq!(walks.get(), 5);
        c.retain(|id| id != "k");
        assert_eq!(c.remembered(), 0);
    }

    #[test]
    fn a_connection_in_a_real_namespace_is_seen_and_its_close_too() {
        // This process's own namespace (other processes may open and close sockets in it too:
        // each change of the counts only makes another walk, so the answer comes in a round or
        // two).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id();
        let mut c = Connections::default();
        let until = |c: &mut Connections, want: bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.connected("k", me, &[port]) != want {
                assert!(Instant::now() < deadline, "not {want} in 10 s");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        until(&mut c, false);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (served, _) = listener.accept().unwrap();
        until(&mut c, true);
        drop((client, served));
        until(&mut c, false);
    }

    #[test]
    fn no_service_ports_is_no_connection() {
        let mut c = Connections::default();
        assert!(!c.connected("k", std::process::id(), &[]));
        // A process that does not exist has no tables.
        assert!(!c.connected("k", u32::MAX, &[80]));
        assert_eq!(c.remembered(), 0);
    }
}
