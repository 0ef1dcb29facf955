//! Per-container counters read directly from cgroup files, v1 and v2.
//!
//! [`CgroupPaths::resolve`] finds a process's cgroup directories from the text of
//! `/proc/<pid>/cgroup` and `/proc/self/mountinfo`; [`read`] turns the files there into a
//! [`ContainerSample`]. The `parse_*` functions are pure and take the text of one file each.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Which cgroup hierarchy a [`CgroupPaths`] points into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies (`cpuacct`, `memory`, `blkio`, ...).
    V1,
    /// The unified hierarchy.
    V2,
}

/// The cgroup directories holding one process's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupPaths {
    /// Which file formats the directories use.
    pub version: CgroupVersion,
    /// v1: the `cpuacct` controller directory; v2: the unified directory.
    pub cpu: PathBuf,
    /// v1: the `memory` controller directory; v2: the unified directory.
    pub memory: PathBuf,
    /// v1: the `blkio` controller directory; v2: the unified directory.
    pub io: PathBuf,
}

impl CgroupPaths {
    /// Resolves the cgroup directories of a process from the text of its `/proc/<pid>/cgroup`
    /// and of `/proc/self/mountinfo` (the reader's mounts).
    ///
    /// v1 is chosen when the process has a v1 `memory` path and the `memory`, `cpuacct` and
    /// `blkio` hierarchies are all mounted (separately or jointly, e.g. `cpu,cpuacct`); this
    /// covers hybrid hosts, whose cgroup2 mount holds no controllers. Otherwise the `0::<path>`
    /// line and a cgroup2 mount give v2. A mount whose root is not a prefix of the process's
    /// cgroup path (e.g. a container's own view of another container) is not used.
    ///
    /// Returns `None` when the directories cannot be found; malformed lines are skipped.
    pub fn resolve(proc_cgroup: &str, mountinfo: &str) -> Option<CgroupPaths> {
        let memberships: Vec<Membership<'_>> =
            proc_cgroup.lines().filter_map(parse_membership).collect();
        let mounts: Vec<Mount> = mountinfo.lines().filter_map(parse_mount).collect();

        let v1_dir = |controller: &str| {
            let path = memberships
                .iter()
                .find(|m| m.controllers.contains(&controller))?
                .path;
            mounts
                .iter()
                .filter(|m| m.controllers.iter().any(|c| c == controller))
                .find_map(|m| m.locate(path))
        };
        if let Some(memory) = v1_dir("memory") {
            return Some(CgroupPaths {
                version: CgroupVersion::V1,
                cpu: v1_dir("cpuacct")?,
                memory,
                io: v1_dir("blkio")?,
            });
        }

        let path = memberships.iter().find(|m| m.unified)?.path;
        let dir = mounts
            .iter()
            .filter(|m| m.unified)
            .find_map(|m| m.locate(path))?;
        Some(CgroupPaths {
            version: CgroupVersion::V2,
            cpu: dir.clone(),
            memory: dir.clone(),
            io: dir,
        })
    }

    /// Resolves the cgroup directories of process `pid` by reading `/proc/<pid>/cgroup` and
    /// `/proc/self/mountinfo`.
    ///
    /// # Errors
    /// The error of reading either file (`NotFound` when the process is gone), or
    /// `io::ErrorKind::NotFound` when [`CgroupPaths::resolve`] finds no directories.
    pub fn for_pid(pid: u32) -> io::Result<CgroupPaths> {
        let proc_cgroup = read_text(&Path::new("/proc").join(pid.to_string()).join("cgroup"))?;
        let mountinfo = read_text(Path::new("/proc/self/mountinfo"))?;
        Self::resolve(&proc_cgroup, &mountinfo).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no cgroup directories found for pid {pid}"),
            )
        })
    }
}

