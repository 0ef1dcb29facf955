//! The web console (issue 42): a page, one JavaScript module and a style sheet under `/ui/`
//! (and the vendored xterm.js for its terminal, `vendor/`),
//! compiled into the binary (`include_str!`), served by the API server without a token. The
//! page holds no data of its own: it asks for an access key's secret, keeps it in the tab's
//! `sessionStorage`, and calls the same API as every client with `Authorization: Bearer …`, so
//! there is no second permission model and no cookie a forged form could ride (CSRF).
//!
//! Every answer under `/ui/` (and the root's redirect to it) carries [`SECURITY_HEADERS`]: a
//! Content-Security-Policy that allows this origin's script, style and connections only (no
//! inline script, no third-party origin), `nosniff`, `no-referrer` and no framing. The script
//! writes what the API answers with `textContent`, never as HTML, so a log line `<script>` is
//! shown as text. Contract: `docs/manager-api.md`, "Web console".

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};

/// Where the console is served (the root `/` redirects here).
pub const PREFIX: &str = "/ui/";

/// The Content-Security-Policy of every console answer: this origin's script, style, images
/// and connections (`fetch` of the API, WebSockets) only; no inline script (`script-src` is
/// `'self'` alone), no `eval`, no plug-ins, no `<base>`, no framing, forms posting nowhere else.
/// Inline STYLE is allowed (`style-src 'unsafe-inline'`): xterm.js's DOM renderer writes its own
/// `<style>` elements (cell sizes, colours); styles run no code, and the issue forbids inline
/// script and other origins, not inline styles.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// The headers every console answer carries, beside its `Content-Type`.
pub const SECURITY_HEADERS: [(&str, &str); 5] = [
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    // The assets change with the binary: a browser asks again rather than keep an old script
    // next to a new manager.
    ("Cache-Control", "no-cache"),
];

/// One asset compiled into the binary: its name under [`PREFIX`], content type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// The console's files. `index.html` is also the answer to `/ui/` (the pages are hash routes,
/// `#/sessions`, `#/agents`, …, so the server has one page to serve). The script is ES modules
/// (`console.js` imports the rest), one concept each: `lib/` (the API, the event stream, the
/// DOM helpers), `pages/` (one per route), `widgets/` (parts of a page). `boot.js`, the page's
/// one script tag, loads `console.js` and loads the page again when its module graph failed to
/// load (a file cut off by a network change).
const ASSETS: [Asset; 22] = [
    page(
        "index.html",
        "text/html; charset=utf-8",
        include_str!("index.html"),
    ),
    script("boot.js", include_str!("boot.js")),
    script("console.js", include_str!("console.js")),
    style("console.css", include_str!("console.css")),
    script("lib/api.js", include_str!("lib/api.js")),
    script("lib/dom.js", include_str!("lib/dom.js")),
    script("lib/events.js", include_str!("lib/events.js")),
    script("lib/rows.js", include_str!("lib/rows.js")),
    script("pages/agents.js", include_str!("pages/agents.js")),
    script("pages/create.js", include_str!("pages/create.js")),
    script("pages/events.js", include_str!("pages/events.js")),
    script("pages/keys.js", include_str!("pages/keys.js")),
    script("pages/queue.js", include_str!("pages/queue.js")),
    script("pages/session.js", include_str!("pages/session.js")),
    script("pages/sessions.js", include_str!("pages/sessions.js")),
    script("widgets/files.js", include_str!("widgets/files.js")),
    script("widgets/run.js", include_str!("widgets/run.js")),
    script("widgets/services.js", include_str!("widgets/services.js")),
    script("widgets/terminal.js", include_str!("widgets/terminal.js")),
    script("widgets/timeline.js", include_str!("widgets/timeline.js")),
    // xterm.js 3.8.1 from Debian's `node-xterm`, bundled as one ES module (`just
    // console-vendor`; vendor/README.md), for the terminal in the browser.
    script("vendor/xterm.js", include_str!("vendor/xterm.js")),
    style("vendor/xterm.css", include_str!("vendor/xterm.css")),
];

const fn page(name: &'static str, content_type: &'static str, body: &'static str) -> Asset {
    Asset {
        name,
        content_type,
        body,
    }
}

const fn script(name: &'static str, body: &'static str) -> Asset {
    page(name, "text/javascript; charset=utf-8", body)
}

const fn style(name: &'static str, body: &'static str) -> Asset {
    page(name, "text/css; charset=utf-8", body)
}

/// Whether a request is the console's, answered without a token: `GET` of `/`, `/ui` or a
/// path under [`PREFIX`]. The API's routes all start with `/v1/`, `/health` or
/// `/metrics`, so none of them is reached this way (and a handler reached without a caller
/// refuses anyway: `auth::Caller`).
pub fn is_console_request(method: &Method, path: &str) -> bool {
    method == Method::GET && (path == "/" || path == "/ui" || path.starts_with(PREFIX))
}

