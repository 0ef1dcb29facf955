//! The manager's routes as typed calls: one method per route ctl uses, its path written here
//! once, its request body a [`crate::model`] type and its answer an [`Answer`] of the route's
//! reply type. The transport (bases, failover, TLS, errors) is the parent module's.
//!
//! A body is sent as its JSON value, whose object keys serde_json keeps sorted: the bytes on
//! the wire are those of the `json!` bodies ctl built before these types (a field left `None`
//! is omitted where the type says `skip_serializing_if`).

use std::io::Read;
use std::marker::PhantomData;
use std::ops::Deref;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::{segment, segments, Client, ClientError, Reply, REQUEST_TIMEOUT};
use crate::ctl::websocket::{self, Socket};
use crate::model::access_key::{AccessKey, AccessKeyList, ChangeBody, NewAccessKey, NewKeyBody};
use crate::model::agent::{Agent, AgentList, DrainRequest};
use crate::model::exec::{ExecuteAnswer, ExecuteCall};
use crate::model::file::{FileList, Uploaded};
use crate::model::health::Health;
use crate::model::image::{Commit, CommitRequest, PurgeImagesRequest, PurgedImages};
use crate::model::service::{Service, ServiceList, ServiceStarted};
use crate::model::session::{NewSession, Session, SessionCreated, SessionList};
use crate::model::terminal::TerminalSize;
use crate::model::vfolder::{NewVfolder, Vfolder, VfolderList};

/// How long a commit's `POST` may take (the agent's commit starts within it).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// A 2xx answer of a route whose reply is the model's `T`: the [`Reply`] as received (it
/// derefs to it, and `ctl`'s printers take either: `-o json` prints its text unchanged, tables
/// render its JSON), read as `T` on demand.
#[derive(Debug, Clone)]
pub struct Answer<T> {
    reply: Reply,
    reply_type: PhantomData<fn() -> T>,
}

impl<T> Answer<T> {
    fn of(reply: Reply) -> Self {
        Answer {
            reply,
            reply_type: PhantomData,
        }
    }

    /// The answer as received.
    pub fn into_reply(self) -> Reply {
        self.reply
    }
}

impl<T> Deref for Answer<T> {
    type Target = Reply;

    fn deref(&self) -> &Reply {
        &self.reply
    }
}

impl<T> AsRef<Reply> for Answer<T> {
    fn as_ref(&self) -> &Reply {
        &self.reply
    }
}

impl<T: DeserializeOwned + Default> Answer<T> {
    /// The body as `T`, lenient as the model's reply types are (a missing key is its default,
    /// an unknown key ignored); an answer without a body is `T::default()`.
    ///
    /// Errors: the line to print instead of a table, naming what did not read.
    pub fn read(&self) -> Result<T, String> {
        read(&self.reply.json)
    }

    /// [`Answer::read`], or `T::default()` when the body does not read (the caller then acts on
    /// defaults: no exit code, an unknown status), for the answers ctl decides on rather than
    /// shows.
    pub fn lenient(&self) -> T {
        lenient(&self.reply.json)
    }
}

/// `v` (an answer's JSON) as the reply type `T` (`null`, an answer without a body: `T`'s
/// default).
///
/// Errors: the line to print instead of the table, naming what did not read.
pub fn read<T: DeserializeOwned + Default>(v: &Value) -> Result<T, String> {
    if v.is_null() {
        return Ok(T::default());
    }
    T::deserialize(v).map_err(|e| {
        format!(
            "cannot read the manager's answer as {}: {e} (see it with -o json)\n",
            std::any::type_name::<T>()
                .rsplit("::")
                .next()
                .unwrap_or("its type")
        )
    })
}

/// `v` read as the model's `T`, or `T::default()` when it does not read (the caller then acts
/// on defaults), for the answers ctl decides on rather than shows.
pub fn lenient<T: DeserializeOwned + Default>(v: &Value) -> T {
    read(v).unwrap_or_default()
}

/// A request body as the JSON value sent (object keys sorted, as the `json!` bodies were).
fn body<T: Serialize>(body: &T) -> Value {
    // The model's request types are plain data: no map with non-string keys, no custom
    // serializer that fails.
    serde_json::to_value(body).expect("a request body serializes")
}

/// The body of routes that take no fields: `{}`.
fn empty() -> Value {
    Value::Object(serde_json::Map::new())
}

fn session_path(id: &str) -> String {
    format!("/v1/sessions/{}", segment(id))
}

/// `path` with `?kernel=KERNEL` (or `&kernel=` after a query) when a kernel is selected: a
/// cluster session's kernel by host name (`sub1`) or kernel id; `None` leaves the manager's
/// default, the main kernel.
pub fn with_kernel(path: String, kernel: Option<&str>) -> String {
    match kernel {
        None => path,
        Some(k) => {
            let sep = if path.contains('?') { '&' } else { '?' };
            format!("{path}{sep}kernel={}", segment(k))
        }
    }
}

