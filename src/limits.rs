//! Process limits: the open-file limit (`RLIMIT_NOFILE`) both binaries need at fleet scale.
//!
//! A manager holds one ZeroMQ DEALER per agent (its TCP connection and its mailbox's eventfd:
//! two descriptors), so 10,000 agents need over 20,000 descriptors where distributions default
//! the soft limit to 1,024. Both binaries raise the soft limit to the hard one at start (as
//! Nomad and most servers do), a privileged process the hard one too when a configuration needs
//! more, and the manager refuses a configuration it cannot serve.

/// The open-file limits now, `(soft, hard)`.
// `rlim_t` is u64 on 64-bit Linux but not everywhere.
#[allow(clippy::unnecessary_cast)]
pub fn open_files() -> std::io::Result<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r.rlim_cur as u64, r.rlim_max as u64))
}

fn set_open_files(soft: u64, hard: u64) -> std::io::Result<()> {
    let r = libc::rlimit {
        rlim_cur: soft as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Raises the soft open-file limit to the hard limit; returns the new `(soft, hard)`.
pub fn raise_open_files() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = open_files()?;
    if soft < hard {
        set_open_files(hard, hard)?;
    }
    open_files()
}

/// Makes sure at least `needed` descriptors may be open: raises the soft limit to the hard one,
/// and the hard one too where the process may (privileged; up to `/proc/sys/fs/nr_open`).
///
/// Errors: the limit stays below `needed`; the message names `RLIMIT_NOFILE`, both values,
/// `what` needs it (a configuration key) and how to fix it.
pub fn ensure_open_files(needed: u64, what: &str) -> anyhow::Result<(u64, u64)> {
    let (mut soft, mut hard) = raise_open_files()?;
    if hard < needed {
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(needed);
        let want = needed.min(nr_open);
        if set_open_files(want, want).is_ok() {
            (soft, hard) = open_files()?;
            tracing::info!(soft, hard, "raised the hard open-file limit");
        }
    }
    if soft < needed {
        anyhow::bail!(
            "RLIMIT_NOFILE is {soft} (hard {hard}) but {what} needs {needed} open files: raise \
             the limit (`ulimit -n {needed}`, systemd `LimitNOFILE={needed}`) or lower {what}"
        );
    }
    Ok((soft, hard))
}

#[cfg(test)]
mod tests {
    #[test]
    fn raising_reaches_the_hard_limit_and_a_need_beyond_every_limit_is_refused() {
        let (soft, hard) = super::raise_open_files().unwrap();
        assert_eq!(soft, hard);
        let err = super::ensure_open_files(u64::MAX / 2, "[agent-pool] max-agents")
            .unwrap_err()
            .to_string();
        assert!(err.contains("RLIMIT_NOFILE"), "{err}");
        assert!(err.contains("[agent-pool] max-agents"), "{err}");
        assert!(super::ensure_open_files(64, "x").is_ok());
    }
}
