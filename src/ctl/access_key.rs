//! `access-key …`: create, list, show, enable, disable, limit and delete access keys
//! (`/v1/access-keys`). Creating, listing and changing keys other than one's own is for admin
//! tokens; the manager answers 403 `forbidden` otherwise.

use std::io::Write;

use clap::Subcommand;
use serde_json::Value;

use super::client::Client;
use super::render::{fields, opt, table, text, utc, with};
use super::{show_to, Failure, Output};
use crate::model::access_key::{AccessKey, AccessKeyList, ChangeBody, NewAccessKey, NewKeyBody};

/// `kernelvisor ctl access-key …`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum AccessKeyCommand {
    /// Create an access key and print its secret, which is shown only this once
    /// (POST /v1/access-keys).
    Create {
        /// An admin key (may manage keys and act for other keys) instead of a user key.
        #[arg(long)]
        admin: bool,
        /// At most this many live sessions (0 = unlimited) [default: the manager's].
        #[arg(long, value_name = "N")]
        concurrency_limit: Option<u32>,
        /// A name to tell the key by (free text).
        #[arg(long)]
        name: Option<String>,
    },
    /// List access keys (GET /v1/access-keys).
    List,
    /// Show an access key: role, state, concurrency used and limit (GET /v1/access-keys/{key}).
    Show {
        /// The access key.
        key: String,
    },
    /// Enable a disabled access key: its token is accepted again (PATCH /v1/access-keys/{key}).
    Enable {
        /// The access key.
        key: String,
    },
    /// Disable an access key: its token is refused (401) until it is enabled again
    /// (PATCH /v1/access-keys/{key}).
    Disable {
        /// The access key.
        key: String,
    },
    /// Set how many live sessions an access key may have (PATCH /v1/access-keys/{key}).
    SetLimit {
        /// The access key.
        key: String,
        /// At most this many live sessions; 0 = unlimited.
        #[arg(value_name = "N")]
        limit: u32,
    },
    // Idle reclaim.
    /// Set an access key's defaults for its sessions' reclaim policy, replacing the ones it
    /// had; none given clears them (PATCH /v1/access-keys/{key}).
    SetReclaim {
        /// The access key.
        key: String,
        /// Seconds a session may run once placed.
        #[arg(long, value_name = "SECS")]
        max_lifetime: Option<u64>,
        /// Seconds without activity before an interactive session ends.
        #[arg(long, value_name = "SECS")]
        idle_timeout: Option<u64>,
        /// Seconds under the utilization floor before a session ends.
        #[arg(long, value_name = "SECS")]
        utilization_window: Option<u64>,
        /// A utilization floor, `SLOT=PERCENT` (`cpu=5`, `cuda.device=10`; whole percents);
        /// repeatable.
        #[arg(long, value_name = "SLOT=PERCENT", value_parser = super::parse::slot_percent)]
        min_utilization: Vec<(String, u32)>,
    },
    /// Set whether an access key's new sessions are preemptible when they do not say
    /// (`preemptible` default; PATCH /v1/access-keys/{key}).
    SetPreemptible {
        /// The access key.
        key: String,
        /// `true` or `false`.
        #[arg(value_name = "BOOL", action = clap::ArgAction::Set)]
        preemptible: bool,
    },
    /// Delete an access key (DELETE /v1/access-keys/{key}).
    Delete {
        /// The access key.
        key: String,
    },
}

impl AccessKeyCommand {
    /// The body of `POST /v1/access-keys` for `create`: the role, and the limit and name only
    /// when given.
    fn new_key(admin: bool, concurrency_limit: Option<u32>, name: Option<&str>) -> NewKeyBody {
        NewKeyBody {
            role: Some(if admin { "admin" } else { "user" }.to_owned()),
            concurrency_limit,
            name: name.map(str::to_owned),
        }
    }

    /// The body of `PATCH /v1/access-keys/{key}` for `enable` / `disable` (`enabled`) and
    /// `set-limit` (`concurrency_limit`); `None` for the others.
    fn change(&self) -> Option<ChangeBody> {
        match self {
            AccessKeyCommand::Enable { .. } | AccessKeyCommand::Disable { .. } => {
                Some(ChangeBody {
                    enabled: Some(matches!(self, AccessKeyCommand::Enable { .. })),
                    ..ChangeBody::default()
                })
            }
            AccessKeyCommand::SetLimit { limit, .. } => Some(ChangeBody {
                concurrency_limit: Some(*limit),
                ..ChangeBody::default()
            }),
            AccessKeyCommand::SetReclaim {
                max_lifetime,
                idle_timeout,
                utilization_window,
                min_utilization,
                ..
            } => Some(ChangeBody {
                reclaim: Some(crate::model::reclaim::ReclaimPolicy {
                    max_lifetime: max_lifetime.map(|t| t as f64),
                    idle_timeout: idle_timeout.map(|t| t as f64),
                    utilization_window: utilization_window.map(|t| t as f64),
                    min_utilization: min_utilization
                        .iter()
                        .map(|(slot, pct)| (slot.clone(), f64::from(*pct)))
                        .collect(),
                }),
                ..ChangeBody::default()
            }),
            AccessKeyCommand::SetPreemptible { preemptible, .. } => Some(ChangeBody {
                preemptible: Some(*preemptible),
                ..ChangeBody::default()
            }),
            _ => None,
        }
    }
}

