//! A headless Chromium (Debian's `chromium`) behind its own `chromedriver`, driven by
//! fantoccini, with a blocking face: what the web console's tests (`tests/it/console/`) and
//! its bench (`benches/console.rs`) share. `just chromium` installs both packages.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// How long a wait of [`Browser::wait_text`] (and the driver's start) may take.
pub const LONG: Duration = Duration::from_secs(90);

/// A chromedriver command of its own beyond WebDriver's: `POST session/<id>/<path>` with a
/// JSON body. Used as `se/log` `{"type": "browser"}` (Selenium's legacy log: the browser's
/// console entries since the last read, `[{"level", "message", "source", "timestamp"}]`) and
/// `goog/cdp/execute` `{"cmd", "params"}` (one Chrome DevTools Protocol method, answering its
/// result).
#[derive(Debug)]
struct ChromeCommand {
    path: &'static str,
    body: Value,
}

impl ChromeCommand {
    fn browser_log() -> ChromeCommand {
        ChromeCommand {
            path: "se/log",
            body: json!({"type": "browser"}),
        }
    }
}

impl WebDriverCompatibleCommand for ChromeCommand {
    fn endpoint(
        &self,
        base: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!(
            "session/{}/{}",
            session_id.unwrap_or_default(),
            self.path
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.to_string()))
    }
}

/// A headless Chromium behind its own chromedriver, with a blocking face for the tests.
pub struct Browser {
    pub rt: tokio::runtime::Runtime,
    pub client: Client,
    driver: Child,
    /// Where screenshots and the driver's log go (the cluster's directory).
    pub dir: PathBuf,
    /// The console log entries read so far (each read drains chromedriver's buffer).
    pub log: Vec<Value>,
    _profile: tempfile::TempDir,
}

/// `chromedriver`'s path: the `chromium-driver` package's (`just chromium` installs it).
pub fn chromedriver() -> PathBuf {
    let path = PathBuf::from("/usr/bin/chromedriver");
    assert!(
        path.exists(),
        "no {}: install Debian's chromium and chromium-driver (`just chromium`)",
        path.display()
    );
    path
}

impl Browser {
    /// Starts chromedriver on `port` (a free one) and a headless Chromium session at 1280×800.
    pub fn start(dir: &Path, port: u16) -> Browser {
        let log = std::fs::File::create(dir.join("chromedriver.log")).unwrap();
        let driver = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while !ureq::get(&format!("{base}/status"))
            .timeout(Duration::from_secs(5))
            .call()
            .ok()
            .and_then(|r| r.into_json::<Value>().ok())
            .is_some_and(|v| v["value"]["ready"] == true)
        {
            assert!(start.elapsed() < LONG, "chromedriver not ready in {LONG:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::Builder::new()
            .prefix("kv-chromium-")
            .tempdir()
            .unwrap();
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                // As root (CI) Chromium's sandbox cannot start; /dev/shm is small in containers.
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", "--window-size=1280,800",
                         format!("--user-data-dir={}", profile.path().display())],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        let client = rt
            .block_on(
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(caps)
                    .connect(&base),
            )
            .expect("a Chromium session through chromedriver");
        Browser {
            rt,
            client,
            driver,
            dir: dir.to_owned(),
            log: Vec::new(),
            _profile: profile,
        }
    }

    pub fn goto(&self, url: &str) {
        self.rt.block_on(self.client.goto(url)).unwrap();
    }

    pub fn url(&self) -> String {
        self.rt
            .block_on(self.client.current_url())
            .unwrap()
            .to_string()
    }

    /// Runs `script` in the page (WebDriver's execute, not subject to the page's CSP).
    pub fn js(&self, script: &str) -> Value {
        self.rt
            .block_on(self.client.execute(script, Vec::new()))
            .unwrap()
    }

    /// Runs the DevTools Protocol method `cmd` with `params` (e.g. `Network.setBlockedURLs`);
    /// its result.
    pub fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.rt
            .block_on(self.client.issue_cmd(ChromeCommand {
                path: "goog/cdp/execute",
                body: json!({"cmd": cmd, "params": params}),
            }))
            .unwrap_or_else(|e| panic!("{cmd}: {e}"))
    }

