//! Parsers for `kernelvisor ctl` arguments (`--env`, `--mount`, seconds such as `--timeout`),
//! used as clap value parsers: their error text is shown after clap's
//! `invalid value '…' for '--env …'`.

use serde_json::{json, Value};

/// `--env KEY=VALUE`: split at the first `=`; the value may be empty or contain `=`.
///
/// Errors when there is no `=` or the key is empty.
pub fn env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some(("", _)) => Err("expected KEY=VALUE, the key is empty".to_owned()),
        Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
        None => Err("expected KEY=VALUE, there is no '='".to_owned()),
    }
}

/// A number of seconds (`--flush-timeout`, `wait --timeout`): a finite,
/// non-negative number, decimals allowed (`0.5`, `3600`).
pub fn seconds(s: &str) -> Result<f64, String> {
    let n: f64 = s
        .trim()
        .parse()
        .map_err(|_| "expected a number of seconds".to_owned())?;
    if !n.is_finite() || n < 0.0 || std::time::Duration::try_from_secs_f64(n).is_err() {
        return Err("expected a non-negative number of seconds".to_owned());
    }
    Ok(n)
}

/// Like [`seconds`], but more than zero (`--batch-timeout`; `wait --interval`: no busy polling).
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    match seconds(s)? {
        n if n > 0.0 => Ok(n),
        _ => Err("expected a number of seconds above 0".to_owned()),
    }
}

/// Seconds as a JSON number: an integer when whole (`3600`), else a float (`0.5`).
pub fn seconds_json(n: f64) -> Value {
    if n.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&n) {
        Value::from(n as u64)
    } else {
        Value::from(n)
    }
}

/// Mount permission: read-only or read-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Ro,
    Rw,
}

/// One `--mount NAME=HOST_PATH[:ro|rw]`, as the API's
/// `{"name", "host_path", "permission": "ro"|"rw"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Name of the mount (the vfolder name; the kernel sees it under `/home/work/<name>`).
    pub name: String,
    /// Absolute path on the agent's host.
    pub host_path: String,
    /// `rw` unless `:ro` is given.
    pub permission: Permission,
}

impl Mount {
    /// The API's JSON object for this mount.
    pub fn to_json(&self) -> Value {
        let permission = match self.permission {
            Permission::Ro => "ro",
            Permission::Rw => "rw",
        };
        json!({"name": self.name, "host_path": self.host_path, "permission": permission})
    }
}

/// `--mount NAME=HOST_PATH[:ro|rw]`: split at the first `=`; a trailing `:ro` or `:rw` is the
/// permission (default `rw`), anything else after a `:` belongs to the path.
///
/// Errors when there is no `=`, the name is empty, or the path is empty or not absolute.
pub fn mount(s: &str) -> Result<Mount, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or("expected NAME=HOST_PATH[:ro|rw], there is no '='")?;
    if name.is_empty() {
        return Err("expected NAME=HOST_PATH[:ro|rw], the name is empty".to_owned());
    }
    let (host_path, permission) = if let Some(p) = rest.strip_suffix(":ro") {
        (p, Permission::Ro)
    } else if let Some(p) = rest.strip_suffix(":rw") {
        (p, Permission::Rw)
    } else {
        (rest, Permission::Rw)
    };
    if host_path.is_empty() {
        return Err("expected NAME=HOST_PATH[:ro|rw], the host path is empty".to_owned());
    }
    if !host_path.starts_with('/') {
        return Err(format!("the host path '{host_path}' is not absolute"));
    }
    Ok(Mount {
        name: name.to_owned(),
        host_path: host_path.to_owned(),
        permission,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_pairs() {
        assert_eq!(env("K=V"), Ok(("K".into(), "V".into())));
        assert_eq!(env("K="), Ok(("K".into(), String::new())));
        assert_eq!(env("URL=a=b"), Ok(("URL".into(), "a=b".into())));
        assert_eq!(
            env("NOEQUALS").unwrap_err(),
            "expected KEY=VALUE, there is no '='"
        );
        assert_eq!(
            env("=v").unwrap_err(),
            "expected KEY=VALUE, the key is empty"
        );
    }

    #[test]
    fn seconds_values() {
        assert_eq!(seconds("0.5"), Ok(0.5));
        assert_eq!(seconds("3600"), Ok(3600.0));
        assert_eq!(seconds("0"), Ok(0.0));
        assert_eq!(seconds("soon").unwrap_err(), "expected a number of seconds");
        for bad in ["-1", "inf", "NaN", "1e30"] {
            assert_eq!(
                seconds(bad).unwrap_err(),
                "expected a non-negative number of seconds",
                "{bad}"
            );
        }
        assert_eq!(positive_seconds("0.01"), Ok(0.01));
        assert_eq!(
            positive_seconds("0").unwrap_err(),
            "expected a number of seconds above 0"
        );
        assert_eq!(seconds_json(3600.0), json!(3600));
        assert_eq!(seconds_json(0.5), json!(0.5));
        assert_eq!(seconds_json(0.0), json!(0));
    }

    #[test]
    fn mounts() {
        let m = mount("data=/vfroot/data:ro").unwrap();
        assert_eq!(
            m,
            Mount {
                name: "data".into(),
                host_path: "/vfroot/data".into(),
                permission: Permission::Ro
            }
        );
        assert_eq!(
            m.to_json(),
            json!({"name": "data", "host_path": "/vfroot/data", "permission": "ro"})
        );
        assert_eq!(mount("d=/x:rw").unwrap().permission, Permission::Rw);
        assert_eq!(mount("d=/x").unwrap().permission, Permission::Rw);
        assert_eq!(mount("d=/a:b").unwrap().host_path, "/a:b");
        assert_eq!(mount("d=/a=b:ro").unwrap().host_path, "/a=b");
    }

    #[test]
    fn bad_mounts() {
        assert_eq!(
            mount("data").unwrap_err(),
            "expected NAME=HOST_PATH[:ro|rw], there is no '='"
        );
        assert_eq!(
            mount("=/x").unwrap_err(),
            "expected NAME=HOST_PATH[:ro|rw], the name is empty"
        );
        assert_eq!(
            mount("d=:ro").unwrap_err(),
            "expected NAME=HOST_PATH[:ro|rw], the host path is empty"
        );
        assert_eq!(
            mount("d=rel/path").unwrap_err(),
            "the host path 'rel/path' is not absolute"
        );
    }
}
