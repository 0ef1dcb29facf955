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
//!   each container round ([`service_connected`]).
//!
//! Utilization is a mean per slot over the stats sampler's readings since the last heartbeat
//! took them ([`Activity::take`]): `cpu` (% of the cores the kernel holds), `mem` (% of its
//! limit) and each `cuda.*` slot it holds (the device utilization NVML or the mock accelerator
//! reports, as `backendai_container_utilization{cuda_util}`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

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

/// Whether the network namespace of process `pid` (a container's init) holds an ESTABLISHED
/// TCP connection whose local port is one of `ports` (its service ports' container ports):
/// someone is connected to a service. Tables that cannot be read (the process is gone) count
/// as none.
pub fn service_connected(pid: u32, ports: &[u16]) -> bool {
    if ports.is_empty() {
        return false;
    }
    ["tcp", "tcp6"].iter().any(|table| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
            .map(|text| {
                let open = established_local_ports(&text);
                ports.iter().any(|p| open.contains(p))
            })
            .unwrap_or(false)
    })
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
    fn no_service_ports_is_no_connection() {
        assert!(!service_connected(std::process::id(), &[]));
        // A process that does not exist has no tables.
        assert!(!service_connected(u32::MAX, &[80]));
    }
}