/// One reading of a container's cumulative counters. All sizes are in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ContainerSample {
    /// Cumulative CPU time used, in nanoseconds (v1 `cpuacct.usage`; v2 `cpu.stat`
    /// `usage_usec` × 1000).
    pub cpu_used_ns: u64,
    /// Memory in use excluding reclaimable page cache: v1 `memory.usage_in_bytes` minus
    /// `total_inactive_file` (or `total_cache` when absent); v2 `memory.current` minus
    /// `inactive_file`.
    pub mem_usage_bytes: u64,
    /// Anonymous memory: v1 `total_rss`; v2 `anon`.
    pub mem_rss_bytes: u64,
    /// Page cache: v1 `total_cache`; v2 `file`.
    pub mem_cache_bytes: u64,
    /// Swap in use: v1 `total_swap`, or `memory.memsw.usage_in_bytes` minus usage; v2
    /// `memory.swap.current`. 0 when swap is not accounted.
    pub mem_swap_bytes: u64,
    /// Memory limit; `None` when unlimited (v1 value ≥ 2^62, v2 `max`).
    pub mem_limit_bytes: Option<u64>,
    /// Bytes read from block devices, summed over devices.
    pub io_read_bytes: u64,
    /// Bytes written to block devices, summed over devices.
    pub io_write_bytes: u64,
}

/// Reads the counters in `paths`.
///
/// v1: `cpuacct.usage`, `memory.usage_in_bytes`, `memory.limit_in_bytes`, `memory.stat`,
/// optional `memory.memsw.usage_in_bytes`, and the first of `blkio.throttle.io_service_bytes`,
/// `blkio.io_service_bytes_recursive`, `blkio.bfq.io_service_bytes_recursive` that lists a
/// device. v2: `cpu.stat`, `memory.current`, `memory.max`, `memory.stat`, optional
/// `memory.swap.current` and `io.stat`.
///
/// # Errors
/// The I/O error (its kind kept, the path added to its message) when a CPU or memory file
/// cannot be read (`NotFound` once the container is gone); `InvalidData` when such a file, or
/// an optional file that exists, is malformed. Missing optional files count as 0.
pub fn read(paths: &CgroupPaths) -> io::Result<ContainerSample> {
    match paths.version {
        CgroupVersion::V1 => read_v1(paths),
        CgroupVersion::V2 => read_v2(paths),
    }
}

/// v1 blkio files tried in order; the first that lists a device is used.
const BLKIO_FILES: [&str; 3] = [
    "blkio.throttle.io_service_bytes",
    "blkio.io_service_bytes_recursive",
    "blkio.bfq.io_service_bytes_recursive",
];

fn read_v1(paths: &CgroupPaths) -> io::Result<ContainerSample> {
    let cpu_used_ns = read_parsed(&paths.cpu.join("cpuacct.usage"), parse_u64)?;
    let usage = read_parsed(&paths.memory.join("memory.usage_in_bytes"), parse_u64)?;
    let limit = read_parsed(&paths.memory.join("memory.limit_in_bytes"), parse_limit_v1)?;
    let stat_text = read_text(&paths.memory.join("memory.stat"))?;
    let stat = parse_flat_keyed(&stat_text);
    let memsw = read_optional(&paths.memory.join("memory.memsw.usage_in_bytes"), parse_u64)?;

    let mut io = None;
    for name in BLKIO_FILES {
        io = read_optional(&paths.io.join(name), |text| Some(parse_blkio_v1(text)))?.flatten();
        if io.is_some() {
            break;
        }
    }
    let (io_read_bytes, io_write_bytes) = io.unwrap_or((0, 0));

    let stat_value =
        |total: &str, local: &str| stat.get(total).or_else(|| stat.get(local)).copied();
    let cache = stat_value("total_cache", "cache").unwrap_or(0);
    let inactive_file = stat_value("total_inactive_file", "inactive_file").unwrap_or(cache);
    let swap =
        stat_value("total_swap", "swap").or_else(|| memsw.map(|memsw| memsw.saturating_sub(usage)));
    Ok(ContainerSample {
        cpu_used_ns,
        mem_usage_bytes: usage.saturating_sub(inactive_file),
        mem_rss_bytes: stat_value("total_rss", "rss").unwrap_or(0),
        mem_cache_bytes: cache,
        mem_swap_bytes: swap.unwrap_or(0),
        mem_limit_bytes: limit,
        io_read_bytes,
        io_write_bytes,
    })
}

