//! vfolder names: what a user may call a folder. A name becomes one path component on the
//! agents (`<vfolder-root>/<owner>/<name>`) and in the kernel (`/home/work/<name>`), so it is
//! 1–64 characters of `A-Z a-z 0-9 . _ -`, not starting with `.` (no `..`, no hidden names).

use super::error::ManagerError;

/// Longest name, in characters.
pub const MAX_LEN: usize = 64;

/// Checks a vfolder name.
///
/// Errors: [`ManagerError::InvalidRequest`] naming the rule it breaks.
pub fn check(name: &str) -> Result<(), ManagerError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ManagerError::InvalidRequest(format!(
            "vfolder name `{name}`: 1–{MAX_LEN} characters of A-Z a-z 0-9 . _ -, not starting with `.`"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_safe_components() {
        for good in ["data", "my-set_1.v2", "A"] {
            assert!(check(good).is_ok(), "{good}");
        }
        let long = "x".repeat(MAX_LEN + 1);
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "a b",
            "é",
            long.as_str(),
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}