/// Registers the console's routes: `/` and `/ui` redirect to [`PREFIX`], which answers
/// `index.html`; `/ui/{name}` answers the asset of that name, 404 for any other path under it.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(to_console))
        .route("/ui", web::get().to(to_console))
        .route("/ui/", web::get().to(index))
        .route("/ui/{name:.*}", web::get().to(asset));
}

/// A console answer with [`SECURITY_HEADERS`].
fn secured(status: StatusCode) -> actix_web::HttpResponseBuilder {
    let mut resp = HttpResponse::build(status);
    for (name, value) in SECURITY_HEADERS {
        resp.insert_header((name, value));
    }
    resp
}

/// `/` and `/ui`: 302 to [`PREFIX`].
async fn to_console() -> HttpResponse {
    secured(StatusCode::FOUND)
        .insert_header((header::LOCATION, HeaderValue::from_static(PREFIX)))
        .finish()
}

/// `/ui/`: the page.
async fn index() -> HttpResponse {
    serve(&ASSETS[0])
}

/// `/ui/{name}`: the asset, or 404 `not-found` (as plain text: the console's own answer, not
/// the API's JSON).
async fn asset(req: HttpRequest) -> HttpResponse {
    let name = req.match_info().get("name").unwrap_or_default();
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => serve(a),
        None => secured(StatusCode::NOT_FOUND)
            .content_type("text/plain; charset=utf-8")
            .body("no such file in the console\n"),
    }
}

fn serve(a: &Asset) -> HttpResponse {
    secured(StatusCode::OK)
        .content_type(a.content_type)
        .body(a.body)
}

#[cfg(test)]
mod tests {
    use super::*;
    // Not `test`: that name would shadow the `#[test]` attribute.
    use actix_web::test as web_test;

    fn app_config(cfg: &mut web::ServiceConfig) {
        configure(cfg);
    }

    /// Every console answer, found or not, carries the security headers; the root redirects.
    #[actix_rt::test]
    async fn every_answer_carries_the_policy_and_the_root_redirects() {
        let app = web_test::init_service(actix_web::App::new().configure(app_config)).await;
        for (path, status) in [
            ("/", 302),
            ("/ui", 302),
            ("/ui/", 200),
            ("/ui/console.js", 200),
            ("/ui/console.css", 200),
            ("/ui/index.html", 200),
            ("/ui/vendor/xterm.js", 200),
            ("/ui/vendor/xterm.css", 200),
            ("/ui/vendor/LICENSE.xterm", 404),
            ("/ui/nothing.js", 404),
            ("/ui/a/b", 404),
        ] {
            let resp =
                web_test::call_service(&app, web_test::TestRequest::get().uri(path).to_request())
                    .await;
            assert_eq!(resp.status().as_u16(), status, "{path}");
            for (name, value) in SECURITY_HEADERS {
                assert_eq!(
                    resp.headers().get(name).and_then(|v| v.to_str().ok()),
                    Some(value),
                    "{path}: {name}"
                );
            }
            if status == 302 {
                assert_eq!(resp.headers().get("location").unwrap(), PREFIX);
            }
        }
    }

    /// The policy forbids inline script and other origins; the page loads its script from
    /// this origin as a module and has no inline script or handler.
    #[test]
    fn the_policy_and_the_page_have_no_inline_script() {
        assert!(CONTENT_SECURITY_POLICY.contains("script-src 'self';"));
        assert!(!CONTENT_SECURITY_POLICY.contains("script-src 'self' 'unsafe-inline'"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-eval"));
        assert!(!CONTENT_SECURITY_POLICY.contains("http"));
        let page = ASSETS[0].body;
        assert!(page.contains(r#"<script src="boot.js"></script>"#));
        assert_eq!(
            page.matches("<script").count(),
            1,
            "one script tag, no inline one"
        );
        let handler = page
            .split(|c: char| c.is_whitespace() || c == '<')
            .find(|w| w.starts_with("on") && w.contains('='));
        assert_eq!(handler, None, "no inline event handler attribute");
        for a in ASSETS.iter().filter(|a| {
            a.content_type.starts_with("text/javascript") && !a.name.starts_with("vendor/")
        }) {
            let js = a.body;
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
            ] {
                assert!(!js.contains(sink), "{} uses {sink}", a.name);
            }
        }
    }

    #[test]
    fn only_reads_of_the_console_paths_are_the_consoles() {
        assert!(is_console_request(&Method::GET, "/"));
        assert!(is_console_request(&Method::GET, "/ui/console.js"));
        assert!(is_console_request(&Method::GET, "/ui"));
        assert!(!is_console_request(&Method::HEAD, "/ui/"));
        assert!(!is_console_request(&Method::POST, "/ui/"));
        assert!(!is_console_request(&Method::GET, "/v1/sessions"));
        assert!(!is_console_request(&Method::GET, "/uix"));
    }
}
