//! The API's OpenAPI document (`GET /v1/openapi.json`): its frame. utoipa generates it from
//! the handlers' `#[utoipa::path]` annotations and the request and reply types of
//! [`crate::model`], the same types the handlers return (a handler's answer that does not match
//! its schema is a bug, and the fuzz test `tests/it/api_fuzz.rs` looks for them); error answers
//! many operations share are declared once in `super::responses`.
//!
//! Every operation needs the `bearer` security scheme (an access key's secret key) except
//! `GET /health`; [`Fixups`] adds what every authenticated operation can answer (401
//! `unauthorized`, 500 `internal`, 503 `store-unavailable`) and 400 `invalid-request` for a path
//! or query parameter that does not decode.

use std::sync::OnceLock;

use actix_web::{get, HttpResponse};
use utoipa::openapi::path::{HttpMethod, Operation};
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};
use utoipa_actix_web::AppExt;

use super::auth::Caller;
use crate::model::error::ErrorBody;
use crate::model::{CLOSED_REPLIES, REPLIES};

/// Name of the security scheme: `Authorization: Bearer <secret key>` (the literal `"bearer"`
/// of the `security(...)` attributes).
pub const SECURITY_SCHEME: &str = "bearer";

/// The OpenAPI document's frame: its info, tags and security; the operations come from
/// [`super::routes`] ([`document`]).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "kernelvisor manager API",
        description = "Sessions (one kernel each), their execute runs, logs, services and files; \
                       the event stream; vfolders; agents; access keys; health and metrics. Every error is \
                       `{\"error\": {\"code\", \"message\"}}`: clients branch on `code`. \
                       Contract: docs/manager-api.md.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(ErrorBody, crate::model::event::Event)),
    security(("bearer" = [])),
    tags(
        (name = "sessions", description = "Sessions: create, list, show, destroy, execute, logs"),
        (name = "services", description = "Services on a session's service ports"),
        (name = "files", description = "Files in a session's /home/work"),
        (name = "events", description = "The event stream: session status, pull progress, agent liveness (server-sent events)"),
        (name = "vfolders", description = "The caller's vfolders"),
        (name = "access-keys", description = "Access keys (admin, but a key may read itself)"),
        (name = "system", description = "Agents, health, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// The document as JSON text, built once: [`ApiDoc`]'s frame, every operation of
/// [`super::routes`] (and the schemas they name), then [`Fixups`].
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        // The routes register with an app that is never run: only their operations are kept.
        let (_, mut doc) = actix_web::App::new()
            .into_utoipa_app()
            .openapi(ApiDoc::openapi())
            .configure(super::routes)
            .split_for_parts();
        Fixups.modify(&mut doc);
        doc.to_json().expect("the OpenAPI document serializes")
    })
}

/// This document (OpenAPI 3.1). Readable with any valid key.
#[utoipa::path(
    operation_id = "openapi_document",
    tag = "system",
    security(("bearer" = [])),
    responses((status = 200, description = "The OpenAPI document", body = OpenApiDocument)),
)]
#[get("/v1/openapi.json")]
pub(super) async fn serve(_caller: Caller) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document())
}

/// What every operation gets besides its own annotations: the `bearer` scheme (applied to
/// every operation but `GET /health`, which gets `security: []`), the answers of the
/// authentication middleware and of the store (401, 500, 503), and 400 for operations with
/// parameters (a path or query parameter that does not decode). And the reply schemas as the
/// manager writes them ([`close_replies`]).
pub struct Fixups;

