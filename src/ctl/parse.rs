//! Parsers for `kernelvisor ctl` arguments (`--env`, `--mount`, seconds such as `--timeout`,
//! session paths and the sides of `session cp`), used as clap value parsers: their error text is
//! shown after clap's `invalid value '…' for '--env …'`.

use crate::model::session::MountSpec;

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

// Idle reclaim.
/// `--min-utilization SLOT=PERCENT` (`cpu=5`, `cuda.device=10`; whole percents) of `session
/// create` and `access-key set-reclaim`; the manager checks the slot and the range.
///
/// Errors when there is no `=` or the percent is not a whole number.
pub fn slot_percent(s: &str) -> Result<(String, u32), String> {
    let (slot, pct) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected SLOT=PERCENT (e.g. cpu=5)"))?;
    let pct: u32 = pct
        .parse()
        .map_err(|_| format!("`{pct}` is not a percent"))?;
    Ok((slot.to_owned(), pct))
}

/// `--slot NAME=AMOUNT` (`cuda.device=2`, `cuda.shares=0.5`): an accelerator slot besides
/// `--cpu` / `--mem`. The name must be a slot name (`[a-z0-9][a-z0-9._-]*`, not `cpu` or `mem`);
/// the amount is passed on as written (the manager checks it against the slot's unit).
pub fn slot(s: &str) -> Result<(String, String), String> {
    let (name, amount) = s
        .split_once('=')
        .ok_or_else(|| "expected NAME=AMOUNT, there is no '='".to_owned())?;
    crate::slots::check_name(name).map_err(|e| e.to_string())?;
    if name == crate::slots::CPU || name == crate::slots::MEM {
        return Err(format!("use --{name} for `{name}`"));
    }
    if amount.trim().is_empty() {
        return Err(format!("resource slot `{name}`: the amount is empty"));
    }
    Ok((name.to_owned(), amount.trim().to_owned()))
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

/// A whole number of seconds (`exec --timeout`): digits only, no sign or fraction.
pub fn whole_seconds(s: &str) -> Result<u64, String> {
    s.trim()
        .parse()
        .map_err(|_| "expected a whole, non-negative number of seconds (such as 60)".to_owned())
}

/// `--cpu CORES`: a number of cores above 0 (`1`, `0.5`), passed on as written.
pub fn cores(s: &str) -> Result<String, String> {
    match s.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(s.trim().to_owned()),
        _ => Err("expected a number of cores above 0 (such as 1 or 0.5)".to_owned()),
    }
}

/// `--mem SIZE`: bytes as an integer or with a binary suffix (`256m`, `1g`), above 0.
pub fn mem_size(s: &str) -> Result<String, String> {
    match crate::config::ByteSize::parse(s) {
        Ok(b) if b.0 > 0 => Ok(s.trim().to_owned()),
        Ok(_) => Err("expected a size above 0 (such as 256m or 1g)".to_owned()),
        Err(e) => Err(format!("{e} (such as 256m or 1g)")),
    }
}

/// Like [`seconds`], but more than zero (`--batch-timeout`; `wait --interval`: no busy polling).
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    match seconds(s)? {
        n if n > 0.0 => Ok(n),
        _ => Err("expected a number of seconds above 0".to_owned()),
    }
}

/// Mount permission: read-only or read-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Read-only (`:ro`).
    Ro,
    /// Read-write (`:rw`, the default).
    Rw,
}

/// One `--mount NAME[:ro|:rw]`: a vfolder of the caller's, as the API's
/// `{"name", "permission": "ro"|"rw"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The vfolder's name (`ctl vfolder list`); the kernel sees it under `/home/work/<name>`.
    pub name: String,
    /// `rw` unless `:ro` is given.
    pub permission: Permission,
}

impl Mount {
    /// The mount as the API takes it (`{"name", "permission"}`).
    pub fn spec(&self) -> MountSpec {
        let permission = match self.permission {
            Permission::Ro => "ro",
            Permission::Rw => "rw",
        };
        MountSpec {
            name: self.name.clone(),
            permission: Some(permission.to_owned()),
        }
    }
}

/// `--mount NAME[:ro|:rw]`: a trailing `:ro` or `:rw` is the permission (default `rw`).
///
/// Errors when the name is empty, or has a `=`, `/` or `:` (a vfolder name has none: host
/// paths are not given here, a vfolder is made with `ctl vfolder create`).
pub fn mount(s: &str) -> Result<Mount, String> {
    let (name, permission) = if let Some(n) = s.strip_suffix(":ro") {
        (n, Permission::Ro)
    } else if let Some(n) = s.strip_suffix(":rw") {
        (n, Permission::Rw)
    } else {
        (s, Permission::Rw)
    };
    if name.is_empty() {
        return Err("expected NAME[:ro|:rw], the name is empty".to_owned());
    }
    if name.contains(['=', '/', ':']) {
        return Err(format!(
            "expected NAME[:ro|:rw], '{name}' is not a vfolder name (mounts name vfolders: \
             `ctl vfolder create NAME` makes one; a permission is :ro or :rw)"
        ));
    }
    Ok(Mount {
        name: name.to_owned(),
        permission,
    })
}

