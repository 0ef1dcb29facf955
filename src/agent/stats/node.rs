//! Node-wide counters from procfs, read with the `procfs` crate.

use std::collections::HashSet;
use std::io;

use procfs::prelude::*;
use procfs::{CpuTime, DiskStat, KernelStats, Meminfo, ProcError};

/// One reading of the node's cumulative counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSample {
    /// CPU time spent busy, in clock ticks (usually 1/100 s) summed over CPUs: total minus
    /// idle and iowait.
    pub cpu_busy_ticks: u64,
    /// All CPU time, in clock ticks summed over CPUs, from the `cpu` line of `/proc/stat`: user,
    /// nice, system, idle, iowait, irq, softirq and steal (guest time is already in user/nice).
    pub cpu_total_ticks: u64,
    /// Number of CPUs listed in `/proc/stat` (online CPUs).
    pub cpu_count: usize,
    /// `MemTotal`, in bytes.
    pub mem_total_bytes: u64,
    /// `MemAvailable`, in bytes (`MemFree + Buffers + Cached` on kernels without it).
    pub mem_available_bytes: u64,
    /// Bytes received, summed over the interfaces of this process's network namespace except
    /// `lo` (bridges and veths included, so container traffic can count twice).
    pub net_rx_bytes: u64,
    /// Bytes sent, summed like `net_rx_bytes`.
    pub net_tx_bytes: u64,
    /// Bytes read (`/proc/diskstats` sectors × 512), summed over whole disks: partitions,
    /// `loop`, `ram`, `zram` and the stacked `dm-`/`md` devices are excluded, so each I/O is
    /// counted once.
    pub disk_read_bytes: u64,
    /// Bytes written, summed like `disk_read_bytes`.
    pub disk_write_bytes: u64,
}

/// Reads `/proc/stat`, `/proc/meminfo`, `/proc/net/dev` and `/proc/diskstats`.
///
/// # Errors
/// The [`ProcError`] of the first file that cannot be read or parsed.
pub fn read() -> Result<NodeSample, ProcError> {
    let stat = KernelStats::current()?;
    let (cpu_busy_ticks, cpu_total_ticks) = cpu_ticks(&stat.total);
    let mem = Meminfo::current()?;
    let (net_rx_bytes, net_tx_bytes) = net_totals(procfs::net::dev_status()?.values());
    let (disk_read_bytes, disk_write_bytes) = disk_totals(&procfs::diskstats()?);
    Ok(NodeSample {
        cpu_busy_ticks,
        cpu_total_ticks,
        cpu_count: stat.cpu_time.len(),
        mem_total_bytes: mem.mem_total,
        mem_available_bytes: mem.mem_available.unwrap_or_else(|| {
            mem.mem_free
                .saturating_add(mem.buffers)
                .saturating_add(mem.cached)
        }),
        net_rx_bytes,
        net_tx_bytes,
        disk_read_bytes,
        disk_write_bytes,
    })
}

/// CPU utilization of the node between two samples, in percent of one CPU: 0 to
/// `100 × now.cpu_count`. Returns 0 when no time passed or the counters went backwards.
pub fn cpu_util_pct(prev: &NodeSample, now: &NodeSample) -> f64 {
    let total = now.cpu_total_ticks.saturating_sub(prev.cpu_total_ticks);
    let busy = now.cpu_busy_ticks.saturating_sub(prev.cpu_busy_ticks);
    if total == 0 {
        return 0.0;
    }
    // Busy can outgrow total when iowait decreases (proc(5) warns it may).
    let fraction = (busy as f64 / total as f64).clamp(0.0, 1.0);
    fraction * 100.0 * now.cpu_count as f64
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, usually 100): the unit of the CPU times
/// of `/proc/stat`.
pub fn clock_ticks_per_second() -> f64 {
    procfs::ticks_per_second() as f64
}

