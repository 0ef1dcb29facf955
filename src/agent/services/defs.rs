//! Service definitions from the image, Backend.AI's format: the image label
//! `ai.backend.service-ports` = `name:protocol:port[,name:protocol:port…]` (a port may be a list
//! `[8080,8081]`) and, per service, `/etc/backend.ai/service-defs/<name>.json` =
//! `{"command": [..], "env": {..}, "prestart": [[..]]}` where `{ports[i]}` and `{home}` in
//! strings are replaced (Backend.AI `ai.backend.agent.service`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::agent::backend::{BackendError, ContainerBackend};
use crate::agent::files::tar::{EntryKind, TarReader};
use crate::agent::kernel::config::ServicePortRequest;

/// The image label naming the services.
pub const SERVICE_PORTS_LABEL: &str = "ai.backend.service-ports";

/// Where service-def files live in the image.
pub const SERVICE_DEFS_DIR: &str = "/etc/backend.ai/service-defs";

/// Largest service-def file read (bytes).
const MAX_DEF_BYTES: u64 = 64 << 10;

/// Protocols a service port may declare.
const PROTOCOLS: &[&str] = &["http", "tcp", "preopen"];

/// A service name is one safe path component (it names the def file): `[A-Za-z0-9_-]`,
/// 1 to 64 characters.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    ok.then_some(())
        .ok_or_else(|| format!("service name `{name}` must be 1-64 of A-Z a-z 0-9 _ -"))
}

/// Parses the label's value.
///
/// Errors: a message naming the label and the part that does not parse (an unknown protocol,
/// a bad port or name, a port or name given twice).
pub fn parse_label(value: &str) -> Result<Vec<ServicePortRequest>, String> {
    let err = |m: String| format!("image label `{SERVICE_PORTS_LABEL}` = `{value}`: {m}");
    let mut out: Vec<ServicePortRequest> = Vec::new();
    // Commas separate services, except inside a `[p1,p2]` port list.
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in value.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&value[start..]);
    for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let fields: Vec<&str> = part.splitn(3, ':').collect();
        let [name, protocol, ports] = fields[..] else {
            return Err(err(format!("`{part}` is not name:protocol:port")));
        };
        check_name(name).map_err(err)?;
        if !PROTOCOLS.contains(&protocol) {
            return Err(err(format!(
                "`{part}`: protocol `{protocol}` is not one of {}",
                PROTOCOLS.join(", ")
            )));
        }
        let list = ports
            .strip_prefix('[')
            .and_then(|p| p.strip_suffix(']'))
            .unwrap_or(ports);
        let container_ports = list
            .split(',')
            .map(|p| p.trim().parse::<u16>().ok().filter(|p| *p > 0))
            .collect::<Option<Vec<u16>>>()
            .ok_or_else(|| err(format!("`{part}`: `{ports}` is not a TCP port")))?;
        if out.iter().any(|s| s.name == name) {
            return Err(err(format!("service `{name}` is declared twice")));
        }
        out.push(ServicePortRequest {
            name: name.to_owned(),
            protocol: protocol.to_owned(),
            container_ports,
        });
    }
    let mut all: Vec<u16> = out.iter().flat_map(|s| s.container_ports.clone()).collect();
    all.sort_unstable();
    if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(format!("port {} is declared twice", w[0])));
    }
    Ok(out)
}

/// The kernel's service ports: the image's, then those the request names (a request's port
/// of the same name replaces the image's).
///
/// Errors: the label's parse error; a container port used by two services.
pub fn merge(
    image_labels: &std::collections::HashMap<String, String>,
    requested: &[ServicePortRequest],
) -> Result<Vec<ServicePortRequest>, String> {
    let mut all = match image_labels.get(SERVICE_PORTS_LABEL) {
        Some(v) => parse_label(v)?,
        None => Vec::new(),
    };
    all.retain(|s| !requested.iter().any(|r| r.name == s.name));
    all.extend(requested.iter().cloned());
    let mut ports: Vec<u16> = all.iter().flat_map(|s| s.container_ports.clone()).collect();
    ports.sort_unstable();
    if let Some(w) = ports.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!(
            "container port {} is used by two service ports (image label and request)",
            w[0]
        ));
    }
    Ok(all)
}

/// A service-def file (other keys, such as Backend.AI's `url_template`, are ignored).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ServiceDef {
    /// The service's argument vector (run without a shell).
    pub command: Vec<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Commands run to completion before it, in order; a failing one fails the start.
    #[serde(default)]
    pub prestart: Vec<Vec<String>>,
}

impl ServiceDef {
    /// Parses a def file.
    ///
    /// Errors: the JSON error; an empty `command`.
    pub fn parse(json: &[u8]) -> Result<ServiceDef, String> {
        let def: ServiceDef = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        if def.command.is_empty() {
            return Err("`command` is empty".into());
        }
        Ok(def)
    }