/// The event stream's route (also the URL its errors name).
pub const EVENTS_PATH: &str = "/v1/events";

/// The logs route of session `id` (of its kernel `kernel`; also the URL its read errors
/// name).
pub fn logs_path(id: &str, kernel: Option<&str>) -> String {
    with_kernel(format!("{}/logs", session_path(id)), kernel)
}

/// The execute route of session `id` (also the URL its errors name).
pub fn execute_path(id: &str) -> String {
    format!("{}/execute", session_path(id))
}

/// The route of file `path` (relative to `/home/work`) of session `id` (of its kernel
/// `kernel`), each segment percent-encoded (also the URL a download's read errors name).
pub fn file_path(id: &str, kernel: Option<&str>, path: &str) -> String {
    with_kernel(
        format!("{}/files/{}", session_path(id), segments(path)),
        kernel,
    )
}

fn pty_path(id: &str, kernel: Option<&str>, size: TerminalSize, command: Option<&str>) -> String {
    let mut path = format!(
        "{}/pty?rows={}&cols={}",
        session_path(id),
        size.rows,
        size.cols
    );
    if let Some(c) = command {
        path.push_str(&format!("&command={}", segment(c)));
    }
    with_kernel(path, kernel)
}

fn service_path(id: &str, name: &str) -> String {
    format!("/v1/sessions/{}/services/{}", segment(id), segment(name))
}

fn agent_path(id: &str, action: &str) -> String {
    format!("/v1/agents/{}/{action}", segment(id))
}

fn key_path(key: &str) -> String {
    format!("/v1/access-keys/{}", segment(key))
}

impl Client {
    /// `GET /health`.
    pub fn health(&self) -> Result<Answer<Health>, ClientError> {
        self.get("/health", &[]).map(Answer::of)
    }

    /// `GET /v1/sessions`: the caller's live sessions; `all`: also `TERMINATED` ones;
    /// `access_key`: that key's (another's: admin only).
    pub fn sessions(
        &self,
        all: bool,
        access_key: Option<&str>,
    ) -> Result<Answer<SessionList>, ClientError> {
        let mut query = Vec::new();
        if all {
            query.push(("all", "true"));
        }
        if let Some(key) = access_key {
            query.push(("access_key", key));
        }
        self.get("/v1/sessions", &query).map(Answer::of)
    }

    /// `POST /v1/sessions`: the session, created (or queued); may wait for the agent to start
    /// it, with no limit beyond the manager's.
    pub fn create_session(
        &self,
        request: &NewSession,
    ) -> Result<Answer<SessionCreated>, ClientError> {
        self.post("/v1/sessions", &body(request), None)
            .map(Answer::of)
    }

    /// `GET /v1/sessions/{id}` (a session or kernel id, or a unique prefix).
    pub fn session(&self, id: &str) -> Result<Answer<Session>, ClientError> {
        self.get(&session_path(id), &[]).map(Answer::of)
    }

    /// `DELETE /v1/sessions/{id}`: the session, terminated.
    pub fn destroy_session(&self, id: &str) -> Result<Answer<Session>, ClientError> {
        self.destroy_session_with(id, None)
    }

    /// `DELETE /v1/sessions/{id}?grace=SECS`: as [`Client::destroy_session`], the workload
    /// given `grace` seconds after its stop signal instead of the session's own
    /// (`None`: its own; 0: killed at once). The session answers `TERMINATING` (202) when its
    /// end takes longer than the manager waits.
    pub fn destroy_session_with(
        &self,
        id: &str,
        grace: Option<f64>,
    ) -> Result<Answer<Session>, ClientError> {
        let grace = grace.map(|g| g.to_string());
        let query: Vec<(&str, &str)> = grace.iter().map(|g| ("grace", g.as_str())).collect();
        self.delete_query(&session_path(id), &query).map(Answer::of)
    }

    /// `POST /v1/sessions/{id}/execute`: one call of the continuation protocol, in the
    /// session's kernel `kernel` (the body's `kernel`; `None`: the main kernel); its answer
    /// waits at most `timeout` (the call's `flush_timeout` and a grace).
    pub fn execute(
        &self,
        id: &str,
        kernel: Option<&str>,
        call: &ExecuteCall,
        timeout: Duration,
    ) -> Result<Answer<ExecuteAnswer>, ClientError> {
        let mut body = body(call);
        if let (Some(k), Value::Object(fields)) = (kernel, &mut body) {
            fields.insert("kernel".to_owned(), Value::from(k));
        }
        self.post(&execute_path(id), &body, Some(timeout))
            .map(Answer::of)
    }

