//! `GET /v1/events`: the manager's event stream as server-sent events (the hub,
//! `manager::event_hub`). A user key sees its own sessions' events only, an admin every event;
//! filters narrow that. Without `follow` the answer is the recent events the manager keeps, and
//! it ends; with `follow=true` they come first and the stream goes on, a keep-alive comment
//! every [`KEEP_ALIVE`] so that proxies do not cut an idle stream.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::auth::Caller;
use super::{owned_kernel, ApiState, Res, MIN_ID_PREFIX};
use crate::manager::error::ManagerError;
use crate::manager::event_hub::{EventHub, Filter, Subscription};
use crate::model::error::ErrorBody;
use crate::model::event::{Event, EventType};

/// How often a followed stream with nothing to say sends a comment line (`: keep-alive`):
/// below the 30–60 s idle timeouts common proxies have.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Longest `agent_id` filter: agent ids are names an operator gives (`[agent] id`).
const MAX_AGENT_ID: usize = 256;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    session_id: Option<String>,
    agent_id: Option<String>,
    #[serde(rename = "type")]
    types: Option<String>,
    #[serde(default)]
    follow: bool,
    history: Option<bool>,
}

/// The events the caller may see, as server-sent events (`id:`, `event:` the type, `data:` the
/// [`Event`] as one line of JSON): the recent ones the manager keeps (`[events] history`),
/// then with `follow=true` every new one as it happens. A follower that leaves `[events]
/// queue` events unread gets a last `dropped` event and the stream ends.
///
/// The `Last-Event-ID` header (what an EventSource sends when it reconnects) resumes after that
/// event id: only kept events newer than it (400 when it is not a decimal id).
// `Last-Event-ID` is described above rather than listed as a header parameter: a fuzzer's
// header values that HTTP itself refuses would be answered by actix's parser (400, no JSON
// body), not by this API.
#[utoipa::path(
    operation_id = "stream_events",
    tag = "events",
    params(
        ("session_id" = Option<String>, Query, description = "Only this session's events: its session or kernel id, or a unique prefix (at least 4 hex digits) of the id of one of the caller's sessions"),
        ("agent_id" = Option<String>, Query, description = "Only events about this agent's sessions, or its liveness"),
        ("type" = Option<String>, Query, description = "Only these types, comma-separated: `session_status`, `pull_progress`, `agent_status` (admin keys only), `reclaim_warning`, `preemption`; `dropped` ends any stream whose reader falls behind"),
        ("follow" = Option<bool>, Query, description = "Keep the stream open and send new events as they happen (default: answer the recent ones and end)"),
        ("history" = Option<bool>, Query, description = "Send the recent events the manager keeps first (default true; `false` with `follow`: only what happens from now)"),
    ),
    responses(
        (status = 200, description = "Server-sent events: frames of `id: <id>`, `event: <type>`, `data: <Event as JSON>`, and `: keep-alive` comments", body = String, content_type = "text/event-stream"),
        (status = 400, description = "`invalid-request`: an unknown type, a session_id that is neither a UUID nor the start of one, a prefix naming several sessions, an empty or overlong agent_id, a `Last-Event-ID` header that is no event id, an unknown or ill-typed query parameter", body = ErrorBody),
        (status = 403, description = "`forbidden`: a user key asking for `agent_status`", body = ErrorBody),
        (status = 404, description = "`session-not-found`: a session_id prefix that starts none of the caller's sessions' ids", body = ErrorBody),
    ),
)]
#[get("/v1/events")]
pub(super) async fn stream(
    s: web::Data<ApiState>,
    caller: Caller,
    q: web::Query<EventsQuery>,
    req: HttpRequest,
) -> Res {
    let mut q = q.into_inner();
    if let Some(id) = q.session_id.as_deref().map(str::trim) {
        // A session id prefix, as the session routes take one: the session it names.
        if uuid::Uuid::parse_str(id).is_err() && is_id_prefix(id) {
            q.session_id = Some(owned_kernel(&s, &caller, id).await?.session_id);
        }
    }
    answer(&s.events, &caller, q, last_event_id(&req)?)
}