/// The directory session paths are relative to.
pub const SESSION_HOME: &str = "/home/work";

/// A path in a session (`session ls PATH`, the PATH of `session cp ID:PATH`), relative to
/// [`SESSION_HOME`], normalized: empty and `.` segments dropped, so `./a//b` is `a/b`; an
/// absolute path under `/home/work` is made relative to it. A path that names a directory
/// (empty, or ending in `/` or `/.`) is answered ending in `/` (`sub/`), except the home
/// directory itself, which is the empty path.
///
/// Errors on a `..` segment (the URL of a path cannot carry one) and on an absolute path outside
/// `/home/work`.
pub fn session_path(s: &str) -> Result<String, String> {
    let relative = if let Some(rest) = s.strip_prefix(SESSION_HOME) {
        match rest {
            "" => "",
            r if r.starts_with('/') => r,
            _ => return Err(format!("'{s}' is outside {SESSION_HOME}")),
        }
    } else if s.starts_with('/') {
        return Err(format!(
            "'{s}' is outside {SESSION_HOME} (session paths are relative to it)"
        ));
    } else {
        s
    };
    let names: Vec<&str> = relative
        .split('/')
        .filter(|n| !n.is_empty() && *n != ".")
        .collect();
    if names.contains(&"..") {
        return Err("'..' is not allowed in a session path".to_owned());
    }
    let dir = relative.is_empty()
        || relative.ends_with('/')
        || relative.ends_with("/.")
        || relative == ".";
    let mut path = names.join("/");
    if dir && !path.is_empty() {
        path.push('/');
    }
    Ok(path)
}

/// One side of `session cp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `ID:PATH`: `path` is a [`session_path`] (ends in `/` for a directory).
    Remote { id: String, path: String },
    /// A path on this machine; `-` is stdin or stdout.
    Local(String),
}

/// A side of `session cp`: `-` and paths starting with `/` or `.` are local; otherwise text with
/// a `:` whose part before it has no `/` is `ID:PATH` (PATH may be empty: the session's home
/// directory); anything else is local. A local path with a `:` in its first part needs `./`.
///
/// Errors when the id before the `:` is empty, or PATH is not a valid [`session_path`].
pub fn endpoint(s: &str) -> Result<Endpoint, String> {
    if s == "-" || s.starts_with('/') || s.starts_with('.') {
        return Ok(Endpoint::Local(s.to_owned()));
    }
    match s.split_once(':') {
        Some(("", _)) => Err(
            "the session id before ':' is empty (write ./:… for a local path with a ':')"
                .to_owned(),
        ),
        Some((id, path)) if !id.contains('/') => Ok(Endpoint::Remote {
            id: id.to_owned(),
            path: session_path(path)?,
        }),
        _ => Ok(Endpoint::Local(s.to_owned())),
    }
}

/// What one `session cp` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// LOCAL → ID:PATH; `path` ends in `/` (or is empty) when the local file's name is to be
    /// appended.
    Upload {
        local: String,
        id: String,
        path: String,
    },
    /// ID:PATH → LOCAL; `path` names a file.
    Download {
        id: String,
        path: String,
        local: String,
    },
}

