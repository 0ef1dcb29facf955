//! Value types shared by both config files.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read: `(path, reason)`.
    #[error("cannot read config {0}: {1}")]
    Read(String, String),
    /// TOML syntax, an unknown key or a bad value: `(path, toml's message naming key and line)`.
    #[error("invalid config {0}: {1}")]
    Parse(String, String),
    /// A value that parses but cannot work: `(key, reason)`.
    #[error("invalid config key `{0}`: {1}")]
    Invalid(&'static str, String),
}

/// `{ host = "0.0.0.0", port = 6011 }`, as Backend.AI writes addresses.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HostPort {
    /// Host name or IP address.
    pub host: String,
    /// TCP port; 0 picks a free one where binding.
    pub port: u16,
}

impl HostPort {
    /// The ZeroMQ endpoint, `tcp://host:port`.
    pub fn zmq_endpoint(&self) -> String {
        format!("tcp://{}:{}", self.host, self.port)
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A positive duration written as seconds (`30`, `0.5`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seconds(pub std::time::Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(v.is_finite() && v > 0.0 && v < 1e9) {
            return Err(serde::de::Error::custom(format!(
                "expected a positive number of seconds, got {v}"
            )));
        }
        Ok(Seconds(std::time::Duration::from_secs_f64(v)))
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable, coloured when on a terminal.
    #[default]
    Pretty,
    /// One JSON object per line, for log shippers.
    Json,
}

/// `[logging]`: `format = "pretty" | "json"`, `level` as a tracing filter (`info`,
/// `kernelvisor=debug,info`); `RUST_LOG` overrides `level`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LoggingConfig {
    /// Line format (default `pretty`).
    #[serde(default)]
    pub format: LogFormat,
    /// Filter directive (default `info`).
    #[serde(default = "default_level")]
    pub level: String,
}

fn default_level() -> String {
    "info".into()
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            format: LogFormat::default(),
            level: default_level(),
        }
    }
}

impl LoggingConfig {
    /// Installs the global `tracing` subscriber. Call once per process.
    ///
    /// Errors: `level` is not a valid filter directive.
    pub fn init(&self) -> Result<(), ConfigError> {
        use tracing_subscriber::EnvFilter;
        let filter = match std::env::var("RUST_LOG") {
            Ok(v) if !v.is_empty() => EnvFilter::try_new(v),
            _ => EnvFilter::try_new(&self.level),
        }
        .map_err(|e| ConfigError::Invalid("logging.level", e.to_string()))?;
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Colour only for a person at a terminal: a log file or a pipe gets plain text.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
        let _ = match self.format {
            LogFormat::Json => builder.json().flatten_event(true).try_init(),
            LogFormat::Pretty => builder.try_init(),
        };
        Ok(())
    }
}

/// A size in bytes, written as an integer (`268435456`) or a string with a binary suffix
/// (`"256m"`, `"1G"`, `"512k"`; k/m/g/t = 2^10/2^20/2^30/2^40), as Backend.AI's `BinarySize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses `"256m"`-style text (see the type's docs).
    ///
    /// Errors: an empty, negative or non-numeric value, or an unknown suffix.
    pub fn parse(text: &str) -> Result<ByteSize, String> {
        let t = text.trim();
        let t = t.strip_suffix(['b', 'B']).unwrap_or(t);
        let (digits, shift) = match t.chars().last() {
            Some(c @ ('k' | 'K' | 'm' | 'M' | 'g' | 'G' | 't' | 'T')) => {
                let shift = match c.to_ascii_lowercase() {
                    'k' => 10,
                    'm' => 20,
                    'g' => 30,
                    _ => 40,
                };
                (&t[..t.len() - 1], shift)
            }
            _ => (t, 0),
        };
        let n: f64 = digits
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a size (e.g. 268435456, \"256m\", \"1g\")"))?;
        if !(n.is_finite() && n >= 0.0) {
            return Err(format!("`{text}` is not a non-negative size"));
        }
        Ok(ByteSize((n * (1u64 << shift) as f64) as u64))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(s) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}