/// Runs one `access-key` command and prints its answer to `stdout` (a table, or with `-o json`
/// the API's JSON as it is: for `create` the object with its `secret_key`).
pub(super) fn run(
    client: &Client,
    command: &AccessKeyCommand,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    match command {
        AccessKeyCommand::Create {
            admin,
            concurrency_limit,
            name,
        } => {
            let body = AccessKeyCommand::new_key(*admin, *concurrency_limit, name.as_deref());
            show_to(
                out,
                &client.create_access_key(&body)?,
                access_key_created,
                stdout,
            )
        }
        AccessKeyCommand::List => show_to(out, &client.access_keys()?, access_keys, stdout),
        AccessKeyCommand::Show { key } => {
            show_to(out, &client.access_key(key)?, access_key, stdout)
        }
        AccessKeyCommand::Enable { key }
        | AccessKeyCommand::Disable { key }
        | AccessKeyCommand::SetLimit { key, .. }
        | AccessKeyCommand::SetReclaim { key, .. }
        | AccessKeyCommand::SetPreemptible { key, .. } => {
            let change = command.change().unwrap_or_default();
            show_to(
                out,
                &client.change_access_key(key, &change)?,
                access_key,
                stdout,
            )
        }
        AccessKeyCommand::Delete { key } => {
            show_to(out, &client.delete_access_key(key)?, access_key, stdout)
        }
    }
}

