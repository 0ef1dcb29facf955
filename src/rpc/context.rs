//! ZeroMQ contexts sized for a fleet. `zmq` 0.9 (the binding that links the system libzmq with
//! CURVE, wire-protocol.md) cannot set context options, and libzmq's default socket limit
//! (`ZMQ_MAX_SOCKETS`, 1,023) would stop the manager's pool at about a thousand agents; so the
//! pool's context is made through `zmq-sys` with `zmq_ctx_set` and hands out ordinary
//! [`zmq::Socket`]s.

use std::ffi::c_void;
use std::sync::Arc;

/// Where sockets come from: the binding's default [`zmq::Context`], or a [`SizedContext`].
pub trait SocketSource {
    /// A new socket of `kind`.
    ///
    /// Errors: libzmq's (`EMFILE` at the context's socket limit, `ETERM`).
    fn socket(&self, kind: zmq::SocketType) -> Result<zmq::Socket, zmq::Error>;
}

impl SocketSource for zmq::Context {
    fn socket(&self, kind: zmq::SocketType) -> Result<zmq::Socket, zmq::Error> {
        zmq::Context::socket(self, kind)
    }
}

struct Raw(*mut c_void);

// SAFETY: a libzmq context is thread safe (zmq_ctx_new(3)); only its sockets are not.
unsafe impl Send for Raw {}
// SAFETY: as above.
unsafe impl Sync for Raw {}

impl Drop for Raw {
    fn drop(&mut self) {
        // zmq_ctx_term blocks until every socket of the context is closed, and sockets may still
        // be closing on this very thread's runtime: terminate on a thread of its own.
        let ptr = self.0 as usize;
        std::thread::spawn(move || {
            // SAFETY: the pointer came from zmq_ctx_new and is terminated once, here.
            while unsafe { zmq_sys::zmq_ctx_term(ptr as *mut c_void) } != 0
                && zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() }) == zmq::Error::EINTR
            {
            }
        });
    }
}

/// A libzmq context with its socket limit and I/O threads set. Cheap to clone.
#[derive(Clone)]
pub struct SizedContext {
    raw: Arc<Raw>,
}

impl std::fmt::Debug for SizedContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SizedContext").finish_non_exhaustive()
    }
}

impl SizedContext {
    /// A context allowing `max_sockets` sockets, with `io_threads` I/O threads.
    ///
    /// Errors: libzmq refuses a value (`EINVAL`), or no context could be made.
    pub fn new(max_sockets: i32, io_threads: i32) -> Result<SizedContext, zmq::Error> {
        // SAFETY: plain constructor; null is checked.
        let ptr = unsafe { zmq_sys::zmq_ctx_new() };
        if ptr.is_null() {
            return Err(last_error());
        }
        let raw = Raw(ptr);
        for (option, value) in [
            (zmq_sys::ZMQ_MAX_SOCKETS, max_sockets),
            (zmq_sys::ZMQ_IO_THREADS, io_threads),
        ] {
            // SAFETY: a live context and an integer option.
            if unsafe { zmq_sys::zmq_ctx_set(raw.0, option as i32, value) } != 0 {
                return Err(last_error());
            }
        }
        Ok(SizedContext { raw: Arc::new(raw) })
    }

    /// The socket limit libzmq applies (may be lower than asked when the system caps it).
    pub fn max_sockets(&self) -> i32 {
        // SAFETY: a live context and an integer option.
        unsafe { zmq_sys::zmq_ctx_get(self.raw.0, zmq_sys::ZMQ_MAX_SOCKETS as i32) }
    }
}

impl SocketSource for SizedContext {
    fn socket(&self, kind: zmq::SocketType) -> Result<zmq::Socket, zmq::Error> {
        // SAFETY: a live context; a non-null socket is owned by the returned value, which
        // closes it on drop. The context outlives it: `Raw`'s drop terminates only once every
        // socket is closed (zmq_ctx_term waits for them).
        let kind = match kind {
            zmq::DEALER => zmq_sys::ZMQ_DEALER,
            zmq::ROUTER => zmq_sys::ZMQ_ROUTER,
            zmq::REQ => zmq_sys::ZMQ_REQ,
            zmq::REP => zmq_sys::ZMQ_REP,
            zmq::PUSH => zmq_sys::ZMQ_PUSH,
            zmq::PULL => zmq_sys::ZMQ_PULL,
            _ => return Err(zmq::Error::EINVAL),
        } as i32;
        let sock = unsafe { zmq_sys::zmq_socket(self.raw.0, kind) };
        if sock.is_null() {
            return Err(last_error());
        }
        Ok(unsafe { zmq::Socket::from_raw(sock) })
    }
}

fn last_error() -> zmq::Error {
    // SAFETY: reads the calling thread's errno.
    zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })
}

#[cfg(test)]
mod tests {
    use super::{SizedContext, SocketSource};

    #[test]
    fn the_socket_limit_is_what_was_asked_and_enforced() {
        let ctx = SizedContext::new(3000, 2).unwrap();
        assert_eq!(ctx.max_sockets(), 3000);
        let small = SizedContext::new(2, 1).unwrap();
        let a = small.socket(zmq::DEALER).unwrap();
        let b = small.socket(zmq::DEALER).unwrap();
        let err = small.socket(zmq::DEALER).err();
        assert_eq!(err, Some(zmq::Error::EMFILE));
        drop((a, b));
    }
}
