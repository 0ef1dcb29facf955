//! The OpenAPI document's surface (every path with its methods, every component schema name)
//! is pinned in `tests/fixtures/openapi-surface.json`: a refactor of the types behind the
//! document must not add, drop or rename an operation or a schema. After a deliberate change
//! of the API, regenerate the fixture with `KV_WRITE_OPENAPI_SURFACE=1 cargo test --lib
//! openapi_surface` and review its diff.

use std::collections::BTreeSet;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/openapi-surface.json"
);

/// `{"operations": ["get /health", …], "schemas": ["AccessKey", …]}`, sorted.
fn surface() -> serde_json::Value {
    let doc: serde_json::Value =
        serde_json::from_str(super::openapi::document()).expect("the document is JSON");
    let mut operations = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if ["get", "put", "post", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                operations.insert(format!("{method} {path}"));
            }
        }
    }
    let schemas: BTreeSet<&String> = doc["components"]["schemas"]
        .as_object()
        .expect("component schemas")
        .keys()
        .collect();
    serde_json::json!({"operations": operations, "schemas": schemas})
}

#[test]
fn openapi_surface_is_unchanged() {
    let now = surface();
    if std::env::var_os("KV_WRITE_OPENAPI_SURFACE").is_some() {
        let text = serde_json::to_string_pretty(&now).unwrap() + "\n";
        std::fs::write(FIXTURE, text).expect("write the fixture");
        return;
    }
    let pinned: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(FIXTURE).expect("the fixture exists"))
            .expect("the fixture is JSON");
    for key in ["operations", "schemas"] {
        let set = |v: &serde_json::Value| -> BTreeSet<String> {
            v[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect()
        };
        let (was, is) = (set(&pinned), set(&now));
        let gone: Vec<_> = was.difference(&is).collect();
        let new: Vec<_> = is.difference(&was).collect();
        assert!(
            gone.is_empty() && new.is_empty(),
            "{key} changed: gone {gone:?}, new {new:?}"
        );
    }
}

/// The model's lists of reply schemas name schemas the document has (a renamed type would
/// otherwise silently lose its `additionalProperties: false`).
#[test]
fn reply_lists_name_document_schemas() {
    let doc: serde_json::Value =
        serde_json::from_str(super::openapi::document()).expect("the document is JSON");
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in crate::model::REPLIES {
        assert!(schemas.contains_key(*name), "{name} is not in the document");
    }
    for name in crate::model::CLOSED_REPLIES {
        assert!(
            crate::model::REPLIES.contains(name),
            "{name} is not a reply"
        );
        assert_eq!(
            schemas[*name]["additionalProperties"], false,
            "{name} is closed"
        );
    }
}