// Idle reclaim.
/// A key's reclaim defaults on one line: `idle_timeout 3600s, min_utilization cpu=5% over
/// 600s`, or `none`.
pub(super) fn reclaim_defaults(p: &crate::model::reclaim::ReclaimPolicy) -> String {
    let mut parts = Vec::new();
    if let Some(t) = p.max_lifetime {
        parts.push(format!("max_lifetime {t}s"));
    }
    if let Some(t) = p.idle_timeout {
        parts.push(format!("idle_timeout {t}s"));
    }
    if !p.min_utilization.is_empty() {
        let floors: Vec<String> = p
            .min_utilization
            .iter()
            .map(|(slot, pct)| format!("{slot}={pct}%"))
            .collect();
        let window = p
            .utilization_window
            .map_or_else(String::new, |w| format!(" over {w}s"));
        parts.push(format!("min_utilization {}{window}", floors.join(",")));
    } else if let Some(w) = p.utilization_window {
        parts.push(format!("utilization_window {w}s"));
    }
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

/// An access key's concurrency, `used/limit` (`unlimited` for a limit of 0).
fn concurrency(k: &AccessKey) -> String {
    let limit = match k.concurrency_limit {
        Some(0) => "unlimited".to_owned(),
        l => opt(l),
    };
    format!("{}/{limit}", opt(k.concurrency_used))
}

/// An access key's `enabled` as `enabled` / `disabled` (`-` when missing).
fn key_state(enabled: Option<bool>) -> String {
    match enabled {
        Some(true) => "enabled".to_owned(),
        Some(false) => "disabled".to_owned(),
        None => "-".to_owned(),
    }
}

/// One access key (`GET /v1/access-keys/{key}`, and the answers of `PATCH` / `DELETE` on it)
/// as `key: value` lines: the key, then `Name`, `Role`, `State` (`enabled`/`disabled`) and
/// `Created` (UTC) when the answer has them, and its concurrency, `used/limit` (`unlimited` for
/// 0).
fn access_key(v: &Value) -> String {
    with(v, |k: AccessKey| fields(&key_fields(&k)))
}

fn key_fields(k: &AccessKey) -> Vec<(&'static str, String)> {
    let mut pairs = vec![("Access key", text(&k.access_key))];
    if let Some(name) = &k.name {
        pairs.push(("Name", opt(name.as_ref())));
    }
    if let Some(role) = &k.role {
        pairs.push(("Role", opt(role.as_ref())));
    }
    if let Some(enabled) = k.enabled {
        pairs.push(("State", key_state(enabled)));
    }
    pairs.push(("Concurrency", concurrency(k)));
    // Idle reclaim: the key's defaults, where the answer has them.
    if let Some(p) = &k.reclaim {
        pairs.push(("Reclaim", reclaim_defaults(p)));
    }
    if let Some(created) = k.created_at {
        pairs.push(("Created", utc(created)));
    }
    if let Some(p) = k.preemptible {
        pairs.push(("Preemptible", if p { "yes" } else { "no" }.to_owned()));
    }
    pairs
}

/// The answer of `POST /v1/access-keys`: the key as [`access_key`] shows it with its
/// `Secret key`, then a note that the secret is shown only this once and is the key's token.
fn access_key_created(v: &Value) -> String {
    with(v, |k: NewAccessKey| {
        let mut pairs = key_fields(&k.key());
        pairs.insert(1, ("Secret key", text(&k.secret_key)));
        let mut out = fields(&pairs);
        out.push_str(
            "\nThe secret key is shown only this once: the manager keeps no copy it could show \
             again. Store it now. It is the key's token: kernelvisor ctl --token SECRET (or \
             KERNELVISOR_TOKEN=SECRET).\n",
        );
        out
    })
}

/// `GET /v1/access-keys` (`{"access_keys": [...]}`) as a table: ACCESS KEY, NAME, ROLE, STATE
/// (`enabled`/`disabled`), CONCURRENCY (`used/limit`), CREATED (UTC).
fn access_keys(v: &Value) -> String {
    with(v, |list: AccessKeyList| {
        let rows = list
            .access_keys
            .iter()
            .map(|k| {
                vec![
                    text(&k.access_key),
                    opt(k.name.clone().flatten()),
                    opt(k.role.clone().flatten()),
                    key_state(k.enabled.flatten()),
                    concurrency(k),
                    utc(k.created_at.flatten()),
                ]
            })
            .collect();
        table(
            vec![
                "ACCESS KEY",
                "NAME",
                "ROLE",
                "STATE",
                "CONCURRENCY",
                "CREATED",
            ],
            rows,
        )
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::ctl::client::ClientOptions;
    use crate::ctl::format;
    use crate::ctl::render::tests::{cells, NOW};
    use crate::ctl::test_util::{key_command, parse, text};
    use crate::ctl::testserver::{Answer, Server};

    fn key_object(extra: Value) -> Value {
        let mut v = json!({"access_key": "AKNEW", "role": "user", "name": "ci",
                           "concurrency_limit": 4, "concurrency_used": 0, "enabled": true,
                           "created_at": 1_700_000_000.0});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn access_key_commands_send_their_requests() {
        let created = key_object(json!({"secret_key": "sk-secret"})).to_string();
        let key = key_object(json!({})).to_string();
        let server = Server::start(vec![
            Answer::json(201, created.clone()),
            Answer::json(201, created.clone()),
            Answer::json(
                200,
                json!({"access_keys": [key_object(json!({}))]}).to_string(),
            ),
            Answer::json(200, key.clone()),
            Answer::json(200, key.clone()),
            Answer::json(200, key.clone()),
            Answer::json(200, key.clone()),
            Answer::json(200, key.clone()),
        ]);
        let options = ClientOptions {
            token: Some("admin-token".to_owned()),
            ca_cert: None,
        };
        let client = Client::with_options(&server.url, &options).unwrap();
        let run = |args: &[&str], out: Output| {
            let mut stdout = Vec::new();
            let code = super::run(&client, &key_command(args), out, &mut stdout).unwrap();
            assert_eq!(code, 0);
            text(stdout)
        };
        let table = run(
            &[
                "create",
                "--admin",
                "--concurrency-limit",
                "4",
                "--name",
                "ci",
            ],
            Output::Table,
        );
        assert!(table.contains("Secret key:  sk-secret\n"), "{table}");
        assert!(table.contains("shown only this once"), "{table}");
        let printed = run(&["create"], Output::Json);
        assert_eq!(
            printed,
            format::pretty_json(&created) + "\n",
            "as the API wrote it"
        );
        let table = run(&["list"], Output::Table);
        assert!(
            table.starts_with("ACCESS KEY") && table.contains("AKNEW"),
            "{table}"
        );
        run(&["show", "AK/1"], Output::Table);
        run(&["disable", "AKNEW"], Output::Table);
        run(&["enable", "AKNEW"], Output::Table);
        let table = run(&["set-limit", "AKNEW", "0"], Output::Table);
        assert!(table.contains("State:       enabled"), "{table}");
        run(&["delete", "AKNEW"], Output::Table);

        let requests = server.requests();
        let seen: Vec<(&str, Option<Value>)> = requests
            .iter()
            .map(|r| {
                assert_eq!(r.header("authorization"), Some("Bearer admin-token"));
                (r.line.as_str(), serde_json::from_str(&r.body).ok())
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "POST /v1/access-keys",
                    Some(json!({"role": "admin", "concurrency_limit": 4, "name": "ci"}))
                ),
                ("POST /v1/access-keys", Some(json!({"role": "user"}))),
                ("GET /v1/access-keys", None),
                ("GET /v1/access-keys/AK%2F1", None),
                (
                    "PATCH /v1/access-keys/AKNEW",
                    Some(json!({"enabled": false}))
                ),
                (
                    "PATCH /v1/access-keys/AKNEW",
                    Some(json!({"enabled": true}))
                ),
                (
                    "PATCH /v1/access-keys/AKNEW",
                    Some(json!({"concurrency_limit": 0}))
                ),
                ("DELETE /v1/access-keys/AKNEW", None),
            ]
        );
        for r in &requests[..2] {
            assert_eq!(r.header("content-type"), Some("application/json"));
        }
        assert!(parse(&["access-key", "set-limit", "AK", "-1"]).is_err());
        assert!(parse(&["access-key", "create", "--concurrency-limit", "x"]).is_err());
        // Idle reclaim: the key's defaults as one PATCH body; none given clears them.
        let set = parse(&[
            "access-key",
            "set-reclaim",
            "AK1",
            "--idle-timeout",
            "3600",
            "--min-utilization",
            "cpu=5",
            "--min-utilization",
            "cuda.device=10",
        ])
        .unwrap();
        let crate::ctl::CtlCommand::AccessKey(cmd) = set.command else {
            panic!("not an access-key command")
        };
        let body = serde_json::to_value(cmd.change().unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"reclaim": {"idle_timeout": 3600.0, "min_utilization": {"cpu": 5.0, "cuda.device": 10.0}}})
        );
        let clear = parse(&["access-key", "set-reclaim", "AK1"]).unwrap();
        let crate::ctl::CtlCommand::AccessKey(cmd) = clear.command else {
            panic!("not an access-key command")
        };
        assert_eq!(
            serde_json::to_value(cmd.change().unwrap()).unwrap(),
            serde_json::json!({"reclaim": {}})
        );
        assert!(parse(&[
            "access-key",
            "set-reclaim",
            "AK1",
            "--min-utilization",
            "cpu"
        ])
        .is_err());
    }

    #[test]
    fn access_keys_shown() {
        let key = json!({"access_key": "AKUSER1", "role": "user", "name": "alice",
                         "concurrency_limit": 2, "concurrency_used": 1, "enabled": true,
                         "created_at": NOW});
        assert_eq!(
            access_key(&key),
            "Access key:  AKUSER1\nName:        alice\nRole:        user\nState:       enabled\n\
             Concurrency: 1/2\nCreated:     2023-11-14T22:13:20Z\n"
        );
        let mut created = key.clone();
        created["secret_key"] = json!("sk-0123");
        created["name"] = Value::Null;
        let out = access_key_created(&created);
        assert!(
            out.starts_with("Access key:  AKUSER1\nSecret key:  sk-0123\nName:        -\n"),
            "{out}"
        );
        assert!(out.contains("shown only this once"), "{out}");

        let mut admin = key.clone();
        admin["access_key"] = json!("AKADMIN");
        admin["role"] = json!("admin");
        admin["enabled"] = json!(false);
        admin["concurrency_limit"] = json!(0);
        admin["name"] = Value::Null;
        let out = access_keys(&json!({"access_keys": [key, admin]}));
        let rows: Vec<Vec<&str>> = out.lines().map(cells).collect();
        assert_eq!(
            rows,
            [
                vec![
                    "ACCESS KEY",
                    "NAME",
                    "ROLE",
                    "STATE",
                    "CONCURRENCY",
                    "CREATED"
                ],
                vec![
                    "AKUSER1",
                    "alice",
                    "user",
                    "enabled",
                    "1/2",
                    "2023-11-14T22:13:20Z"
                ],
                vec![
                    "AKADMIN",
                    "-",
                    "admin",
                    "disabled",
                    "1/unlimited",
                    "2023-11-14T22:13:20Z"
                ],
            ]
        );
    }

    #[test]
    fn small_objects() {
        assert_eq!(
            access_key(
                &json!({"access_key": "AKIADEV", "concurrency_used": 1, "concurrency_limit": 0})
            ),
            "Access key:  AKIADEV\nConcurrency: 1/unlimited\n"
        );
        assert!(access_key(
            &json!({"access_key": "K", "concurrency_used": 2, "concurrency_limit": 3})
        )
        .ends_with("2/3\n"));
    }
}