    /// `POST /v1/sessions/{id}/interrupt[?kernel=]` (no body; 204): interrupts what the
    /// session's kernel runs (a kernel runner's current run: `KeyboardInterrupt`).
    pub fn interrupt(&self, id: &str, kernel: Option<&str>) -> Result<(), ClientError> {
        self.post_empty(
            &with_kernel(format!("{}/interrupt", session_path(id)), kernel),
            Some(REQUEST_TIMEOUT),
        )
        .map(drop)
    }

    /// `GET /v1/sessions/{id}/logs[?kernel=]`: the kernel's logs as a reader, unread (any
    /// size); with `follow`, also what the kernel writes until it ends, the call then unbounded
    /// (else at most [`REQUEST_TIMEOUT`]). Map read errors with [`super::read_error`].
    pub fn logs(
        &self,
        id: &str,
        kernel: Option<&str>,
        follow: bool,
    ) -> Result<impl Read + Send, ClientError> {
        let (query, timeout): (&[(&str, &str)], _) = if follow {
            (&[("follow", "true")], None)
        } else {
            (&[], Some(REQUEST_TIMEOUT))
        };
        self.get_stream(&logs_path(id, kernel), query, timeout)
    }

    /// `GET /v1/events?query`: the event stream as a reader, its frames unread. With
    /// `follow=true` in `query` it may stream for hours (the call is unbounded); without, the
    /// call is bounded by [`REQUEST_TIMEOUT`].
    pub fn events(&self, query: &[(&str, &str)]) -> Result<impl Read + Send, ClientError> {
        let following = query.contains(&("follow", "true"));
        self.get_stream(EVENTS_PATH, query, (!following).then_some(REQUEST_TIMEOUT))
    }

    /// `POST /v1/sessions/{id}/commit`: the commit started (at most [`COMMIT_TIMEOUT`]).
    pub fn commit(&self, id: &str, request: &CommitRequest) -> Result<Answer<Commit>, ClientError> {
        let path = format!("{}/commit", session_path(id));
        self.post(&path, &body(request), Some(COMMIT_TIMEOUT))
            .map(Answer::of)
    }

    /// `GET /v1/sessions/{id}/commit`: where the session's last commit is.
    pub fn commit_state(&self, id: &str) -> Result<Answer<Commit>, ClientError> {
        self.get(&format!("{}/commit", session_path(id)), &[])
            .map(Answer::of)
    }

    /// `GET /v1/sessions/{id}/services`.
    pub fn services(&self, id: &str) -> Result<Answer<ServiceList>, ClientError> {
        self.get(&format!("{}/services", session_path(id)), &[])
            .map(Answer::of)
    }

    /// `POST /v1/sessions/{id}/services/{name}` (no body): may wait for the service to come
    /// up, with no limit beyond the manager's.
    pub fn start_service(
        &self,
        id: &str,
        name: &str,
    ) -> Result<Answer<ServiceStarted>, ClientError> {
        self.post_empty(&service_path(id, name), None)
            .map(Answer::of)
    }

    /// `DELETE /v1/sessions/{id}/services/{name}`: the service, stopped.
    pub fn stop_service(&self, id: &str, name: &str) -> Result<Answer<Service>, ClientError> {
        self.delete(&service_path(id, name)).map(Answer::of)
    }

    /// `GET /v1/sessions/{id}/files?dir=…[&kernel=]`: the entries of `dir` (relative to
    /// `/home/work`) in the session's kernel `kernel` (`None`: the main kernel).
    pub fn files(
        &self,
        id: &str,
        kernel: Option<&str>,
        dir: &str,
    ) -> Result<Answer<FileList>, ClientError> {
        let mut query = vec![("dir", dir)];
        if let Some(k) = kernel {
            query.push(("kernel", k));
        }
        self.get(&format!("{}/files", session_path(id)), &query)
            .map(Answer::of)
    }

    /// `PUT /v1/sessions/{id}/files/{path}[?kernel=]`: `body` as the file, streamed as it is read
    /// (never held whole) with `Content-Length: length`; at most `length` bytes are sent. The
    /// call has no overall limit (each read and write of the connection has its idle limit).
    pub fn upload_file(
        &self,
        id: &str,
        kernel: Option<&str>,
        path: &str,
        body: impl Read,
        length: u64,
    ) -> Result<Answer<Uploaded>, ClientError> {
        self.put_file(&file_path(id, kernel, path), body, length)
            .map(Answer::of)
    }