fn read_v2(paths: &CgroupPaths) -> io::Result<ContainerSample> {
    let cpu_used_ns = read_parsed(&paths.cpu.join("cpu.stat"), parse_cpu_stat_v2)?;
    let current = read_parsed(&paths.memory.join("memory.current"), parse_u64)?;
    let limit = read_parsed(&paths.memory.join("memory.max"), parse_memory_max_v2)?;
    let stat_text = read_text(&paths.memory.join("memory.stat"))?;
    let stat = parse_flat_keyed(&stat_text);
    let swap = read_optional(&paths.memory.join("memory.swap.current"), parse_u64)?;
    let io = read_optional(&paths.io.join("io.stat"), |text| {
        Some(parse_io_stat_v2(text))
    })?;

    let stat_value = |key: &str| stat.get(key).copied().unwrap_or(0);
    let (io_read_bytes, io_write_bytes) = io.unwrap_or((0, 0));
    Ok(ContainerSample {
        cpu_used_ns,
        mem_usage_bytes: current.saturating_sub(stat_value("inactive_file")),
        mem_rss_bytes: stat_value("anon"),
        mem_cache_bytes: stat_value("file"),
        mem_swap_bytes: swap.unwrap_or(0),
        mem_limit_bytes: limit,
        io_read_bytes,
        io_write_bytes,
    })
}

/// Parses a file holding one unsigned integer (`cpuacct.usage`, `memory.current`, ...).
/// Returns `None` unless the trimmed text is exactly one `u64`.
pub fn parse_u64(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// v1 limits at or above this many bytes mean "unlimited" (the kernel reports
/// `PAGE_COUNTER_MAX` pages, 9223372036854771712 bytes with 4 KiB pages).
const V1_UNLIMITED: u64 = 1 << 62;

/// Parses v1 `memory.limit_in_bytes` (bytes). Returns `Some(None)` when unlimited (≥ 2^62),
/// `None` when malformed.
pub fn parse_limit_v1(text: &str) -> Option<Option<u64>> {
    parse_u64(text).map(|limit| (limit < V1_UNLIMITED).then_some(limit))
}

/// Parses v2 `memory.max` (bytes or `max`). Returns `Some(None)` for `max`, `None` when
/// malformed.
pub fn parse_memory_max_v2(text: &str) -> Option<Option<u64>> {
    match text.trim() {
        "max" => Some(None),
        value => value.parse().ok().map(Some),
    }
}

/// Parses a flat keyed file (`<key> <u64>` per line: v1 and v2 `memory.stat`, v2 `cpu.stat`).
/// Lines that are not exactly a key and a `u64` are skipped.
pub fn parse_flat_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (key, value, None) = (fields.next()?, fields.next()?, fields.next()) else {
                return None;
            };
            Some((key, value.parse().ok()?))
        })
        .collect()
}

/// Parses v2 `cpu.stat` into cumulative CPU time in nanoseconds (`usage_usec` × 1000,
/// saturating). Returns `None` when `usage_usec` is missing or malformed.
pub fn parse_cpu_stat_v2(text: &str) -> Option<u64> {
    parse_flat_keyed(text)
        .get("usage_usec")
        .map(|usec| usec.saturating_mul(1000))
}