impl Modify for Fixups {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        close_replies(&mut components.schemas);
        components.add_security_scheme(
            SECURITY_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("kernelvisor secret key")
                    .description(Some(
                        "`Authorization: Bearer <secret key>` (`kvs_…`): the secret key of an \
                         enabled access key. The bootstrap admin key's secret is in `[api] \
                         admin-token-file`; `POST /v1/access-keys` makes more.",
                    ))
                    .build(),
            ),
        );
        for (path, item) in openapi.paths.paths.iter_mut() {
            for method in [
                HttpMethod::Get,
                HttpMethod::Put,
                HttpMethod::Post,
                HttpMethod::Delete,
                HttpMethod::Patch,
            ] {
                let op = match method {
                    HttpMethod::Get => item.get.as_mut(),
                    HttpMethod::Put => item.put.as_mut(),
                    HttpMethod::Post => item.post.as_mut(),
                    HttpMethod::Delete => item.delete.as_mut(),
                    HttpMethod::Patch => item.patch.as_mut(),
                    _ => None,
                };
                if let Some(op) = op {
                    fix_operation(path, op);
                }
            }
        }
    }
}

/// The model's reply types are lenient for readers (`#[serde(default)]`, unknown keys
/// ignored), which utoipa would write as a `default` on every property; the manager always
/// writes every key, so the document lists no defaults for them, and closes those whose keys
/// are exactly the type's fields ([`CLOSED_REPLIES`]: `additionalProperties: false`).
fn close_replies(schemas: &mut std::collections::BTreeMap<String, RefOr<Schema>>) {
    for (name, schema) in schemas.iter_mut() {
        let RefOr::T(Schema::Object(object)) = schema else {
            continue;
        };
        if REPLIES.contains(&name.as_str()) {
            for property in object.properties.values_mut() {
                match property {
                    RefOr::T(Schema::Object(p)) => p.default = None,
                    RefOr::T(Schema::Array(p)) => p.default = None,
                    // utoipa wraps a `$ref` in a one-item `oneOf` to give it a default.
                    RefOr::T(Schema::OneOf(p)) if p.items.len() == 1 => {
                        *property = p.items.remove(0);
                    }
                    _ => {}
                }
            }
        }
        if CLOSED_REPLIES.contains(&name.as_str()) {
            object.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
        }
    }
}

fn fix_operation(path: &str, op: &mut Operation) {
    let public = path == "/health";
    if public {
        op.security = Some(Vec::new());
    } else if op.security.is_none() {
        op.security = Some(vec![SecurityRequirement::new(
            SECURITY_SCHEME,
            Vec::<String>::new(),
        )]);
    }
    let has_params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
    let mut add = |status: &str, description: &str, header: Option<(&str, &str)>| {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| error_response(description, header).into());
    };
    if has_params {
        add(
            "400",
            "`invalid-request`: a path or query parameter that does not decode",
            None,
        );
    }
    if !public {
        add(
            "401",
            "`unauthorized`: no `Authorization: Bearer <secret key>`, or a malformed, unknown or \
             disabled one (with `WWW-Authenticate: Bearer`)",
            Some(("WWW-Authenticate", "`Bearer realm=\"kernelvisor\"`")),
        );
        add(
            "503",
            "`store-unavailable`: the manager's store cannot be reached (with `Retry-After`)",
            Some(("Retry-After", "Seconds to wait before retrying")),
        );
    }
    add("500", "`internal`: the store failed, or a bug", None);
}

/// An error answer: the envelope as `application/json`, with an optional header.
fn error_response(description: &str, header: Option<(&str, &str)>) -> utoipa::openapi::Response {
    let content = ContentBuilder::new()
        .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
            ErrorBody::name(),
        ))))
        .build();
    let mut r = ResponseBuilder::new()
        .description(description)
        .content("application/json", content);
    if let Some((name, text)) = header {
        r = r.header(
            name,
            HeaderBuilder::new()
                .schema(String::schema())
                .description(Some(text))
                .build(),
        );
    }
    r.build()
}

/// An OpenAPI document.
pub struct OpenApiDocument;

impl PartialSchema for OpenApiDocument {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some("An OpenAPI 3.1 document"))
            .property(
                "openapi",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(r"^3\.")),
            )
            .property("info", ObjectBuilder::new().schema_type(Type::Object))
            .property("paths", ObjectBuilder::new().schema_type(Type::Object))
            .required("openapi")
            .required("info")
            .required("paths")
            .into()
    }
}

