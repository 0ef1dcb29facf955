//! Placeholder: the supervision toolkit lands with the actors issue.
