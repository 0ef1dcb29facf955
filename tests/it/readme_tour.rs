//! The README's five-minute tour, run from top to bottom as written (issue 26): the dev pair
//! started as `just run` starts it (`scripts/dev-run.sh`, in a temporary root on free ports),
//! then every `sh` block between the README's tour marks in one `bash -eu -o pipefail`, in the
//! root, with the `kernelvisor` under test first on the PATH. A line marked `tour: skip` (an
//! interactive one) is left out. Then Ctrl+C (SIGINT) stops the pair.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::dev::DevRoot;

/// The tour's shell lines, in order.
fn tour() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme.find("<!-- tour:").expect("the README's tour mark");
    let end = readme
        .find("<!-- tour: end -->")
        .expect("the README's tour end mark");
    let mut script = String::new();
    let mut in_sh = false;
    for line in readme[start..end].lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            _ if in_sh && !line.contains("tour: skip") => {
                script.push_str(line);
                script.push('\n');
            }
            _ => {}
        }
    }
    assert!(script.lines().count() >= 8, "the tour is there: {script}");
    script
}

#[test]
fn the_readme_tour_runs_as_written() {
    let script = tour();
    let root = DevRoot::new();
    let log = root.path().join("run.log");
    let mut pair = Command::new("./scripts/dev-run.sh")
        .current_dir(root.path())
        .env("KV_BIN", env!("CARGO_BIN_EXE_kernelvisor"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("Ctrl+C stops both.")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(120) && pair.try_wait().unwrap().is_none(),
            "the dev pair did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let out = Command::new("bash")
        .args(["-eu", "-o", "pipefail", "-c", &script])
        .current_dir(root.path())
        .env("PATH", path)
        .env_remove("KERNELVISOR_API")
        .env_remove("KERNELVISOR_TOKEN")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the tour failed ({}):\n--- script\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    for expected in [
        "agent-dev",
        "hello from",
        "1\n2\n3\n",
        "start\ndone\n",
        "SUCCESS",
        "TERMINATED",
        "PREPARING",
        "RUNNING",
    ] {
        assert!(
            stdout.contains(expected),
            "the tour's output lacks {expected:?}:\n{stdout}\n--- stderr\n{stderr}"
        );
    }
    // `printf 'one\ntwo\n' | … exec … 'tr a-z A-Z'`: stdin was forwarded.
    assert!(
        stdout.contains("ONE\nTWO\n"),
        "stdin was forwarded:\n{stdout}"
    );

    // Ctrl+C as at the terminal: the pair stops, saying so.
    // SAFETY: signalling our child.
    unsafe { libc::kill(pair.id() as i32, libc::SIGINT) };
    let status = pair.wait().unwrap();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.success() && said.contains("kernelvisor dev pair stopped."),
        "{status}: {said}"
    );
    assert!(root.pid("manager").is_none() && root.pid("agent").is_none());
}
