//! Runs with a terminal (`pty_*` methods, `ctl session exec -it`): the same [`Run`]s as
//! `execute`'s, started with [`RunRequest::tty`](super::RunRequest::tty), read as raw bytes
//! instead of console text, and resized.
//!
//! A terminal's output is one byte stream (the line discipline merged stdout and stderr and
//! added echo and `\r\n`), and it is read as it comes: a read answers as soon as any byte is
//! there, so keystrokes echo at once. It goes through the run's bounded console like every
//! run's output, so a reader that falls behind stops the process, never grows memory; a run
//! nobody reads for `exec-idle-timeout` is killed by the same reaper.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Run, RunEnd, RunError, Runs};
use crate::agent::backend::{ContainerBackend, TtySize};

/// One read of a terminal's output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TerminalRead {
    /// The bytes since the previous read, in order (at most the `max` asked for).
    pub data: Vec<u8>,
    /// The run ended and `data` is the last of its output: no further read answers.
    pub finished: bool,
    /// Its exit code, when `finished` and the engine said (`None` when it was killed by
    /// `pty_close` or the idle reaper, or the engine did not say).
    pub exit_code: Option<i64>,
}

impl Run {
    /// Whether it was started with a terminal.
    pub fn is_tty(&self) -> bool {
        self.tty
    }

    /// Waits up to `wait` for output, then takes at most `max` bytes of it (fewer when less is
    /// there: it answers as soon as one byte is). Reads never interleave (one reader at a time).
    pub async fn read_bytes(&self, max: usize, wait: Duration) -> TerminalRead {
        let _one_reader = self.reader.lock().await;
        let deadline = Instant::now().checked_add(wait);
        let (data, end) = self
            .shared
            .take_when(
                deadline,
                |st| !st.console.is_empty(),
                |st| {
                    let data: Vec<u8> = st
                        .console
                        .take(max.max(1))
                        .into_iter()
                        .flat_map(|(_, bytes)| bytes)
                        .collect();
                    (data, st.end.clone().filter(|_| st.console.is_empty()))
                },
            )
            .await;
        TerminalRead {
            data,
            finished: end.is_some(),
            exit_code: match end {
                Some(RunEnd::Exited(code)) => code,
                _ => None,
            },
        }
    }

    /// Sets its terminal's size (its processes get `SIGWINCH`).
    ///
    /// Errors: [`RunError::NoTty`] for a run without a terminal; [`RunError::Engine`] when the
    /// engine refuses (the run ended).
    pub async fn resize(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        size: TtySize,
    ) -> Result<(), RunError> {
        if !self.tty {
            return Err(RunError::NoTty(self.ids.run_id.clone()));
        }
        backend.exec_resize(&self.exec_id, size).await?;
        Ok(())
    }
}

impl Runs {
    /// Kills run `run_id`'s process tree (when it still runs) and forgets it: what it had not
    /// been read is dropped. The client's end of a terminal.
    ///
    /// Errors: [`RunError::NotFound`].
    pub async fn close(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        run_id: &str,
    ) -> Result<(), RunError> {
        let run = self
            .table()
            .remove(run_id)
            .ok_or_else(|| RunError::NotFound(run_id.to_owned()))?;
        run.pump.abort();
        let ended = run.shared.state().end.is_some();
        if !ended {
            if let Err(e) = backend.exec_kill(&run.exec_id).await {
                tracing::warn!(%run_id, error = %e, "cannot kill a closed terminal's process");
            }
            run.shared.state().end = Some(RunEnd::Abandoned);
            run.shared.data.notify_waiters();
        }
        Ok(())
    }
}
