//! Transition-by-transition tests.
