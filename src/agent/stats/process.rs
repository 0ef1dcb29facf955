//! A kernel's processes as upstream's per-process stats read them
//! (`CPUPlugin.gather_process_measures` and `MemoryPlugin.gather_process_measures` of
//! `ai/backend/agent/docker/intrinsic.py`, through psutil): each process of the container's
//! cgroup (`cgroup.procs`, host pids), its CPU time (user + system), resident memory and block
//! I/O bytes, from `/proc/<pid>/stat`, `statm` and `io`.

use std::io;

use super::cgroup::CgroupPaths;

/// One process now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessSample {
    /// CPU time used (user + system), milliseconds.
    pub cpu_used_ms: f64,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
    /// Bytes read from and written to block devices (`None` when `/proc/<pid>/io` cannot be
    /// read, e.g. without the privilege).
    pub io: Option<(u64, u64)>,
}

/// The host pids in the container's cgroup (its `cgroup.procs`).
///
/// # Errors
/// The file cannot be read (the container is gone).
pub fn pids(paths: &CgroupPaths) -> io::Result<Vec<u32>> {
    let text = std::fs::read_to_string(paths.cpu.join("cgroup.procs"))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Process `pid` now; `None` when it is gone.
pub fn read(pid: u32) -> Option<ProcessSample> {
    let p = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    let stat = p.stat().ok()?;
    let ticks = super::node::clock_ticks_per_second();
    let rss_pages = p.statm().ok()?.resident;
    Some(ProcessSample {
        cpu_used_ms: (stat.utime + stat.stime) as f64 * 1000.0 / ticks,
        rss_bytes: rss_pages * procfs::page_size(),
        io: p.io().ok().map(|io| (io.read_bytes, io.write_bytes)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = read(std::process::id()).expect("this process");
        assert!(me.rss_bytes > 0);
        assert!(me.cpu_used_ms >= 0.0);
        let paths = CgroupPaths::for_pid(std::process::id());
        if let Ok(paths) = paths {
            if let Ok(pids) = pids(&paths) {
                assert!(pids.iter().all(|&p| p > 0));
            }
        }
    }
}
