//! Process signals: SIGINT and SIGTERM both mean "shut down cleanly".

/// Resolves on the first SIGINT or SIGTERM.
pub async fn wait_for_shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