/// Parses a v1 blkio byte-count file (`blkio.throttle.io_service_bytes` and the like: lines
/// `<major>:<minor> <Read|Write|Sync|Async|Discard|Total> <bytes>`, then `Total <bytes>`) into
/// `(read_bytes, write_bytes)` summed over devices (saturating).
///
/// Returns `None` when the file lists no device (empty, or only the `Total` line), so that the
/// caller can try another file. Malformed lines are skipped.
pub fn parse_blkio_v1(text: &str) -> Option<(u64, u64)> {
    let mut found = false;
    let (mut read, mut write) = (0u64, 0u64);
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(device), Some(op), Some(value), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        if !device.contains(':') {
            continue;
        }
        found = true;
        match op {
            "Read" => read = read.saturating_add(value),
            "Write" => write = write.saturating_add(value),
            _ => {}
        }
    }
    found.then_some((read, write))
}

/// Parses v2 `io.stat` (lines `<major>:<minor> rbytes=<n> wbytes=<n> rios=<n> ...`) into
/// `(read_bytes, write_bytes)` summed over devices (saturating). Malformed entries are skipped;
/// an empty file gives `(0, 0)`.
pub fn parse_io_stat_v2(text: &str) -> (u64, u64) {
    let (mut read, mut write) = (0u64, 0u64);
    for line in text.lines() {
        for (key, value) in line
            .split_whitespace()
            .skip(1)
            .filter_map(|entry| entry.split_once('='))
        {
            let Ok(value) = value.parse::<u64>() else {
                continue;
            };
            match key {
                "rbytes" => read = read.saturating_add(value),
                "wbytes" => write = write.saturating_add(value),
                _ => {}
            }
        }
    }
    (read, write)
}

/// One line of `/proc/<pid>/cgroup`: `<hierarchy id>:<controllers>:<path>`.
struct Membership<'a> {
    /// v1 controllers of the hierarchy (`["cpu", "cpuacct"]`, `["name=systemd"]`).
    controllers: Vec<&'a str>,
    /// True for the cgroup v2 line `0::<path>`.
    unified: bool,
    path: &'a str,
}

fn parse_membership(line: &str) -> Option<Membership<'_>> {
    let mut fields = line.splitn(3, ':');
    let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
    if !path.starts_with('/') {
        return None;
    }
    let unified = id == "0" && controllers.is_empty();
    let controllers = controllers.split(',').filter(|c| !c.is_empty()).collect();
    Some(Membership {
        controllers,
        unified,
        path,
    })
}

/// A cgroup or cgroup2 line of mountinfo.
struct Mount {
    /// The cgroup path that the mount point shows.
    root: PathBuf,
    mount_point: PathBuf,
    /// v1 super options (which include the controllers); empty for cgroup2.
    controllers: Vec<String>,
    unified: bool,
}

impl Mount {
    /// The directory showing cgroup `path`, when this mount shows it.
    fn locate(&self, path: &str) -> Option<PathBuf> {
        let relative = Path::new(path).strip_prefix(&self.root).ok()?;
        if relative.as_os_str().is_empty() {
            Some(self.mount_point.clone())
        } else {
            Some(self.mount_point.join(relative))
        }
    }
}

/// Parses a mountinfo line (`<id> <parent> <dev> <root> <mount point> <options> [optional
/// fields...] - <fstype> <source> <super options>`), keeping cgroup and cgroup2 mounts.
fn parse_mount(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let separator = 6 + fields.get(6..)?.iter().position(|f| *f == "-")?;
    let fstype = *fields.get(separator + 1)?;
    let unified = match fstype {
        "cgroup2" => true,
        "cgroup" => false,
        _ => return None,
    };
    let controllers = if unified {
        Vec::new()
    } else {
        fields
            .get(separator + 3)?
            .split(',')
            .map(str::to_owned)
            .collect()
    };
    Some(Mount {
        root: PathBuf::from(unescape_octal(fields[3])),
        mount_point: PathBuf::from(unescape_octal(fields[4])),
        controllers,
        unified,
    })
}

