//! Security and tenancy with real processes (a manager, a Docker agent, CURVE), on SQLite and
//! PostgreSQL: every route but `/health` needs a valid bearer token; user keys are confined to
//! their own sessions and vfolders; admin routes are an admin's; keys are managed over the API
//! and disabled at once; no secret is stored in clear; the bootstrap token file is 0600 and
//! survives a restart; a store outage is 503 `store-unavailable`; mutating calls are audited.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use serde_json::{json, Value as Json};

use common::agent::TEST_IMAGE;
use common::cluster::{wait_for, Answer, Cluster, Db};

const LONG: Duration = Duration::from_secs(60);

/// Every route the API serves (method, path), with ids that need not exist: without a valid
/// token each must answer 401 before anything else is looked at.
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/s1"),
    ("DELETE", "/v1/sessions/s1"),
    ("POST", "/v1/sessions/s1/execute"),
    ("GET", "/v1/sessions/s1/logs"),
    ("POST", "/v1/sessions/s1/commit"),
    ("GET", "/v1/sessions/s1/commit"),
    ("GET", "/v1/sessions/s1/services"),
    ("POST", "/v1/sessions/s1/services/web"),
    ("DELETE", "/v1/sessions/s1/services/web"),
    ("GET", "/v1/sessions/s1/files"),
    ("PUT", "/v1/sessions/s1/files/a.txt"),
    ("GET", "/v1/sessions/s1/files/a.txt"),
    ("GET", "/v1/agents"),
    ("POST", "/v1/agents/a1/images/purge"),
    ("POST", "/v1/access-keys"),
    ("GET", "/v1/access-keys"),
    ("GET", "/v1/access-keys/AK1"),
    ("PATCH", "/v1/access-keys/AK1"),
    ("DELETE", "/v1/access-keys/AK1"),
    ("POST", "/v1/vfolders"),
    ("GET", "/v1/vfolders"),
    ("DELETE", "/v1/vfolders/v1"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/metrics"),
];

fn create(c: &Cluster, token: &str, extra: Json) -> Answer {
    let mut body = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c.post_as(Some(token), "/v1/sessions", &body)
}

fn session_id(a: &Answer) -> String {
    assert_eq!(a.status, 201, "create: {a:?}");
    a.body["session_id"].as_str().unwrap().to_owned()
}

/// Every byte the store holds, as text: the SQLite files, or every table of the PostgreSQL
/// database rendered row by row.
fn store_text(c: &Cluster) -> String {
    match c.db {
        Db::Sqlite => {
            let mut all = Vec::new();
            for f in std::fs::read_dir(c.dir.path()).unwrap() {
                let p = f.unwrap().path();
                if p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("manager.db")
                {
                    all.extend(std::fs::read(&p).unwrap());
                }
            }
            String::from_utf8_lossy(&all).into_owned()
        }
        Db::Postgres => {
            let url = c.store_url.clone();
            actix_rt::Runtime::new().unwrap().block_on(async move {
                use sqlx::{Connection, Row};
                let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
                let tables: Vec<String> =
                    sqlx::query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                        .fetch_all(&mut conn)
                        .await
                        .unwrap()
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                let mut out = String::new();
                for t in tables {
                    let rows = sqlx::query(&format!("SELECT t::text FROM \"{t}\" t"))
                        .fetch_all(&mut conn)
                        .await
                        .unwrap();
                    for r in rows {
                        out.push_str(&r.get::<String, _>(0));
                        out.push('\n');
                    }
                }
                out
            })
        }
    }
}