/// Bytes `(received, sent)` over the interfaces of the network namespace of process `pid`
/// (from `/proc/<pid>/net/dev`), except `lo`: a container's traffic, given its init's pid.
///
/// # Errors
/// `NotFound` when the process is gone, `PermissionDenied`, `InvalidInput` for a pid beyond
/// `i32::MAX`, or another I/O error when the file cannot be read or parsed.
pub fn net_dev_of_pid(pid: u32) -> io::Result<(u64, u64)> {
    let pid = i32::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("pid {pid}")))?;
    let devices = procfs::process::Process::new(pid)
        .and_then(|p| p.dev_status())
        .map_err(to_io_error)?;
    Ok(net_totals(devices.values()))
}

fn cpu_ticks(t: &CpuTime) -> (u64, u64) {
    let idle = t.idle.saturating_add(t.iowait.unwrap_or(0));
    let total = [
        t.user,
        t.nice,
        t.system,
        t.irq.unwrap_or(0),
        t.softirq.unwrap_or(0),
        t.steal.unwrap_or(0),
    ]
    .into_iter()
    .fold(idle, u64::saturating_add);
    (total - idle, total)
}

fn net_totals<'a>(devices: impl Iterator<Item = &'a procfs::net::DeviceStatus>) -> (u64, u64) {
    devices
        .filter(|d| d.name != "lo")
        .fold((0, 0), |(rx, tx), d| {
            (
                rx.saturating_add(d.recv_bytes),
                tx.saturating_add(d.sent_bytes),
            )
        })
}

fn disk_totals(disks: &[DiskStat]) -> (u64, u64) {
    let names: HashSet<&str> = disks.iter().map(|d| d.name.as_str()).collect();
    disks
        .iter()
        .filter(|d| is_counted_disk(&d.name, &names))
        .fold((0, 0), |(r, w), d| {
            (
                r.saturating_add(d.sectors_read.saturating_mul(512)),
                w.saturating_add(d.sectors_written.saturating_mul(512)),
            )
        })
}

/// Whether a `/proc/diskstats` device counts toward the node's disk I/O: not virtual or stacked
/// (`loop`, `ram`, `zram`, `dm-`, `md`) and not a partition of another listed device.
fn is_counted_disk(name: &str, all: &HashSet<&str>) -> bool {
    const SKIPPED: [&str; 5] = ["loop", "ram", "zram", "dm-", "md"];
    !SKIPPED.iter().any(|prefix| name.starts_with(prefix)) && !is_partition(name, all)
}

/// The kernel names a partition `<disk><n>`, or `<disk>p<n>` when the disk's name ends in a
/// digit (`sda1`, `nvme0n1p2`, `mmcblk0p1`).
fn is_partition(name: &str, all: &HashSet<&str>) -> bool {
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (1..name.len())
        .filter(|&i| name.is_char_boundary(i))
        .any(|i| {
            let (disk, suffix) = name.split_at(i);
            if !all.contains(disk) {
                return false;
            }
            if disk.ends_with(|c: char| c.is_ascii_digit()) {
                suffix.strip_prefix('p').is_some_and(all_digits)
            } else {
                all_digits(suffix)
            }
        })
}