    /// `GET /v1/sessions/{id}/files/{path}[?kernel=]`: the file's bytes as a reader, unread (any size; a
    /// body that ends before its `Content-Length` fails the read). Map read errors with
    /// [`super::read_error`] and the URL of [`file_path`].
    pub fn download_file(
        &self,
        id: &str,
        kernel: Option<&str>,
        path: &str,
    ) -> Result<impl Read + Send, ClientError> {
        self.get_file(&file_path(id, kernel, path))
    }

    /// `GET /v1/sessions/{id}/pty?rows&cols[&command][&kernel]` upgraded to a WebSocket: a terminal of
    /// `size` running `command` (else the image's shell).
    ///
    /// Errors: [`ClientError::Api`] when the upgrade is answered with an error (404
    /// `session-not-found`, 409 `session-not-running`, …); [`ClientError::Transport`] when the
    /// API cannot be reached or TLS fails.
    pub fn terminal(
        &self,
        id: &str,
        kernel: Option<&str>,
        size: TerminalSize,
        command: Option<&str>,
    ) -> Result<Socket, ClientError> {
        websocket::connect(self, &pty_path(id, kernel, size, command))
    }

    /// `GET /v1/agents`.
    pub fn agents(&self) -> Result<Answer<AgentList>, ClientError> {
        self.get("/v1/agents", &[]).map(Answer::of)
    }

    /// `POST /v1/agents/{id}/cordon` (body `{}`): the agent.
    pub fn cordon(&self, id: &str) -> Result<Answer<Agent>, ClientError> {
        self.post(&agent_path(id, "cordon"), &empty(), None)
            .map(Answer::of)
    }

    /// `POST /v1/agents/{id}/uncordon` (body `{}`): the agent.
    pub fn uncordon(&self, id: &str) -> Result<Answer<Agent>, ClientError> {
        self.post(&agent_path(id, "uncordon"), &empty(), None)
            .map(Answer::of)
    }

    /// `POST /v1/agents/{id}/drain`: the agent.
    pub fn drain(&self, id: &str, request: &DrainRequest) -> Result<Answer<Agent>, ClientError> {
        self.post(&agent_path(id, "drain"), &body(request), None)
            .map(Answer::of)
    }

    /// `POST /v1/agents/{id}/images/purge`: each image's outcome.
    pub fn purge_images(
        &self,
        id: &str,
        request: &PurgeImagesRequest,
    ) -> Result<Answer<PurgedImages>, ClientError> {
        self.post(&agent_path(id, "images/purge"), &body(request), None)
            .map(Answer::of)
    }

    /// `POST /v1/access-keys`: the new key with its secret (shown this once).
    pub fn create_access_key(
        &self,
        request: &NewKeyBody,
    ) -> Result<Answer<NewAccessKey>, ClientError> {
        self.post("/v1/access-keys", &body(request), Some(REQUEST_TIMEOUT))
            .map(Answer::of)
    }

    /// `GET /v1/access-keys`.
    pub fn access_keys(&self) -> Result<Answer<AccessKeyList>, ClientError> {
        self.get("/v1/access-keys", &[]).map(Answer::of)
    }

    /// `GET /v1/access-keys/{key}`.
    pub fn access_key(&self, key: &str) -> Result<Answer<AccessKey>, ClientError> {
        self.get(&key_path(key), &[]).map(Answer::of)
    }

    /// `PATCH /v1/access-keys/{key}`: the key, changed.
    pub fn change_access_key(
        &self,
        key: &str,
        change: &ChangeBody,
    ) -> Result<Answer<AccessKey>, ClientError> {
        self.patch(&key_path(key), &body(change)).map(Answer::of)
    }

    /// `DELETE /v1/access-keys/{key}`: the key, deleted.
    pub fn delete_access_key(&self, key: &str) -> Result<Answer<AccessKey>, ClientError> {
        self.delete(&key_path(key)).map(Answer::of)
    }

    /// `POST /v1/vfolders`: the vfolder, created.
    pub fn create_vfolder(&self, request: &NewVfolder) -> Result<Answer<Vfolder>, ClientError> {
        self.post("/v1/vfolders", &body(request), Some(REQUEST_TIMEOUT))
            .map(Answer::of)
    }

    /// `GET /v1/vfolders`: the caller's; `all`: every key's (admin only).
    pub fn vfolders(&self, all: bool) -> Result<Answer<VfolderList>, ClientError> {
        let query: &[(&str, &str)] = if all { &[("all", "true")] } else { &[] };
        self.get("/v1/vfolders", query).map(Answer::of)
    }

    /// `DELETE /v1/vfolders/{name}`: the vfolder's record, deleted.
    pub fn delete_vfolder(&self, name: &str) -> Result<Answer<Vfolder>, ClientError> {
        self.delete(&format!("/v1/vfolders/{}", segment(name)))
            .map(Answer::of)
    }
}