fn tenancy(db: Db, ports: u16) {
    let mut c = Cluster::new(db);
    c.start_manager();
    let token_file = c.dir.path().join("admin-token");
    let admin = c.admin_token.clone();
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "admin token file mode {mode:o}");
    let a = c.add_agent("sec", ports, "");
    let agent_id = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent_id, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });

    // 1. No token, a malformed one, an unknown one: 401 with WWW-Authenticate, on every route.
    let unknown = format!("kvs_{}", "A".repeat(43));
    for (method, path) in ROUTES {
        for token in [None, Some("not-a-token"), Some(unknown.as_str())] {
            let r = c.call_as(token, method, path, None);
            assert_eq!(
                (r.status, r.code()),
                (401, "unauthorized"),
                "{method} {path} with {token:?}: {r:?}"
            );
        }
    }
    let raw = ureq::get(&format!("{}/v1/sessions", c.api)).call();
    match raw {
        Err(ureq::Error::Status(401, r)) => {
            assert!(r.header("WWW-Authenticate").unwrap().starts_with("Bearer"))
        }
        other => panic!("expected 401: {other:?}"),
    }
    assert_eq!(
        c.get_as(None, "/health").unwrap().status,
        200,
        "/health is public"
    );

    // 2. Two user keys, one admin.
    let (ak1, t1) = (c.access_key.clone(), c.token.clone());
    let (ak2, t2) = c.new_key(false);
    assert_ne!(ak1, ak2);
    let s1 = session_id(&create(&c, &t1, json!({})));
    let s2 = session_id(&create(&c, &t2, json!({})));
    for (sid, token) in [(&s1, &t1), (&s2, &t2)] {
        wait_for(LONG, "session RUNNING", || {
            (c.get_as(Some(token), &format!("/v1/sessions/{sid}"))
                .ok()?
                .body["status"]
                == "RUNNING")
                .then_some(())
        });
    }
    // Lists show only one's own; the owner comes from the token.
    let listed = |t: &str| -> Vec<String> {
        c.get_as(Some(t), "/v1/sessions").unwrap().body["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["session_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(listed(&t1), vec![s1.clone()]);
    assert_eq!(listed(&t2), vec![s2.clone()]);
    let mut both = listed(&admin);
    both.sort();
    let mut expected = vec![s1.clone(), s2.clone()];
    expected.sort();
    assert_eq!(both, expected, "an admin sees every key's sessions");
    assert_eq!(
        c.get_as(Some(&t1), &format!("/v1/sessions/{s1}"))
            .unwrap()
            .body["access_key"],
        ak1.as_str()
    );
    // Another key's session is exactly a missing one, on every session route.
    let foreign: Vec<(&str, String, Option<Json>)> = vec![
        ("GET", format!("/v1/sessions/{s2}"), None),
        (
            "POST",
            format!("/v1/sessions/{s2}/execute"),
            Some(json!({"code": "echo hi"})),
        ),
        ("GET", format!("/v1/sessions/{s2}/logs"), None),
        ("GET", format!("/v1/sessions/{s2}/files"), None),
        ("GET", format!("/v1/sessions/{s2}/files/x.txt"), None),
        (
            "PUT",
            format!("/v1/sessions/{s2}/files/x.txt"),
            Some(json!({})),
        ),
        ("GET", format!("/v1/sessions/{s2}/services"), None),
        (
            "POST",
            format!("/v1/sessions/{s2}/services/web"),
            Some(json!({})),
        ),
        ("DELETE", format!("/v1/sessions/{s2}/services/web"), None),
        ("DELETE", format!("/v1/sessions/{s2}"), None),
    ];
    for (method, path, body) in &foreign {
        let r = c.call_as(Some(&t1), method, path, body.as_ref());
        assert_eq!(
            (r.status, r.code()),
            (404, "session-not-found"),
            "{method} {path}: {r:?}"
        );
    }
    assert_eq!(
        c.get_as(Some(&t2), &format!("/v1/sessions/{s2}"))
            .unwrap()
            .body["status"],
        "RUNNING",
        "untouched by the other key"
    );
    // The admin can act on it.
    let out = c.post_as(
        Some(&admin),
        &format!("/v1/sessions/{s2}/execute"),
        &json!({"code": "echo admin-was-here"}),
    );
    assert_eq!(out.status, 200, "{out:?}");
    // A user cannot create on behalf of another key; an admin can.
    let r = create(&c, &t1, json!({"access_key": ak2}));
    assert_eq!((r.status, r.code()), (403, "forbidden"));
    let on_behalf = session_id(&create(&c, &admin, json!({"access_key": ak2})));
    assert_eq!(
        c.get_as(Some(&t2), &format!("/v1/sessions/{on_behalf}"))
            .unwrap()
            .body["access_key"],
        ak2.as_str()
    );
    assert_eq!(
        c.delete_as(Some(&t2), &format!("/v1/sessions/{on_behalf}"))
            .status,
        200
    );

    // 3. Admin routes: 403 for a user, 200 for the admin.
    for (method, path, body) in [
        ("GET", "/v1/agents".to_owned(), None),
        ("GET", "/metrics".to_owned(), None),
        ("GET", "/v1/access-keys".to_owned(), None),
        (
            "POST",
            "/v1/access-keys".to_owned(),
            Some(json!({"role": "admin"})),
        ),
        ("GET", format!("/v1/access-keys/{ak2}"), None),
        (
            "PATCH",
            format!("/v1/access-keys/{ak2}"),
            Some(json!({"enabled": false})),
        ),
        ("DELETE", format!("/v1/access-keys/{ak2}"), None),
        ("GET", "/v1/vfolders?all=true".to_owned(), None),
        ("GET", format!("/v1/sessions?access_key={ak2}"), None),
    ] {
        let r = c.call_as(Some(&t1), method, &path, body.as_ref());
        assert_eq!(
            (r.status, r.code()),
            (403, "forbidden"),
            "{method} {path}: {r:?}"
        );
    }
    assert_eq!(c.get_as(Some(&admin), "/v1/agents").unwrap().status, 200);
    assert_eq!(c.get_as(Some(&admin), "/metrics").unwrap().status, 200);
    let keys = c.get_as(Some(&admin), "/v1/access-keys").unwrap();
    assert_eq!(keys.status, 200);
    let listed_keys = keys.body["access_keys"].as_array().unwrap();
    assert_eq!(
        listed_keys.len(),
        3,
        "bootstrap admin + two users: {keys:?}"
    );
    assert!(listed_keys.iter().all(|k| k.get("secret_key").is_none()));
    assert_eq!(
        c.get_as(Some(&t1), &format!("/v1/access-keys/{ak1}"))
            .unwrap()
            .status,
        200,
        "a key reads itself"
    );

    // 4. vfolders by name: each key's own; a host path from a user is refused.
    for (t, name) in [(&t1, "data"), (&t2, "data"), (&t2, "private")] {
        let r = c.post_as(Some(t), "/v1/vfolders", &json!({"name": name}));
        assert_eq!(r.status, 201, "{r:?}");
    }
    let r = c.post_as(Some(&t1), "/v1/vfolders", &json!({"name": "data"}));
    assert_eq!((r.status, r.code()), (409, "vfolder-exists"));
    for bad in ["../x", ".hidden", "a/b", ""] {
        let r = c.post_as(Some(&t1), "/v1/vfolders", &json!({"name": bad}));
        assert_eq!((r.status, r.code()), (400, "invalid-request"), "{bad}");
    }
    let names = |t: &str| -> Vec<String> {
        c.get_as(Some(t), "/v1/vfolders").unwrap().body["vfolders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&t1), vec!["data"]);
    assert_eq!(names(&t2), vec!["data", "private"]);
    let r = create(
        &c,
        &t1,
        json!({"mounts": [{"name": "private", "permission": "rw"}]}),
    );
    assert_eq!(
        (r.status, r.code()),
        (404, "vfolder-not-found"),
        "another key's vfolder"
    );
    let r = create(
        &c,
        &t1,
        json!({"mounts": [{"name": "data", "host_path": "/etc"}]}),
    );
    assert_eq!(
        (r.status, r.code()),
        (400, "invalid-request"),
        "a host path: {r:?}"
    );
    // A mounted vfolder is the key's own directory under the agent's vfolder root, created on
    // first mount and owned by the kernel's user; the other key's `data` is another directory.
    let m1 = session_id(&create(
        &c,
        &t1,
        json!({"mounts": [{"name": "data", "permission": "rw"}]}),
    ));
    wait_for(LONG, "mounting session RUNNING", || {
        (c.get_as(Some(&t1), &format!("/v1/sessions/{m1}"))
            .ok()?
            .body["status"]
            == "RUNNING")
            .then_some(())
    });
    let out = c.post_as(
        Some(&t1),
        &format!("/v1/sessions/{m1}/execute"),
        &json!({"code": "echo mine > /home/work/data/f.txt && cat /home/work/data/f.txt", "flush_timeout": 10}),
    );
    assert_eq!(out.status, 200, "{out:?}");
    let dir = c.agents[a]
        .fixture
        .dir
        .path()
        .join("vfolders")
        .join(&ak1)
        .join("data");
    assert_eq!(
        std::fs::read_to_string(dir.join("f.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::metadata(&dir).unwrap().uid(),
        1000,
        "owned by the kernel's user"
    );
    assert!(!c.agents[a]
        .fixture
        .dir
        .path()
        .join("vfolders")
        .join(&ak2)
        .join("data")
        .join("f.txt")
        .exists());
    let r = c.delete_as(Some(&t1), "/v1/vfolders/data");
    assert_eq!((r.status, r.code()), (409, "vfolder-in-use"), "{r:?}");
    assert_eq!(
        c.delete_as(Some(&t1), &format!("/v1/sessions/{m1}")).status,
        200
    );
    assert_eq!(c.delete_as(Some(&t1), "/v1/vfolders/data").status, 200);
    assert_eq!(
        c.delete_as(Some(&t1), "/v1/vfolders/data").code(),
        "vfolder-not-found"
    );

    // 5. A disabled key is refused at once; enabled again, it works.
    let r = c.call_as(
        Some(&admin),
        "PATCH",
        &format!("/v1/access-keys/{ak2}"),
        Some(&json!({"enabled": false})),
    );
    assert_eq!(
        (r.status, r.body["enabled"].as_bool()),
        (200, Some(false)),
        "{r:?}"
    );
    let r = c.get_as(Some(&t2), "/v1/sessions").unwrap();
    assert_eq!((r.status, r.code()), (401, "unauthorized"));
    let r = c.call_as(
        Some(&admin),
        "PATCH",
        &format!("/v1/access-keys/{ak2}"),
        Some(&json!({"enabled": true, "concurrency_limit": 5})),
    );
    assert_eq!(r.body["concurrency_limit"], 5);
    assert_eq!(c.get_as(Some(&t2), "/v1/sessions").unwrap().status, 200);
    // An admin cannot lock itself out.
    let me = c.get_as(Some(&admin), "/v1/access-keys").unwrap().body["access_keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["role"] == "admin")
        .unwrap()["access_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = c.call_as(
        Some(&admin),
        "PATCH",
        &format!("/v1/access-keys/{me}"),
        Some(&json!({"enabled": false})),
    );
    assert_eq!(r.status, 400, "{r:?}");
    // A key with live sessions is not deleted; without, it is, and its token stops working.
    let r = c.delete_as(Some(&admin), &format!("/v1/access-keys/{ak2}"));
    assert_eq!((r.status, r.code()), (409, "access-key-in-use"));
    assert_eq!(
        c.delete_as(Some(&t2), &format!("/v1/sessions/{s2}")).status,
        200
    );
    assert_eq!(
        c.delete_as(Some(&admin), &format!("/v1/access-keys/{ak2}"))
            .status,
        200
    );
    assert_eq!(c.get_as(Some(&t2), "/v1/sessions").unwrap().status, 401);

    // 6. No secret in the store, in any form but its hash.
    let text = store_text(&c);
    for secret in [&admin, &t1, &t2] {
        assert!(
            !text.contains(secret.as_str()),
            "a secret is stored in clear"
        );
        assert!(
            !text.contains(&secret[4..]),
            "a secret's body is stored in clear"
        );
    }
    assert!(text.contains(&ak1), "the search does read the store");

    // 7. The admin token file survives a restart unchanged and keeps working.
    c.stop_manager("TERM");
    c.start_manager();
    assert_eq!(
        std::fs::read_to_string(&token_file).unwrap().trim(),
        admin,
        "token file rewritten"
    );
    assert_eq!(
        c.get_as(Some(&admin), "/v1/access-keys").unwrap().status,
        200
    );
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // 8. Audit: mutating calls, with the key and the status, never a secret.
    let log = std::fs::read_to_string(c.dir.path().join("manager.log")).unwrap();
    let audit: Vec<&str> = log.lines().filter(|l| l.contains("audit")).collect();
    assert!(
        audit.iter().any(|l| l.contains(&ak1)
            && l.contains("POST")
            && l.contains("/v1/sessions")
            && l.contains("201")),
        "no audit line for a session create: {audit:?}"
    );
    assert!(
        audit
            .iter()
            .any(|l| l.contains("PATCH") && l.contains(&format!("/v1/access-keys/{ak2}"))),
        "no audit line for a key change: {audit:?}"
    );
    for secret in [&admin, &t1, &t2] {
        assert!(
            !log.contains(secret.as_str()),
            "a secret is in the manager's log"
        );
    }

    wait_for(LONG, "normal mode after the restart", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    assert_eq!(
        c.delete_as(Some(&t1), &format!("/v1/sessions/{s1}")).status,
        200
    );
    c.check_invariants();
}

#[test]
fn tenancy_and_credentials_sqlite() {
    tenancy(Db::Sqlite, 36300);
}

#[test]
fn tenancy_and_credentials_postgres() {
    tenancy(Db::Postgres, 36330);
}

/// PostgreSQL goes away (its database renamed under the manager): requests get 503
/// `store-unavailable` with `Retry-After`, never 500; when it is back, so is the API.
#[test]
fn a_store_outage_is_503_store_unavailable_postgres() {
    let mut c = Cluster::new(Db::Postgres);
    c.start_manager();
    let admin = c.admin_token.clone();
    let db = c.store_url.rsplit('/').next().unwrap().to_owned();
    let admin_url = common::cluster::postgres_admin_url();
    let sql = |q: String| {
        let url = admin_url.clone();
        actix_rt::Runtime::new().unwrap().block_on(async move {
            use sqlx::{Connection, Executor};
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            conn.execute(q.as_str()).await.map(|_| ())
        })
    };
    let away = format!("{db}_away");
    // The manager's pool reconnects at once: terminate and rename until the rename wins.
    wait_for(LONG, "the database renamed away", || {
        let _ = sql(format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'"
        ));
        sql(format!("ALTER DATABASE {db} RENAME TO {away}")).ok()
    });
    let r = c.get_as(Some(&admin), "/v1/sessions").unwrap();
    let restored = sql(format!("ALTER DATABASE {away} RENAME TO {db}"));
    assert_eq!((r.status, r.code()), (503, "store-unavailable"), "{r:?}");
    assert!(r.retry_after.is_some(), "Retry-After: {r:?}");
    restored.unwrap();
    wait_for(LONG, "the API back with its store", || {
        (c.get_as(Some(&admin), "/v1/sessions").ok()?.status == 200).then_some(())
    });
}