/// Whether `id` may be the start of a session id: at least [`MIN_ID_PREFIX`] of a UUID's
/// characters (hex digits and dashes).
fn is_id_prefix(id: &str) -> bool {
    id.len() >= MIN_ID_PREFIX && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The answer to `q` from `hub` for `caller`, resuming after `after` when given.
///
/// Errors: as [`filter`].
fn answer(hub: &EventHub, caller: &Caller, q: EventsQuery, after: Option<u64>) -> Res {
    let filter = filter(caller, &q)?;
    let history = q.history.unwrap_or(true) || after.is_some();
    let mut resp = HttpResponse::Ok();
    resp.content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        // nginx buffers a proxied answer unless told not to.
        .insert_header(("X-Accel-Buffering", "no"));
    if !q.follow {
        let recent = if history {
            hub.recent(&filter, after)
        } else {
            Vec::new()
        };
        let body: String = recent.iter().map(|e| frame(e)).collect();
        return Ok(resp.body(body));
    }
    // Subscribed before the answer starts: what happens once the caller has the headers is on
    // its stream.
    let sub = hub.subscribe(filter, history, after);
    Ok(resp.streaming(follow(sub, KEEP_ALIVE)))
}

/// The reader's filter: its key's view narrowed by the query.
///
/// Errors: 400 `invalid-request` naming the bad value; 403 `forbidden` for a user key asking
/// for `agent_status`.
fn filter(caller: &Caller, q: &EventsQuery) -> Result<Filter, ManagerError> {
    let session_id = q.session_id.as_deref().map(str::trim).map(|id| {
        // As the store writes ids (lower-case, hyphenated), whatever form the caller used.
        uuid::Uuid::parse_str(id)
            .map(|u| u.hyphenated().to_string())
            .map_err(|_| {
                ManagerError::InvalidRequest(format!(
                    "session_id `{id}` is not a session or kernel id (a UUID) nor the start \
                     of one (at least {MIN_ID_PREFIX} hex digits)"
                ))
            })
    });
    let agent_id = match q.agent_id.as_deref().map(str::trim) {
        Some("") => {
            return Err(ManagerError::InvalidRequest(
                "agent_id is empty: give an agent id, or leave the parameter out".into(),
            ))
        }
        Some(a) if a.len() > MAX_AGENT_ID || a.chars().any(char::is_control) => {
            return Err(ManagerError::InvalidRequest(format!(
                "agent_id is not an agent id (at most {MAX_AGENT_ID} bytes, no control characters)"
            )))
        }
        other => other.map(str::to_owned),
    };
    let mut types = Vec::new();
    for word in q.types.iter().flat_map(|t| t.split(',')).map(str::trim) {
        // `dropped` is taken and changes nothing: a stream ends with it whatever the filter.
        let t = EventType::parse(word).ok_or_else(|| {
            ManagerError::InvalidRequest(format!(
                "type `{word}` is not an event type: expected session_status, \
                     pull_progress, agent_status, reclaim_warning or preemption (comma-separated for several)"
            ))
        })?;
        if t == EventType::AgentStatus && !caller.admin {
            return Err(ManagerError::Forbidden(format!(
                "agent_status events are for admin keys; access key `{}` is not one",
                caller.access_key
            )));
        }
        if !types.contains(&t) {
            types.push(t);
        }
    }
    if !types.is_empty() {
        // A stream that ends because its reader was too slow says so, whatever the filter.
        types.push(EventType::Dropped);
    }
    Ok(Filter {
        owner: (!caller.admin).then(|| caller.access_key.clone()),
        session_id: session_id.transpose()?,
        agent_id,
        types,
    })
}

/// The `Last-Event-ID` header's event id, if any.
///
/// Errors: 400 `invalid-request` when it is not an event id.
fn last_event_id(req: &HttpRequest) -> Result<Option<u64>, ManagerError> {
    let Some(v) = req.headers().get("Last-Event-ID") else {
        return Ok(None);
    };
    let digits = v
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()));
    // An id past every id there can be resumes after all of them: nothing is missed.
    digits
        .map(|t| Some(t.parse().unwrap_or(u64::MAX)))
        .ok_or_else(|| {
            ManagerError::InvalidRequest(
                "Last-Event-ID is not an event id (the decimal `id:` of an event)".into(),
            )
        })
}