/// Undoes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], digits) {
            (b'\\', Some(d)) => {
                let value = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads a file, adding its path to the error message (the error kind is kept).
fn read_text(path: &Path) -> io::Result<String> {
    fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Reads and parses a required file.
fn read_parsed<T>(path: &Path, parse: impl FnOnce(&str) -> Option<T>) -> io::Result<T> {
    let text = read_text(path)?;
    parse(&text).ok_or_else(|| invalid(path, &text))
}

/// Reads and parses an optional file: `Ok(None)` when it does not exist.
fn read_optional<T>(path: &Path, parse: impl FnOnce(&str) -> Option<T>) -> io::Result<Option<T>> {
    match fs::read_to_string(path) {
        Ok(text) => parse(&text).map(Some).ok_or_else(|| invalid(path, &text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

fn invalid(path: &Path, text: &str) -> io::Error {
    let start: String = text.chars().take(80).collect();
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: unexpected content {start:?}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_ID: &str = "f104c1188282d7106ec3b5164a4398a1fa154bd0d7b3364a33d18197ad5260cd";
    const V2_ID: &str = "fc1c716708b2a47a736051ce5cda5f785880405682a2c1990869f2f0257fce52";

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cgroup")
    }

    fn resolve_fixture(name: &str) -> Option<CgroupPaths> {
        let dir = fixtures().join("proc").join(name);
        let proc_cgroup = fs::read_to_string(dir.join("cgroup")).unwrap();
        let mountinfo = fs::read_to_string(dir.join("mountinfo")).unwrap();
        CgroupPaths::resolve(&proc_cgroup, &mountinfo)
    }

    fn v1_paths(cpu: String, memory: String, io: String) -> CgroupPaths {
        CgroupPaths {
            version: CgroupVersion::V1,
            cpu: cpu.into(),
            memory: memory.into(),
            io: io.into(),
        }
    }

    #[test]
    fn resolves_this_hosts_v1_cgroupfs_layout() {
        // Separate cpu and cpuacct mounts, plus an empty cgroup2 at /sys/fs/cgroup/unified.
        let expected = v1_paths(
            format!("/sys/fs/cgroup/cpuacct/docker/{V1_ID}"),
            format!("/sys/fs/cgroup/memory/docker/{V1_ID}"),
            format!("/sys/fs/cgroup/blkio/docker/{V1_ID}"),
        );
        assert_eq!(resolve_fixture("host-v1-cgroupfs"), Some(expected));
    }

    #[test]
    fn resolves_inside_a_container_by_stripping_the_mount_root() {
        let expected = v1_paths(
            "/sys/fs/cgroup/cpuacct".into(),
            "/sys/fs/cgroup/memory".into(),
            "/sys/fs/cgroup/blkio".into(),
        );
        assert_eq!(resolve_fixture("in-container"), Some(expected));
    }

    #[test]
    fn resolves_hybrid_host_to_v1_with_joint_cpu_cpuacct_mount() {
        let scope = format!("system.slice/docker-{V1_ID}.scope");
        let expected = v1_paths(
            format!("/sys/fs/cgroup/cpu,cpuacct/{scope}"),
            format!("/sys/fs/cgroup/memory/{scope}"),
            format!("/sys/fs/cgroup/blkio/{scope}"),
        );
        assert_eq!(resolve_fixture("hybrid-systemd"), Some(expected));
    }

    #[test]
    fn resolves_v1_host_listing_cpuacct_cpu_in_either_order() {
        let scope = format!("system.slice/docker-{V1_ID}.scope");
        let expected = v1_paths(
            format!("/sys/fs/cgroup/cpu,cpuacct/{scope}"),
            format!("/sys/fs/cgroup/memory/{scope}"),
            format!("/sys/fs/cgroup/blkio/{scope}"),
        );
        assert_eq!(resolve_fixture("v1-systemd"), Some(expected));
    }

    #[test]
    fn resolves_pure_v2_host() {
        let dir = PathBuf::from(format!("/sys/fs/cgroup/system.slice/docker-{V2_ID}.scope"));
        let expected = CgroupPaths {
            version: CgroupVersion::V2,
            cpu: dir.clone(),
            memory: dir.clone(),
            io: dir,
        };
        assert_eq!(resolve_fixture("v2"), Some(expected));
    }

    #[test]
    fn hybrid_host_without_v1_memory_falls_back_to_v2() {
        let proc_cgroup = "2:cpu,cpuacct:/a\n1:name=systemd:/a\n0::/a\n";
        let mountinfo = "\
36 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
31 30 0:26 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
";
        let paths = CgroupPaths::resolve(proc_cgroup, mountinfo).unwrap();
        assert_eq!(paths.version, CgroupVersion::V2);
        assert_eq!(paths.memory, Path::new("/sys/fs/cgroup/unified/a"));
    }

    #[test]
    fn resolve_needs_all_three_v1_controllers_and_unescapes_mount_points() {
        let proc_cgroup = "3:blkio:/k\n2:memory:/k\n1:cpuacct:/k\n";
        let mounts = [
            "1 0 0:1 / /cg/cpu\\040acct rw - cgroup cgroup rw,cpuacct",
            "2 0 0:2 / /cg/memory rw - cgroup cgroup rw,memory",
            "3 0 0:3 / /cg/blkio rw - cgroup cgroup rw,blkio",
        ];
        let paths = CgroupPaths::resolve(proc_cgroup, &mounts.join("\n")).unwrap();
        assert_eq!(paths.cpu, Path::new("/cg/cpu acct/k"));
        assert_eq!(
            CgroupPaths::resolve(proc_cgroup, &mounts[..2].join("\n")),
            None
        );
    }

    #[test]
    fn resolve_survives_garbage() {
        let junk = [
            "",
            "\n\n",
            "::",
            "0::",
            "x",
            "1:memory:relative",
            "- - -",
            "1 2 3 4 5 6 - cgroup",
            "1 2 - cgroup2",
        ];
        for a in junk {
            for b in junk {
                assert_eq!(CgroupPaths::resolve(a, b), None, "{a:?} {b:?}");
            }
        }
        // A cgroup outside the mount's root (another container's view) is not resolved.
        let mountinfo = "75 74 0:29 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory";
        assert_eq!(
            CgroupPaths::resolve("4:memory:/docker/other\n", mountinfo),
            None
        );
    }

    #[test]
    fn reads_recorded_v1_container() {
        let root = fixtures().join("v1");
        let paths = CgroupPaths {
            version: CgroupVersion::V1,
            cpu: root.join("cpuacct/docker").join(V1_ID),
            memory: root.join("memory/docker").join(V1_ID),
            io: root.join("blkio/docker").join(V1_ID),
        };
        let expected = ContainerSample {
            cpu_used_ns: 39_549_222,
            mem_usage_bytes: 23_056_384 - 21_254_144,
            mem_rss_bytes: 53_248,
            mem_cache_bytes: 22_675_456,
            mem_swap_bytes: 0,
            mem_limit_bytes: Some(268_435_456),
            // blkio.throttle.io_service_bytes is "Total 0": the recursive file is used.
            io_read_bytes: 1_048_576 + 4_096,
            io_write_bytes: 16_777_216 + 8_192,
        };
        assert_eq!(read(&paths).unwrap(), expected);
    }

    #[test]
    fn reads_v2_container() {
        let dir = fixtures().join(format!("v2/system.slice/docker-{V2_ID}.scope"));
        let paths = CgroupPaths {
            version: CgroupVersion::V2,
            cpu: dir.clone(),
            memory: dir.clone(),
            io: dir,
        };
        let expected = ContainerSample {
            cpu_used_ns: 2_531_187_000,
            mem_usage_bytes: 150_994_944 - 33_554_432,
            mem_rss_bytes: 104_857_600,
            mem_cache_bytes: 41_943_040,
            mem_swap_bytes: 1_048_576,
            mem_limit_bytes: Some(2_147_483_648),
            io_read_bytes: 1_463_296 + 4_096,
            io_write_bytes: 20_480_000 + 8_192,
        };
        assert_eq!(read(&paths).unwrap(), expected);
    }

    #[test]
    fn read_errors_on_missing_required_files_and_zeroes_missing_optional_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let paths = CgroupPaths {
            version: CgroupVersion::V2,
            cpu: dir.clone(),
            memory: dir.clone(),
            io: dir.clone(),
        };
        assert_eq!(read(&paths).unwrap_err().kind(), io::ErrorKind::NotFound);

        fs::write(dir.join("cpu.stat"), "usage_usec 5\n").unwrap();
        fs::write(dir.join("memory.current"), "100\n").unwrap();
        fs::write(dir.join("memory.max"), "max\n").unwrap();
        assert_eq!(read(&paths).unwrap_err().kind(), io::ErrorKind::NotFound);
        fs::write(dir.join("memory.stat"), "inactive_file 30\nanon 60\n").unwrap();
        let sample = read(&paths).unwrap();
        assert_eq!(
            sample,
            ContainerSample {
                cpu_used_ns: 5000,
                mem_usage_bytes: 70,
                mem_rss_bytes: 60,
                ..Default::default()
            }
        );

        fs::write(dir.join("memory.current"), "lots\n").unwrap();
        assert_eq!(read(&paths).unwrap_err().kind(), io::ErrorKind::InvalidData);
        fs::write(dir.join("memory.current"), "100\n").unwrap();
        fs::write(dir.join("memory.swap.current"), "\n").unwrap();
        assert_eq!(read(&paths).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn v1_swap_from_memsw_and_cache_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        fs::write(dir.join("cpuacct.usage"), "7\n").unwrap();
        fs::write(dir.join("memory.usage_in_bytes"), "1000\n").unwrap();
        fs::write(dir.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        // No total_* keys (non-hierarchical), no inactive_file, no swap key: cache and memsw used.
        fs::write(dir.join("memory.stat"), "cache 300\nrss 600\n").unwrap();
        fs::write(dir.join("memory.memsw.usage_in_bytes"), "1250\n").unwrap();
        fs::write(
            dir.join("blkio.throttle.io_service_bytes"),
            "8:0 Read 10\n8:0 Write 20\nTotal 30\n",
        )
        .unwrap();
        fs::write(
            dir.join("blkio.io_service_bytes_recursive"),
            "8:0 Read 99\n",
        )
        .unwrap();
        let paths = CgroupPaths {
            version: CgroupVersion::V1,
            cpu: dir.clone(),
            memory: dir.clone(),
            io: dir,
        };
        let expected = ContainerSample {
            cpu_used_ns: 7,
            mem_usage_bytes: 700,
            mem_rss_bytes: 600,
            mem_cache_bytes: 300,
            mem_swap_bytes: 250,
            mem_limit_bytes: None,
            io_read_bytes: 10,
            io_write_bytes: 20,
        };
        assert_eq!(read(&paths).unwrap(), expected);
    }

    #[test]
    fn parses_single_values_and_limits() {
        assert_eq!(parse_u64("39549222\n"), Some(39_549_222));
        assert_eq!(parse_u64(""), None);
        assert_eq!(parse_u64("-1"), None);
        assert_eq!(parse_u64("1 2"), None);
        assert_eq!(parse_limit_v1("268435456\n"), Some(Some(268_435_456)));
        assert_eq!(parse_limit_v1("9223372036854771712\n"), Some(None));
        assert_eq!(parse_limit_v1("4611686018427387904"), Some(None));
        assert_eq!(
            parse_limit_v1("4611686018427387903"),
            Some(Some(4_611_686_018_427_387_903))
        );
        assert_eq!(parse_limit_v1("max"), None);
        assert_eq!(parse_memory_max_v2("max\n"), Some(None));
        assert_eq!(
            parse_memory_max_v2("2147483648\n"),
            Some(Some(2_147_483_648))
        );
        assert_eq!(parse_memory_max_v2("maximum"), None);
    }

    #[test]
    fn parses_flat_keyed_files_skipping_bad_lines() {
        let stat = parse_flat_keyed("cache 22708224\nrss 53248\nbad\nneg -1\nthree 1 2\n\nhierarchical_memory_limit 268435456\n");
        assert_eq!(stat.len(), 3);
        assert_eq!(stat["cache"], 22_708_224);
        assert_eq!(stat["hierarchical_memory_limit"], 268_435_456);
        let text = fs::read_to_string(
            fixtures()
                .join("v1/memory/docker")
                .join(V1_ID)
                .join("memory.stat"),
        )
        .unwrap();
        let stat = parse_flat_keyed(&text);
        assert_eq!(
            (
                stat["total_rss"],
                stat["total_cache"],
                stat["total_inactive_file"]
            ),
            (53_248, 22_675_456, 21_254_144)
        );
    }

    #[test]
    fn parses_cpu_stat_v2() {
        assert_eq!(
            parse_cpu_stat_v2("usage_usec 39549\nuser_usec 17673\nsystem_usec 21876\nnice_usec 0"),
            Some(39_549_000)
        );
        assert_eq!(parse_cpu_stat_v2("user_usec 1\n"), None);
        assert_eq!(
            parse_cpu_stat_v2(&format!("usage_usec {}\n", u64::MAX)),
            Some(u64::MAX)
        );
    }

    #[test]
    fn parses_blkio_v1() {
        let text =
            "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 8192\n8:0 Async 4096\n8:0 Total 12288\n\
                    8:16 Read 1\n8:16 Write 2\n8:16 Total 3\nTotal 12291\n";
        assert_eq!(parse_blkio_v1(text), Some((4097, 8194)));
        assert_eq!(parse_blkio_v1("Total 0\n"), None);
        assert_eq!(parse_blkio_v1(""), None);
        assert_eq!(
            parse_blkio_v1("8:0 Read x\n8:0 Write 5 6\n8:0 Write 5\n"),
            Some((0, 5))
        );
    }

    #[test]
    fn parses_io_stat_v2() {
        let text = "8:0 rbytes=1463296 wbytes=20480000 rios=171 wios=58 dbytes=0 dios=0\n\
                    253:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n";
        assert_eq!(parse_io_stat_v2(text), (1_467_392, 20_488_192));
        assert_eq!(parse_io_stat_v2(""), (0, 0));
        assert_eq!(
            parse_io_stat_v2("8:0 rbytes=x wbytes==3 rbytes 7=8 wbytes=2\nrbytes=5"),
            (0, 2)
        );
    }

    #[test]
    fn unescapes_mountinfo_fields() {
        assert_eq!(unescape_octal("/a\\040b\\011c\\134d"), "/a b\tc\\d");
        assert_eq!(unescape_octal("/trailing\\04"), "/trailing\\04");
        assert_eq!(unescape_octal("\\777"), "?");
    }

    #[test]
    fn reads_this_process_cgroup() {
        let paths = match CgroupPaths::for_pid(std::process::id()) {
            Ok(paths) => paths,
            Err(e) => {
                eprintln!("skipped: no cgroup with a memory controller for this process: {e}");
                return;
            }
        };
        match read(&paths) {
            Ok(sample) => assert!(sample.cpu_used_ns > 0, "{paths:?} {sample:?}"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                eprintln!("skipped: cgroup files missing at {paths:?} (no memory controller?): {e}")
            }
            Err(e) => panic!("{paths:?}: {e}"),
        }
    }
}