fn to_io_error(e: ProcError) -> io::Error {
    let kind = match &e {
        ProcError::NotFound(_) => io::ErrorKind::NotFound,
        ProcError::PermissionDenied(_) => io::ErrorKind::PermissionDenied,
        ProcError::Io(inner, _) => inner.kind(),
        _ => io::ErrorKind::InvalidData,
    };
    io::Error::new(kind, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_live_host() {
        let sample = read().unwrap();
        assert!(sample.mem_total_bytes > 0, "{sample:?}");
        assert!(
            sample.mem_available_bytes <= sample.mem_total_bytes,
            "{sample:?}"
        );
        assert!(sample.cpu_total_ticks > 0, "{sample:?}");
        assert!(
            sample.cpu_busy_ticks <= sample.cpu_total_ticks,
            "{sample:?}"
        );
        assert!(sample.cpu_count > 0, "{sample:?}");
    }

    #[test]
    fn cpu_ticks_from_proc_stat_text() {
        let text = "cpu  100 5 50 800 20 3 2 10 7 0\ncpu0 100 5 50 800 20 3 2 10 7 0\nintr 0\nctxt 1\nbtime 2\nprocesses 3\n";
        let stat = KernelStats::from_read(text.as_bytes(), procfs::current_system_info()).unwrap();
        assert_eq!(cpu_ticks(&stat.total), (100 + 5 + 50 + 3 + 2 + 10, 990));
    }

    #[test]
    fn cpu_util_is_in_percent_of_one_cpu() {
        let prev = NodeSample {
            cpu_busy_ticks: 1_000,
            cpu_total_ticks: 10_000,
            cpu_count: 4,
            ..Default::default()
        };
        let now = NodeSample {
            cpu_busy_ticks: 1_200,
            cpu_total_ticks: 10_400,
            cpu_count: 4,
            ..Default::default()
        };
        // 200 of 400 ticks busy on 4 CPUs: two CPUs' worth.
        assert!((cpu_util_pct(&prev, &now) - 200.0).abs() < 1e-9);
        assert_eq!(cpu_util_pct(&prev, &prev), 0.0);
        assert_eq!(cpu_util_pct(&now, &prev), 0.0);
        let odd = NodeSample {
            cpu_busy_ticks: 2_000,
            ..now.clone()
        };
        assert_eq!(cpu_util_pct(&prev, &odd), 400.0);
    }

    #[test]
    fn disk_totals_count_whole_physical_disks_once() {
        let text = "\
   8       0 sda 10 0 100 0 5 0 200 0 0 0 0 0 0 0 0 0 0
   8       1 sda1 10 0 90 0 5 0 190 0 0 0 0 0 0 0 0 0 0
 259       0 nvme0n1 1 0 1000 0 1 0 2000 0 0 0 0
 259       1 nvme0n1p1 1 0 999 0 1 0 1999 0 0 0 0
 259       2 nvme0n10 1 0 3 0 1 0 4 0 0 0 0
 254       0 vda 29502 5984 2685058 10235 10521 28518 4483320 50207 0 4808 60867 2118 0 325112 358 1561 656
 253       0 dm-0 1 0 50 0 1 0 60 0 0 0 0
   7       0 loop0 1 0 7 0 1 0 7 0 0 0 0
 252       0 zram0 1 0 7 0 1 0 7 0 0 0 0
   9       0 md0 1 0 7 0 1 0 7 0 0 0 0";
        let disks: Vec<DiskStat> = text
            .lines()
            .map(|l| DiskStat::from_line(l).unwrap())
            .collect();
        let sectors_read = 100 + 1000 + 3 + 2_685_058;
        let sectors_written = 200 + 2000 + 4 + 4_483_320;
        assert_eq!(
            disk_totals(&disks),
            (sectors_read * 512, sectors_written * 512)
        );
    }

    #[test]
    fn partitions_follow_kernel_naming() {
        let all: HashSet<&str> = [
            "sda",
            "sda1",
            "nvme0n1",
            "nvme0n1p2",
            "nvme0n10",
            "mmcblk0",
            "mmcblk0p1",
            "sdaa",
        ]
        .into();
        let partitions: Vec<&str> = all
            .iter()
            .copied()
            .filter(|n| is_partition(n, &all))
            .collect();
        let mut partitions = partitions;
        partitions.sort();
        assert_eq!(partitions, ["mmcblk0p1", "nvme0n1p2", "sda1"]);
    }

    #[test]
    fn net_dev_of_this_process() {
        let (rx, tx) = net_dev_of_pid(std::process::id()).unwrap();
        let node = read().unwrap();
        // Same namespace as /proc/net/dev; counters only grow between the two reads.
        assert!(
            rx <= node.net_rx_bytes && tx <= node.net_tx_bytes,
            "{rx} {tx} {node:?}"
        );
        assert_eq!(
            net_dev_of_pid(i32::MAX as u32).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            net_dev_of_pid(u32::MAX).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
