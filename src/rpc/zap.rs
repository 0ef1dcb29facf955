//! A ZAP 1.0 handler (RFC 27) that admits CURVE clients holding an allowed public key.
//!
//! libzmq asks the socket bound at `inproc://zeromq.zap.01` in the same context about every
//! connecting peer of a `CURVE_SERVER` socket. We answer `200 OK` with a user id only for
//! mechanism `CURVE` and a key in the allow list, else `400` (as callosum's `ZAPServer` with
//! Backend.AI's agent authenticator does). It runs on its own thread: ZAP is a blocking REP
//! exchange that must never wait behind the actor runtime.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::curve::CurveKey;

/// Re-reads the admitted keys (e.g. a directory of certificates); `None` keeps the current
/// list (the source could not be read).
#[derive(Clone)]
pub struct KeyReload(pub Arc<ReloadFn>);

/// Reads the admitted keys again: `(key, name)` pairs, or `None` to keep the current set.
pub type ReloadFn = dyn Fn() -> Option<Vec<(CurveKey, String)>> + Send + Sync;

impl std::fmt::Debug for KeyReload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyReload(..)")
    }
}

/// Least time between two reloads, so unknown clients cannot make us read the disk in a loop.
const RELOAD_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";
const ZAP_VERSION: &[u8] = b"1.0";
/// How often the handler thread looks at its stop flag, in ms.
const POLL_MS: i32 = 100;

/// A running ZAP handler; dropping it stops the thread.
pub struct ZapHandler {
    stop: Arc<AtomicBool>,
    denied: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl ZapHandler {
    /// Binds the ZAP endpoint in `ctx` and starts answering. `allowed` pairs each admitted
    /// public key with the user id reported to the server socket.
    ///
    /// Errors: the endpoint is already bound in this context (one handler per context).
    /// With `reload`, an unknown key makes it re-read the allow list (at most once a second)
    /// before refusing.
    pub fn start(
        ctx: &zmq::Context,
        allowed: Vec<(CurveKey, String)>,
        reload: Option<KeyReload>,
    ) -> Result<Self, zmq::Error> {
        let sock = ctx.socket(zmq::REP)?;
        sock.set_linger(0)?;
        sock.set_rcvtimeo(POLL_MS)?;
        sock.bind(ZAP_ENDPOINT)?;
        let stop = Arc::new(AtomicBool::new(false));
        let denied = Arc::new(AtomicU64::new(0));
        let (stop2, denied2) = (stop.clone(), denied.clone());
        let thread = std::thread::Builder::new()
            .name("zap-handler".into())
            .spawn(move || serve(sock, allowed, reload, stop2, denied2))
            .expect("spawning the ZAP thread");
        Ok(ZapHandler {
            stop,
            denied,
            thread: Some(thread),
        })
    }

    /// How many connection attempts were refused so far.
    pub fn denied(&self) -> u64 {
        self.denied.load(Ordering::Relaxed)
    }
}

impl Drop for ZapHandler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    sock: zmq::Socket,
    mut allowed: Vec<(CurveKey, String)>,
    reload: Option<KeyReload>,
    stop: Arc<AtomicBool>,
    denied: Arc<AtomicU64>,
) {
    let mut last_reload: Option<std::time::Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let frames = match sock.recv_multipart(0) {
            Ok(f) => f,
            Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => continue,
            Err(zmq::Error::ETERM) => return,
            Err(e) => {
                tracing::warn!(error = %e, "ZAP receive failed");
                continue;
            }
        };
        let (mut request_id, mut verdict) = decide(&frames, &allowed);
        if let (Some(r), "Access denied") = (&reload, verdict.1) {
            if last_reload.is_none_or(|t| t.elapsed() >= RELOAD_EVERY) {
                last_reload = Some(std::time::Instant::now());
                if let Some(fresh) = (r.0)() {
                    allowed = fresh;
                }
                (request_id, verdict) = decide(&frames, &allowed);
            }
        }
        if verdict.0 != "200" {
            denied.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(reason = verdict.1, "refused an RPC client (ZAP)");
        }
        let reply: [&[u8]; 6] = [
            ZAP_VERSION,
            &request_id,
            verdict.0.as_bytes(),
            verdict.1.as_bytes(),
            verdict.2.as_bytes(),
            b"",
        ];
        if let Err(e) = sock.send_multipart(reply, 0) {
            tracing::warn!(error = %e, "ZAP reply failed");
        }
    }
}

/// Returns the request id and `(status code, status text, user id)`.
fn decide(
    frames: &[Vec<u8>],
    allowed: &[(CurveKey, String)],
) -> (Vec<u8>, (&'static str, &'static str, String)) {
    let request_id = frames.get(1).cloned().unwrap_or_default();
    if frames.len() < 6 {
        return (request_id, ("400", "Not enough frames", String::new()));
    }
    if frames[0] != ZAP_VERSION {
        return (request_id, ("400", "Invalid version", String::new()));
    }
    if frames[5] != b"CURVE" {
        return (
            request_id,
            ("400", "Unsupported authentication mechanism", String::new()),
        );
    }
    let key: Option<[u8; 32]> = frames.get(6).and_then(|k| k.as_slice().try_into().ok());
    match key.and_then(|k| allowed.iter().find(|(a, _)| a.0 == k)) {
        Some((_, user)) => (request_id, ("200", "OK", user.clone())),
        None => (request_id, ("400", "Access denied", String::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decides_by_mechanism_and_key() {
        let k = CurveKey([7; 32]);
        let allowed = vec![(k, "manager".to_string())];
        let req = |mech: &[u8], key: &[u8]| {
            vec![
                b"1.0".to_vec(),
                b"id".to_vec(),
                b"local".to_vec(),
                b"127.0.0.1".to_vec(),
                vec![],
                mech.to_vec(),
                key.to_vec(),
            ]
        };
        assert_eq!(
            decide(&req(b"CURVE", &[7; 32]), &allowed).1,
            ("200", "OK", "manager".into())
        );
        assert_eq!(decide(&req(b"CURVE", &[8; 32]), &allowed).1 .0, "400");
        assert_eq!(decide(&req(b"NULL", &[7; 32]), &allowed).1 .0, "400");
        assert_eq!(decide(&req(b"CURVE", &[7; 32])[..3], &allowed).1 .0, "400");
    }
}