/// One event as a server-sent event frame. The JSON is one line (serde escapes newlines in
/// strings), as a `data:` field needs.
fn frame(e: &Event) -> String {
    let kind = e.kind.map_or("message", EventType::as_str);
    let data = serde_json::to_string(e).unwrap_or_else(|_| "{}".into());
    format!("id: {}\nevent: {kind}\ndata: {data}\n\n", e.id)
}

/// A followed stream: a first comment (so a client sees the answer start at once), then each
/// event as its frame, a keep-alive comment after `keep_alive` of silence, and the end after
/// a `dropped` event. Only what the subscription holds is buffered: a reader that does not read
/// stops actix polling this stream (its write buffer is bounded), the subscription's queue fills
/// and the hub drops it.
fn follow(
    sub: Subscription,
    keep_alive: Duration,
) -> impl futures::Stream<Item = Result<Bytes, actix_web::Error>> + 'static {
    let opening = Bytes::from_static(b": kernelvisor events\n\n");
    futures::stream::unfold(
        (Some(sub), Some(opening)),
        move |(sub, opening)| async move {
            if let Some(first) = opening {
                return Some((Ok(first), (sub, None)));
            }
            let mut sub = sub?;
            let next: Option<Option<Arc<Event>>> =
                tokio::time::timeout(keep_alive, sub.next()).await.ok();
            match next {
                None => Some((
                    Ok(Bytes::from_static(b": keep-alive\n\n")),
                    (Some(sub), None),
                )),
                Some(None) => None,
                Some(Some(e)) => Some((Ok(Bytes::from(frame(&e))), (Some(sub), None))),
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &str) -> EventsQuery {
        web::Query::<EventsQuery>::from_query(pairs)
            .unwrap()
            .into_inner()
    }

    fn user() -> Caller {
        Caller {
            access_key: "AKUSER".into(),
            admin: false,
        }
    }

    fn admin() -> Caller {
        Caller {
            access_key: "AKADMIN".into(),
            admin: true,
        }
    }

    #[test]
    fn a_user_key_sees_its_own_sessions_only() {
        let f = filter(&user(), &query("")).unwrap();
        assert_eq!(f.owner.as_deref(), Some("AKUSER"));
        assert_eq!(filter(&admin(), &query("")).unwrap().owner, None);
    }

    #[test]
    fn filters_parse_and_bad_values_are_named() {
        let sid = "0b0a8a3e-7a55-4a0c-9d5e-2f3b6a4c1d00";
        let f = filter(
            &admin(),
            &query(&format!(
                "session_id={sid}&agent_id=a1&type=session_status,agent_status"
            )),
        )
        .unwrap();
        assert_eq!(f.session_id.as_deref(), Some(sid));
        let upper = sid.to_uppercase();
        let by_upper = filter(&admin(), &query(&format!("session_id={upper}"))).unwrap();
        assert_eq!(by_upper.session_id.as_deref(), Some(sid), "the stored form");
        assert_eq!(f.agent_id.as_deref(), Some("a1"));
        assert_eq!(
            f.types,
            [
                EventType::SessionStatus,
                EventType::AgentStatus,
                EventType::Dropped
            ]
        );
        let err = |c: &Caller, q: &str| filter(c, &query(q)).unwrap_err();
        let e = err(&admin(), "type=session");
        assert_eq!(e.code(), "invalid-request");
        assert!(
            e.to_string()
                .contains("type `session` is not an event type"),
            "{e}"
        );
        let e = err(&admin(), "session_id=abc");
        assert!(e.to_string().contains("session_id `abc` is not"), "{e}");
        assert_eq!(err(&admin(), "agent_id=").code(), "invalid-request");
        assert_eq!(err(&user(), "type=agent_status").code(), "forbidden");
    }

    /// Serves [`answer`] for an admin from `hub` over real HTTP on a port of its own (its own
    /// actix system on a thread, as the manager's API runs).
    fn serve(hub: EventHub) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                actix_web::HttpServer::new(move || {
                    let hub = hub.clone();
                    actix_web::App::new().route(
                        "/v1/events",
                        web::get().to(move |q: web::Query<EventsQuery>| {
                            let hub = hub.clone();
                            async move { answer(&hub, &admin(), q.into_inner(), None) }
                        }),
                    )
                })
                .workers(1)
                .listen(listener)
                .unwrap()
                .run()
                .await
            })
        });
        addr
    }

    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// A follower that reads nothing while far more events are published than the connection
    /// can hold: the hub drops it (its queue drains, then `dropped` ends the stream), and the
    /// process's memory does not grow with what it missed.
    #[test]
    fn a_reader_that_stops_reading_is_dropped_over_http_in_bounded_memory() {
        use std::io::Read;
        let hub = EventHub::new(
            crate::manager::event_hub::HubSpec {
                history: 10,
                queue: 8,
            },
            None,
        );
        let addr = serve(hub.clone());
        let url = format!("http://{addr}/v1/events?follow=true");
        let resp = ureq::get(&url).call().unwrap();
        assert_eq!(resp.content_type(), "text/event-stream");
        let mut body = resp.into_reader();
        let mut opening = [0u8; 22];
        body.read_exact(&mut opening).unwrap();
        assert_eq!(&opening, b": kernelvisor events\n\n");
        assert_eq!(hub.subscribers(), 1);
        // A million events of ~400 bytes (with their frames): 400 MB had they been kept, far
        // past the socket buffers (a few MB) too. The margin below is for the other tests
        // this process runs meanwhile (a panic's backtrace alone takes tens of MB).
        let reason = "x".repeat(200);
        let before = rss_kib();
        let published = 1_000_000;
        for i in 0..published {
            let mut e = Event::of(EventType::SessionStatus);
            e.session_id = Some(format!("s{i}"));
            e.reason = Some(reason.clone());
            hub.publish(e);
        }
        let grown_mib = rss_kib().saturating_sub(before) / 1024;
        assert_eq!(hub.subscribers(), 0, "the stalled reader was dropped");
        assert!(
            grown_mib < 128,
            "memory grew {grown_mib} MiB while a reader stalled"
        );
        // Reading now: what the connection held, then the end of the stream.
        let mut text = String::new();
        body.read_to_string(&mut text).unwrap();
        let got = text.matches("event: session_status\n").count();
        assert!(
            got > 0 && got < published / 2,
            "{got} of {published} events came"
        );
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        assert!(last.contains("event: dropped\n"), "{last}");
        assert!(last.contains("reader-too-slow"), "{last}");
    }

    #[test]
    fn last_event_ids_are_decimal_and_saturate() {
        let id = |v: &str| {
            let req = actix_web::test::TestRequest::default()
                .insert_header(("Last-Event-ID", v))
                .to_http_request();
            last_event_id(&req)
        };
        assert_eq!(id(" 42 ").unwrap(), Some(42));
        assert_eq!(id("99999999999999999999999").unwrap(), Some(u64::MAX));
        assert_eq!(id("-1").unwrap_err().code(), "invalid-request");
        assert_eq!(id("").unwrap_err().code(), "invalid-request");
        let none = actix_web::test::TestRequest::default().to_http_request();
        assert_eq!(last_event_id(&none).unwrap(), None);
    }

    #[actix_rt::test]
    async fn a_quiet_stream_keeps_alive_and_events_follow() {
        use futures::StreamExt;
        let hub = EventHub::new(Default::default(), None);
        let sub = hub.subscribe(Filter::default(), true, None);
        let mut frames = Box::pin(follow(sub, Duration::from_millis(50)));
        let mut texts = Vec::new();
        for publish in [false, false, true, false] {
            if publish {
                hub.publish(Event::of(EventType::SessionStatus));
            }
            let item = frames.next().await.unwrap().unwrap();
            texts.push(String::from_utf8(item.to_vec()).unwrap());
        }
        assert_eq!(texts[0], ": kernelvisor events\n\n");
        assert_eq!(texts[1], ": keep-alive\n\n");
        assert!(texts[2].contains("event: session_status\n"), "{}", texts[2]);
        assert_eq!(texts[3], ": keep-alive\n\n");
    }

    #[test]
    fn a_frame_is_one_sse_event() {
        let mut e = Event::of(EventType::SessionStatus);
        e.id = 42;
        e.reason = Some("two\nlines".into());
        let f = frame(&e);
        assert!(
            f.starts_with("id: 42\nevent: session_status\ndata: {"),
            "{f}"
        );
        assert!(f.ends_with("}\n\n"));
        assert_eq!(f.matches('\n').count(), 4, "the data is one line: {f}");
    }
}
