//! See the module docs of [`super`].