    /// The text of the page's body (for failure messages).
    pub fn page_text(&self) -> String {
        self.js("return document.body ? document.body.innerText : ''")
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The text of the first element `css` matches, `None` when none does.
    pub fn text(&self, css: &str) -> Option<String> {
        self.rt.block_on(async {
            let e = self.client.find(Locator::Css(css)).await.ok()?;
            e.text().await.ok()
        })
    }

    /// How many elements `css` matches.
    pub fn count(&self, css: &str) -> usize {
        self.rt
            .block_on(self.client.find_all(Locator::Css(css)))
            .map(|v| v.len())
            .unwrap_or(0)
    }

    /// Waits until the element `css` exists and its text satisfies `ok`; returns the text.
    /// Panics naming `what`, with the page's text and the browser's console log, after
    /// [`LONG`].
    pub fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            if let Some(t) = self.text(css).filter(|t| ok(t)) {
                return t;
            }
            assert!(
                start.elapsed() < LONG,
                "timed out after {LONG:?} waiting for {what} ({css}: {:?}); the page reads:\n{}\n\
                 the console log:\n{:#?}",
                self.text(css),
                self.page_text(),
                self.rt
                    .block_on(self.client.issue_cmd(ChromeCommand::browser_log()))
                    .ok()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn click(&self, css: &str) {
        self.rt
            .block_on(async { self.client.find(Locator::Css(css)).await?.click().await })
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Replaces the value of the input `css` with `value`, as typed.
    pub fn fill(&self, css: &str, value: &str) {
        self.rt
            .block_on(async {
                let e = self.client.find(Locator::Css(css)).await?;
                e.clear().await?;
                e.send_keys(value).await
            })
            .unwrap_or_else(|e| panic!("fill {css}: {e}"));
    }

    /// Types `keys` into the element `css` (WebDriver key events; `\u{e007}` is Enter).
    pub fn type_keys(&self, css: &str, keys: &str) {
        self.rt
            .block_on(async {
                self.client
                    .find(Locator::Css(css))
                    .await?
                    .send_keys(keys)
                    .await
            })
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// A PNG of the window as `<name>.png` in the cluster's directory, and in `docs/console/`
    /// with `KV_WRITE_CONSOLE_SCREENSHOTS=1`.
    pub fn screenshot(&self, name: &str) {
        let png = self.rt.block_on(self.client.screenshot()).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(self.dir.join(format!("{name}.png")), &png).unwrap();
        if std::env::var_os("KV_WRITE_CONSOLE_SCREENSHOTS").is_some() {
            let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console");
            std::fs::create_dir_all(&docs).unwrap();
            std::fs::write(docs.join(format!("{name}.png")), &png).unwrap();
        }
    }

    /// The console's errors so far: `SEVERE` entries but the network's (a refused request is
    /// logged by Chromium whatever the page does with it; the tests ask for some on purpose and
    /// check that the page shows them). A script error, an unhandled rejection, a Content-
    /// Security-Policy violation or a `console.error` is one.
    pub fn console_errors(&mut self) -> Vec<Value> {
        let got = self
            .rt
            .block_on(self.client.issue_cmd(ChromeCommand::browser_log()))
            .expect("the browser's console log (chromedriver's /se/log)");
        self.log.extend(got.as_array().cloned().unwrap_or_default());
        self.log
            .iter()
            .filter(|e| e["level"] == "SEVERE" && e["source"] != "network")
            .cloned()
            .collect()
    }

    /// Signs in at the console's page with `secret`; waits until the role is shown.
    /// With `keyboard`, the form is sent with the Enter key rather than a click.
    pub fn sign_in(&self, secret: &str, role: &str, keyboard: bool) {
        self.wait_text("h1", "the sign-in page", |t| t == "Sign in");
        if keyboard {
            // WebDriver's Enter key.
            self.fill("#secret", &format!("{secret}\u{e007}"));
        } else {
            self.fill("#secret", secret);
            self.click("#sign-in button[type=submit]");
        }
        self.wait_text("#role", "the signed-in role", |t| {
            t == format!("{role} key")
        });
        assert!(!self.url().contains(secret), "the secret is in no URL");
        assert_eq!(
            self.js("return sessionStorage.getItem('kernelvisor.secret')"),
            json!(secret),
            "the secret is kept in the tab's sessionStorage"
        );
        assert_eq!(self.js("return document.cookie"), json!(""), "no cookie");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let client = self.client.clone();
        let _ = self.rt.block_on(client.close());
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