impl ToSchema for OpenApiDocument {}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use actix_web::{test as atest, App};

    use super::*;
    use crate::manager::error::ManagerError;

    /// Every route `configure` serves: (method, path in OpenAPI form), as pinned by the surface
    /// fixture (`super::super::surface_tests`), so that no path is written here again.
    fn routes() -> BTreeSet<(String, String)> {
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/openapi-surface.json"
        );
        let pinned: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture).expect("the fixture exists"))
                .expect("the fixture is JSON");
        pinned["operations"]
            .as_array()
            .expect("operations")
            .iter()
            .map(|op| {
                let (method, path) = op.as_str().unwrap().split_once(' ').unwrap();
                (method.to_owned(), path.to_owned())
            })
            .collect()
    }

    const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

    fn doc() -> serde_json::Value {
        serde_json::from_str(document()).expect("the document is JSON")
    }

    #[test]
    fn document_lists_every_route_with_security() {
        let doc = doc();
        assert!(
            doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
            "openapi: {}",
            doc["openapi"]
        );
        assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));
        let scheme = &doc["components"]["securitySchemes"][SECURITY_SCHEME];
        assert_eq!(scheme["type"], "http");
        assert_eq!(scheme["scheme"], "bearer");
        assert_eq!(scheme["bearerFormat"], "kernelvisor secret key");
        let mut in_doc = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().unwrap() {
                if !METHODS.contains(&method.as_str()) {
                    continue;
                }
                in_doc.insert((method.clone(), path.clone()));
                let security = &op["security"];
                if path == "/health" {
                    assert_eq!(security, &serde_json::json!([]), "{method} {path}");
                } else {
                    assert_eq!(
                        security,
                        &serde_json::json!([{"bearer": []}]),
                        "{method} {path}"
                    );
                    assert!(op["responses"]["401"].is_object(), "{method} {path}: 401");
                }
                assert!(
                    op["operationId"].is_string(),
                    "{method} {path}: operationId"
                );
                // A WebSocket route's success is its upgrade, 101.
                let ok = op["responses"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .any(|s| s.starts_with('2') || s == "101");
                assert!(ok, "{method} {path}: no 2xx (or 101) answer");
            }
        }
        let listed = routes();
        let missing: Vec<_> = listed.difference(&in_doc).collect();
        let extra: Vec<_> = in_doc.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "routes not in the document: {missing:?}"
        );
        assert!(
            extra.is_empty(),
            "document operations not served: {extra:?}"
        );
        let ids: BTreeSet<&str> = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|i| i.as_object().unwrap().values())
            .filter_map(|op| op["operationId"].as_str())
            .collect();
        assert_eq!(ids.len(), listed.len(), "operation ids are unique");
    }

    /// [`routes`] is what `configure` serves: each (method, path) reaches a handler (not the
    /// app's 404 `not-found`, nor 405), and every other method on those paths is 405
    /// `method-not-allowed`; a path no route has is 404 `not-found`.
    #[actix_web::test]
    async fn routes_are_what_configure_serves() {
        let app = atest::init_service(App::new().configure(super::super::configure)).await;
        let routes = routes();
        let paths: BTreeSet<&str> = routes.iter().map(|(_, p)| p.as_str()).collect();
        for path in paths {
            let uri = path
                .replace("{id}", "s1")
                .replace("{name}", "n1")
                .replace("{key}", "AK1")
                .replace("{path}", "a/b.txt");
            for method in METHODS {
                let req = atest::TestRequest::default()
                    .method(method.to_uppercase().parse().unwrap())
                    .uri(&uri)
                    .to_request();
                let resp = atest::call_service(&app, req).await;
                let status = resp.status().as_u16();
                let body: serde_json::Value =
                    serde_json::from_slice(&atest::read_body(resp).await).unwrap_or_default();
                let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
                let unrouted = (status == 404 && code == "not-found")
                    || (status == 405 && code == "method-not-allowed");
                let routed = !unrouted;
                let listed = routes.contains(&(method.to_owned(), path.to_owned()));
                assert_eq!(
                    routed, listed,
                    "{method} {uri}: {status} {code} (listed: {listed})"
                );
                if !listed {
                    assert_eq!(
                        (status, code.as_str()),
                        (405, "method-not-allowed"),
                        "{method} {uri}"
                    );
                }
            }
        }
        for uri in ["/v1/nothing", "/v1/sessions/s1/", "/v1/sessions/s1/files2"] {
            let req = atest::TestRequest::get().uri(uri).to_request();
            let resp = atest::call_service(&app, req).await;
            assert_eq!(resp.status().as_u16(), 404, "{uri}");
        }
    }

    /// The `ErrorCode` enum of the document has every code the manager gives.
    #[test]
    fn error_codes_are_all_in_the_schema() {
        let doc = doc();
        let codes: BTreeSet<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .expect("ErrorCode enum")
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let s = || String::from("x");
        let all = [
            ManagerError::InvalidRequest(s()),
            ManagerError::Unauthorized(s()),
            ManagerError::Forbidden(s()),
            ManagerError::VfolderNotFound(s()),
            ManagerError::VfolderExists(s()),
            ManagerError::VfolderInUse(s()),
            ManagerError::AccessKeyInUse(s()),
            ManagerError::ImageNotFound(s()),
            ManagerError::SlotsExceedCapacity(s()),
            ManagerError::UnknownSlot(s()),
            ManagerError::SessionNotFound(s()),
            ManagerError::KernelNotFound(s()),
            ManagerError::AccessKeyNotFound(s()),
            ManagerError::NoCapacity(s()),
            ManagerError::RunNotFound(s()),
            ManagerError::LogsNotFound(s()),
            ManagerError::RunHasNoStdin(s()),
            ManagerError::ServiceNotFound(s()),
            ManagerError::ServiceFailed {
                message: s(),
                output: s(),
            },
            ManagerError::InvalidPath(s()),
            ManagerError::FileNotFound(s()),
            ManagerError::LengthRequired(s()),
            ManagerError::UploadTooLarge(s()),
            ManagerError::SessionNotRunning(s(), s()),
            ManagerError::ConcurrencyLimit(s()),
            ManagerError::AgentUnavailable(s()),
            ManagerError::AgentError(s()),
            ManagerError::RegistryUnreachable(s()),
            ManagerError::RegistryAuthFailed(s()),
            ManagerError::ClusterNetworkFailed(s()),
            ManagerError::ImagePullTimeout(s()),
            ManagerError::StartingUp(std::time::Duration::from_secs(1)),
            ManagerError::NoAgents,
            ManagerError::StoreUnavailable(s()),
            ManagerError::AgentNotFound(s()),
            ManagerError::CommitNotFound(s()),
            ManagerError::CommitInProgress(s()),
            ManagerError::Internal(s()),
        ];
        for e in &all {
            assert!(codes.contains(e.code()), "{} missing", e.code());
        }
        for routing in ["not-found", "method-not-allowed"] {
            assert!(codes.contains(routing), "{routing} missing");
        }
        // Variants may share a code (a selector naming no kernel is `session-not-found`).
        let given: BTreeSet<&str> = all.iter().map(ManagerError::code).collect();
        assert_eq!(
            codes.len(),
            given.len() + 2,
            "no code the manager never gives"
        );
    }

    #[test]
    fn session_request_schema_is_strict() {
        let doc = doc();
        let s = &doc["components"]["schemas"]["SessionRequest"];
        assert_eq!(s["additionalProperties"], false, "{s}");
        let required: BTreeSet<&str> = s["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(required, BTreeSet::from(["image", "resource_slots"]));
        // Any slot name; amounts non-negative numbers or strings.
        let extra = &s["properties"]["resource_slots"]["additionalProperties"];
        assert_eq!(extra["minimum"], 0, "{extra}");
        let agent = &doc["components"]["schemas"]["Agent"]["properties"];
        assert!(
            agent["slots_total"]["additionalProperties"]["pattern"].is_string(),
            "{agent}"
        );
        assert!(agent["slot_types"]["additionalProperties"]["enum"].is_array());
    }
}