    /// With `{ports[i]}` replaced by the i-th container port and `{home}` by `home`.
    pub fn render(&self, ports: &[u16], home: &str) -> ServiceDef {
        let fill = |s: &String| {
            let mut s = s.replace("{home}", home);
            for (i, p) in ports.iter().enumerate() {
                s = s.replace(&format!("{{ports[{i}]}}"), &p.to_string());
            }
            s
        };
        ServiceDef {
            command: self.command.iter().map(fill).collect(),
            env: self.env.iter().map(|(k, v)| (k.clone(), fill(v))).collect(),
            prestart: self
                .prestart
                .iter()
                .map(|c| c.iter().map(fill).collect())
                .collect(),
        }
    }
}

/// Why a def file could not be had.
#[derive(Debug, thiserror::Error)]
pub enum DefError {
    /// The image has no def file for the service.
    #[error("the image has no {SERVICE_DEFS_DIR}/{0}.json")]
    Missing(String),
    /// It does not parse.
    #[error("{SERVICE_DEFS_DIR}/{0}.json: {1}")]
    Invalid(String, String),
    /// The engine failed.
    #[error(transparent)]
    Engine(BackendError),
}

/// Reads the def file of service `name` from the container (the archive API).
///
/// Errors: [`DefError`].
pub async fn read(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    name: &str,
) -> Result<ServiceDef, DefError> {
    let path = format!("{SERVICE_DEFS_DIR}/{name}.json");
    let mut reader = TarReader::new(backend.archive_get(container_id, &path));
    let entry = match reader.next_entry().await {
        Ok(Some(e)) if e.kind == EntryKind::File => e,
        Ok(_) | Err(BackendError::PathNotFound(_)) => return Err(DefError::Missing(name.into())),
        Err(e) => return Err(DefError::Engine(e)),
    };
    if entry.size > MAX_DEF_BYTES {
        return Err(DefError::Invalid(
            name.into(),
            format!("{} bytes is more than {MAX_DEF_BYTES}", entry.size),
        ));
    }
    let mut data = Vec::new();
    while let Some(chunk) = reader.read_data(64 << 10).await.map_err(DefError::Engine)? {
        data.extend_from_slice(&chunk);
    }
    ServiceDef::parse(&data).map_err(|e| DefError::Invalid(name.into(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backend_ai_labels() {
        let s = parse_label("jupyter:http:8080, ssh:tcp:2200,tb:preopen:[6006,6007]").unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "jupyter");
        assert_eq!(s[0].container_ports, vec![8080]);
        assert_eq!(s[1].protocol, "tcp");
        assert_eq!(s[2].container_ports, vec![6006, 6007]);
        assert!(parse_label("").unwrap().is_empty());
    }

    #[test]
    fn a_bad_label_names_the_label_and_the_part() {
        for bad in [
            "web:http",
            "web:gopher:80",
            "web:http:99999",
            "../x:http:80",
            "a:http:80,b:tcp:80",
            "a:http:80,a:tcp:81",
        ] {
            let e = parse_label(bad).unwrap_err();
            assert!(e.contains(SERVICE_PORTS_LABEL), "{bad}: {e}");
        }
    }

    #[test]
    fn a_request_replaces_the_image_port_of_the_same_name() {
        let labels = [(SERVICE_PORTS_LABEL.to_owned(), "web:http:8080".to_owned())].into();
        let req = ServicePortRequest {
            name: "web".into(),
            protocol: "http".into(),
            container_ports: vec![9000],
        };
        let all = merge(&labels, std::slice::from_ref(&req)).unwrap();
        assert_eq!(all, vec![req]);
        let other = ServicePortRequest {
            name: "x".into(),
            protocol: "tcp".into(),
            container_ports: vec![8080],
        };
        assert!(merge(&labels, &[other]).is_err());
    }

    #[test]
    fn renders_ports_and_home() {
        let def = ServiceDef::parse(
            br#"{"command": ["httpd", "-p", "{ports[0]}", "-h", "{home}"], "env": {"P": "{ports[1]}"}, "prestart": [["mkdir", "{home}/x"]]}"#,
        )
        .unwrap();
        let r = def.render(&[8080, 8081], "/home/work");
        assert_eq!(r.command, vec!["httpd", "-p", "8080", "-h", "/home/work"]);
        assert_eq!(r.env["P"], "8081");
        assert_eq!(r.prestart, vec![vec!["mkdir", "/home/work/x"]]);
        assert!(ServiceDef::parse(br#"{"command": []}"#).is_err());
        assert!(ServiceDef::parse(br#"{"cmd": ["x"]}"#).is_err());
        assert!(
            ServiceDef::parse(br#"{"command": ["x"], "url_template": "{protocol}://"}"#).is_ok()
        );
    }
}