impl Transfer {
    /// The transfer between `src` and `dst`.
    ///
    /// Errors unless exactly one side is `ID:PATH`, when stdin (`-`) is uploaded to a directory
    /// (it has no name to append), and when a directory is to be downloaded.
    pub fn new(src: Endpoint, dst: Endpoint) -> Result<Self, String> {
        match (src, dst) {
            (Endpoint::Remote { .. }, Endpoint::Remote { .. }) => Err(
                "both SRC and DST are session paths (ID:PATH); one must be local \
                 (write ./… for a local path with a ':')"
                    .to_owned(),
            ),
            (Endpoint::Local(_), Endpoint::Local(_)) => {
                Err("neither SRC nor DST is a session path; one must be ID:PATH".to_owned())
            }
            (Endpoint::Local(local), Endpoint::Remote { id, path }) => {
                if local == "-" && (path.is_empty() || path.ends_with('/')) {
                    return Err(format!(
                        "stdin has no file name: give one after '{id}:' (e.g. {id}:{path}file)"
                    ));
                }
                Ok(Transfer::Upload { local, id, path })
            }
            (Endpoint::Remote { id, path }, Endpoint::Local(local)) => {
                if path.is_empty() || path.ends_with('/') {
                    return Err(format!(
                        "'{id}:{path}' is a directory; only files can be copied"
                    ));
                }
                Ok(Transfer::Download { id, path, local })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn cores_sizes_and_whole_seconds() {
        assert_eq!(cores("0.5"), Ok("0.5".into()));
        assert_eq!(cores(" 2 "), Ok("2".into()));
        for bad in ["-1", "0", "many", "inf"] {
            assert!(cores(bad).unwrap_err().contains("above 0"), "{bad}");
        }
        assert_eq!(mem_size("256m"), Ok("256m".into()));
        assert!(mem_size("0").unwrap_err().contains("above 0"));
        assert!(mem_size("-1g").unwrap_err().contains("such as 256m"));
        assert_eq!(whole_seconds("60"), Ok(60));
        for bad in ["-1", "1.5", "x"] {
            assert!(
                whole_seconds(bad)
                    .unwrap_err()
                    .contains("whole, non-negative"),
                "{bad}"
            );
        }
    }

    /// Negative values reach the value parsers (clap would read `-1` as a flag), so the message
    /// says what is wrong with the value.
    #[test]
    fn negative_values_get_the_parsers_message() {
        use crate::ctl::test_util::parse;
        let err = parse(&[
            "session", "create", "--image", "i", "--cpu", "-1", "--mem", "1g",
        ])
        .err()
        .unwrap();
        assert!(
            err.to_string()
                .contains("expected a number of cores above 0"),
            "{err}"
        );
        let err = parse(&["session", "exec", "S", "true", "--timeout=-1"])
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .contains("whole, non-negative number of seconds"),
            "{err}"
        );
        assert_eq!(err.exit_code(), 2);
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
    }

    #[test]
    fn mounts() {
        let m = mount("data:ro").unwrap();
        assert_eq!(
            m,
            Mount {
                name: "data".into(),
                permission: Permission::Ro
            }
        );
        let wire = |m: &Mount| serde_json::to_value(m.spec()).unwrap();
        assert_eq!(wire(&m), json!({"name": "data", "permission": "ro"}));
        assert_eq!(mount("d:rw").unwrap().permission, Permission::Rw);
        assert_eq!(
            mount("my-data.v2").unwrap(),
            Mount {
                name: "my-data.v2".into(),
                permission: Permission::Rw
            }
        );
        assert_eq!(
            wire(&mount("d").unwrap()),
            json!({"name": "d", "permission": "rw"})
        );
    }

    #[test]
    fn bad_mounts() {
        assert_eq!(
            mount(":ro").unwrap_err(),
            "expected NAME[:ro|:rw], the name is empty"
        );
        assert_eq!(
            mount("").unwrap_err(),
            "expected NAME[:ro|:rw], the name is empty"
        );
        for bad in ["data=/vfroot/data:ro", "a/b", "d:rx", "d:ro:rw"] {
            assert!(
                mount(bad).unwrap_err().contains("is not a vfolder name"),
                "{bad}"
            );
        }
    }

    #[test]
    fn session_paths() {
        for (raw, want) in [
            ("", ""),
            (".", ""),
            ("/home/work", ""),
            ("/home/work/", ""),
            ("a.txt", "a.txt"),
            ("./sub//x.bin", "sub/x.bin"),
            ("sub/", "sub/"),
            ("sub/.", "sub/"),
            ("/home/work/sub/x", "sub/x"),
            ("a b:c", "a b:c"),
        ] {
            assert_eq!(session_path(raw).as_deref(), Ok(want), "{raw:?}");
        }
        assert_eq!(
            session_path("a/../b").unwrap_err(),
            "'..' is not allowed in a session path"
        );
        assert!(session_path("/etc/passwd")
            .unwrap_err()
            .contains("outside /home/work"));
        assert!(session_path("/home/workshop").is_err());
    }

    #[test]
    fn cp_endpoints() {
        let remote = |id: &str, path: &str| Endpoint::Remote {
            id: id.into(),
            path: path.into(),
        };
        let local = |p: &str| Endpoint::Local(p.into());
        assert_eq!(endpoint("S:sub/x.bin"), Ok(remote("S", "sub/x.bin")));
        assert_eq!(endpoint("S:"), Ok(remote("S", "")));
        assert_eq!(endpoint("S:dir/"), Ok(remote("S", "dir/")));
        assert_eq!(endpoint("S:a:b"), Ok(remote("S", "a:b")));
        for l in ["-", "x.bin", "./S:x", "/tmp/S:x", "dir/S:x", "../a"] {
            assert_eq!(endpoint(l), Ok(local(l)), "{l}");
        }
        assert!(endpoint(":x").unwrap_err().contains("session id"));
        assert!(endpoint("S:../x").is_err());
    }

    #[test]
    fn cp_transfers() {
        let t = |a: &str, b: &str| Transfer::new(endpoint(a).unwrap(), endpoint(b).unwrap());
        assert_eq!(
            t("x.bin", "S:dir/"),
            Ok(Transfer::Upload {
                local: "x.bin".into(),
                id: "S".into(),
                path: "dir/".into()
            })
        );
        assert_eq!(
            t("S:a.txt", "-"),
            Ok(Transfer::Download {
                id: "S".into(),
                path: "a.txt".into(),
                local: "-".into()
            })
        );
        assert!(t("S:a", "T:b").unwrap_err().starts_with("both SRC and DST"));
        assert!(t("a", "b").unwrap_err().starts_with("neither SRC nor DST"));
        assert!(t("-", "S:dir/")
            .unwrap_err()
            .contains("stdin has no file name"));
        assert!(t("-", "S:").is_err());
        assert!(t("-", "S:f").is_ok());
        assert!(t("S:dir/", "out").unwrap_err().contains("is a directory"));
        assert!(t("S:", "out").is_err());
    }
}
