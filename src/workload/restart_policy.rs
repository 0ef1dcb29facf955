//! A session's restart policy: what the kernel's supervisor does when its container exits.
//!
//! The shape follows Kubernetes' `restartPolicy` (`Never` / `OnFailure` / `Always`) and Nomad's
//! `restart` block (`attempts` within `interval`, `delay`), as OTP restart intensity: more than
//! `max_restarts` restarts within `window` seconds and the kernel ends with reason
//! `restart-limit-exceeded`.

use serde::{Deserialize, Serialize};

/// When a kernel's exited container is restarted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum RestartMode {
    /// Never: the container's exit ends the kernel (the default).
    #[default]
    Never,
    /// After a failure: a non-zero exit code, an OOM kill, or a failing `HEALTHCHECK`.
    OnFailure,
    /// After every exit, a clean one included.
    Always,
}

impl TryFrom<String> for RestartMode {
    type Error = String;

    /// Errors: names the field and the three modes (serde's own message names neither).
    fn try_from(s: String) -> Result<RestartMode, String> {
        match s.as_str() {
            "never" => Ok(RestartMode::Never),
            "on-failure" => Ok(RestartMode::OnFailure),
            "always" => Ok(RestartMode::Always),
            _ => Err(format!(
                "`restart_policy.mode` must be `never`, `on-failure` or `always`, not `{s}`"
            )),
        }
    }
}

impl RestartMode {
    /// The wire name: `never`, `on-failure`, `always`.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartMode::Never => "never",
            RestartMode::OnFailure => "on-failure",
            RestartMode::Always => "always",
        }
    }
}

/// A msgpack value as JSON, for serde's JSON rules (strings as enum names); keys that are not
/// strings and binary become strings, so a bad field is still named in the error.
fn json_of(v: &rmpv::Value) -> serde_json::Value {
    use rmpv::Value as M;
    use serde_json::Value as J;
    match v {
        M::Nil => J::Null,
        M::Boolean(b) => J::Bool(*b),
        M::Integer(i) => i
            .as_i64()
            .map(J::from)
            .or_else(|| i.as_u64().map(J::from))
            .unwrap_or(J::Null),
        M::F32(f) => J::from(f64::from(*f)),
        M::F64(f) => J::from(*f),
        M::String(s) => J::String(s.as_str().unwrap_or_default().to_owned()),
        M::Array(a) => J::Array(a.iter().map(json_of).collect()),
        M::Map(m) => J::Object(
            m.iter()
                .map(|(k, v)| {
                    (
                        k.as_str().map_or_else(|| k.to_string(), str::to_owned),
                        json_of(v),
                    )
                })
                .collect(),
        ),
        other => J::String(other.to_string()),
    }
}

/// `{"mode": "never"|"on-failure"|"always", "max_restarts": n, "window": s, "backoff": s}`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartPolicy {
    /// When to restart (default `never`).
    #[serde(default)]
    pub mode: RestartMode,
    /// Restarts allowed within `window` (default 3, at most 1000).
    #[serde(default = "default_max_restarts")]
    #[schema(minimum = 0, maximum = 1000)]
    pub max_restarts: u32,
    /// The intensity window in seconds (default 60; more than 0, at most 86400).
    #[serde(default = "default_window")]
    #[schema(exclusive_minimum = 0, maximum = 86400)]
    pub window: f64,
    /// Seconds before the first restart in the window, doubling with each further one up to
    /// 300 s (default 1; 0 to 3600).
    #[serde(default = "default_backoff")]
    #[schema(minimum = 0, maximum = 3600)]
    pub backoff: f64,
}

fn default_max_restarts() -> u32 {
    3
}

fn default_window() -> f64 {
    60.0
}

fn default_backoff() -> f64 {
    1.0
}

/// The longest delay between two restarts, however many came before (seconds).
pub const MAX_BACKOFF_SECONDS: f64 = 300.0;

impl Default for RestartPolicy {
    fn default() -> RestartPolicy {
        RestartPolicy {
            mode: RestartMode::Never,
            max_restarts: default_max_restarts(),
            window: default_window(),
            backoff: default_backoff(),
        }
    }
}

impl RestartPolicy {
    /// Checks the bounds.
    ///
    /// Errors: a message naming the field (`restart_policy.window: …`).
    pub fn check(&self) -> Result<(), String> {
        if self.max_restarts > 1000 {
            return Err("`restart_policy.max_restarts` must be at most 1000".into());
        }
        if !(self.window.is_finite() && self.window > 0.0 && self.window <= 86_400.0) {
            return Err(
                "`restart_policy.window` must be more than 0 and at most 86400 seconds".into(),
            );
        }
        if !(self.backoff.is_finite() && (0.0..=3600.0).contains(&self.backoff)) {
            return Err("`restart_policy.backoff` must be 0 to 3600 seconds".into());
        }
        Ok(())
    }

    /// Parses and checks the kernel config's `restart_policy` map (msgpack).
    ///
    /// Errors: a message naming the field, for an unknown key, a wrong type or a bound.
    pub fn from_value(v: &rmpv::Value) -> Result<RestartPolicy, String> {
        let policy: RestartPolicy =
            serde_json::from_value(json_of(v)).map_err(|e| format!("`restart_policy`: {e}"))?;
        policy.check()?;
        Ok(policy)
    }

    /// As the kernel config's msgpack map.
    pub fn to_value(&self) -> rmpv::Value {
        rmpv::Value::Map(vec![
            ("mode".into(), self.mode.as_str().into()),
            ("max_restarts".into(), self.max_restarts.into()),
            ("window".into(), rmpv::Value::F64(self.window)),
            ("backoff".into(), rmpv::Value::F64(self.backoff)),
        ])
    }

    /// Whether a container that ended this way is restarted: `failed` for a non-zero exit, an
    /// OOM kill or an unhealthy container.
    pub fn restarts_after(&self, failed: bool) -> bool {
        match self.mode {
            RestartMode::Never => false,
            RestartMode::OnFailure => failed,
            RestartMode::Always => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_bounds_are_named() {
        let p: RestartPolicy = serde_json::from_str(r#"{"mode": "on-failure"}"#).unwrap();
        assert_eq!(p.mode, RestartMode::OnFailure);
        assert_eq!((p.max_restarts, p.window, p.backoff), (3, 60.0, 1.0));
        assert!(p.check().is_ok());
        let bad: RestartPolicy = serde_json::from_str(r#"{"window": 0}"#).unwrap();
        assert!(bad.check().unwrap_err().contains("window"));
        assert!(serde_json::from_str::<RestartPolicy>(r#"{"mode": "sometimes"}"#).is_err());
        assert!(serde_json::from_str::<RestartPolicy>(r#"{"retries": 1}"#).is_err());
        let round = RestartPolicy::from_value(&p.to_value()).unwrap();
        assert_eq!(round, p);
        assert!(RestartPolicy::from_value(&rmpv::Value::from(3)).is_err());
    }

    #[test]
    fn modes_decide_restarts() {
        let p = |mode| RestartPolicy {
            mode,
            ..RestartPolicy::default()
        };
        assert!(!p(RestartMode::Never).restarts_after(true));
        assert!(p(RestartMode::OnFailure).restarts_after(true));
        assert!(!p(RestartMode::OnFailure).restarts_after(false));
        assert!(p(RestartMode::Always).restarts_after(false));
    }
}
