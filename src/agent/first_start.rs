//! What an owner prepares for a child's first start, so that start-up errors the operator must
//! fix (a port in use, an unreadable store) are reported by `Agent::start` rather than by a
//! child failing later; later starts (after a restart) make their own.

use std::sync::{Arc, Mutex};

/// A value for a child's first start; [`FirstStart::take`] hands it out once.
///
/// Cheap to clone: clones share the one value, as the child's start function is called once
/// per (re)start and must be `Fn`.
pub struct FirstStart<T>(Arc<Mutex<Option<T>>>);

impl<T> Clone for FirstStart<T> {
    fn clone(&self) -> Self {
        FirstStart(self.0.clone())
    }
}

impl<T> FirstStart<T> {
    /// Holds `value` for the first start.
    pub fn new(value: T) -> FirstStart<T> {
        FirstStart(Arc::new(Mutex::new(Some(value))))
    }

    /// The prepared value on the first call, `None` on every later one.
    pub fn take(&self) -> Option<T> {
        self.0.lock().expect("first-start slot lock").take()
    }
}
