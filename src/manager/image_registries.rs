//! The container registries of `manager.toml` (`[[registry]]`): which one an image reference
//! names, and the `ImageConfig.registry` (Backend.AI's `ImageRegistry`: name, URL, user name,
//! password) the agent pulls it with. An image whose registry is not configured is pulled
//! anonymously.
//!
//! Passwords are read from their files once, at start, and never logged (`ImageRegistry`'s
//! `Debug` redacts them).

use std::collections::BTreeMap;

use crate::config::RegistrySection;
use crate::rpc::agent_api::kernel::ImageRegistry;

pub use crate::rpc::agent_api::kernel::registry_host;

/// The configured registries by host, with their passwords read.
#[derive(Clone, Debug, Default)]
pub struct ImageRegistries {
    by_host: BTreeMap<String, ImageRegistry>,
}

impl ImageRegistries {
    /// Reads every `[[registry]]`'s password file.
    ///
    /// Errors: a password file that cannot be read (naming the registry and the file, never
    /// the content), or two registries on one host.
    pub fn load(sections: &[RegistrySection]) -> anyhow::Result<ImageRegistries> {
        let mut by_host = BTreeMap::new();
        for r in sections {
            let password = match &r.password_file {
                Some(path) => {
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        anyhow::anyhow!(
                            "registry `{}`: cannot read password-file {}: {e}",
                            r.name,
                            path.display()
                        )
                    })?;
                    Some(text.lines().next().unwrap_or("").to_owned())
                }
                None => None,
            };
            let url = if r.url.contains("://") {
                r.url.clone()
            } else {
                format!("https://{}", r.url)
            };
            let host = crate::config::registry_url_host(&url);
            let entry = ImageRegistry {
                name: r.name.clone(),
                url,
                username: r.username.clone(),
                password,
            };
            if by_host.insert(host.clone(), entry).is_some() {
                anyhow::bail!("two [[registry]] entries for host {host}");
            }
        }
        Ok(ImageRegistries { by_host })
    }

    /// The registry `reference` is pulled from: the configured one of its host, else an
    /// anonymous one named after the host (`url` `https://<host>`, no credentials).
    pub fn for_image(&self, reference: &str) -> ImageRegistry {
        let host = registry_host(reference);
        self.by_host
            .get(&host)
            .cloned()
            .unwrap_or_else(|| ImageRegistry {
                name: host.clone(),
                url: format!("https://{host}"),
                username: None,
                password: None,
            })
    }

    /// The configured registry named `name`, if any.
    pub fn by_name(&self, name: &str) -> Option<&ImageRegistry> {
        self.by_host.values().find(|r| r.name == name)
    }

    /// Whether `reference`'s registry is configured.
    pub fn is_configured(&self, reference: &str) -> bool {
        self.by_host.contains_key(&registry_host(reference))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(name: &str, url: &str, user: Option<&str>, file: Option<&str>) -> RegistrySection {
        RegistrySection {
            name: name.into(),
            url: url.into(),
            username: user.map(Into::into),
            password_file: file.map(Into::into),
        }
    }

    #[test]
    fn hosts_follow_dockers_rule() {
        assert_eq!(registry_host("python:3.12"), "docker.io");
        assert_eq!(registry_host("library/python"), "docker.io");
        assert_eq!(registry_host("nvcr.io/nvidia/pytorch:24.01"), "nvcr.io");
        assert_eq!(registry_host("127.0.0.1:5000/team/img:1"), "127.0.0.1:5000");
        assert_eq!(registry_host("localhost/img"), "localhost");
        assert_eq!(
            registry_host("Registry.Example.com/a/b"),
            "registry.example.com"
        );
    }

    #[test]
    fn configured_registries_carry_their_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\n").unwrap();
        let regs = ImageRegistries::load(&[section(
            "team",
            "http://127.0.0.1:5000",
            Some("kv"),
            Some(pw.to_str().unwrap()),
        )])
        .unwrap();
        let r = regs.for_image("127.0.0.1:5000/team/img:1");
        assert_eq!(r.name, "team");
        assert_eq!(r.url, "http://127.0.0.1:5000");
        assert_eq!(r.username.as_deref(), Some("kv"));
        assert_eq!(r.password.as_deref(), Some("s3cret"));
        assert!(!format!("{r:?}").contains("s3cret"), "Debug redacts");
        let anon = regs.for_image("python:3.12");
        assert_eq!((anon.name.as_str(), anon.password), ("docker.io", None));
        assert!(regs.is_configured("127.0.0.1:5000/x"));
        assert!(regs.by_name("team").is_some());
    }

    #[test]
    fn bad_entries_are_refused_clearly() {
        assert!(section("", "https://r", None, None).check().is_err());
        assert!(section("r", "https://", None, None).check().is_err());
        let e = section("r", "https://r", Some("u"), None)
            .check()
            .unwrap_err();
        assert!(e.contains("password-file"), "{e}");
        let e = ImageRegistries::load(&[section("r", "r.io", Some("u"), Some("/nonexistent/pw"))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/pw") && e.contains("`r`"), "{e}");
    }
}
