//! The stage tree: stages as supervised children, set up in order, restarted rest_for_one
//! when a watched resource fails, released in reverse, detached and adopted again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actors::{
    BoxError, Detached, ExitReason, Intensity, Provisioner, StageStatus, StageTree,
    StageTreeBuilder, WhichChildren,
};
use futures::FutureExt;
use tokio::sync::watch;

type Log = Arc<Mutex<Vec<String>>>;

/// A provisioner whose resource is `<name>#<n>` (n-th setup), logging every operation.
struct Counted {
    name: &'static str,
    log: Log,
    fail_setup: bool,
}

impl Provisioner for Counted {
    type Spec = Vec<String>;
    type Resource = String;
    fn name(&self) -> &'static str {
        self.name
    }
    async fn setup(&self, earlier: Vec<String>) -> Result<String, BoxError> {
        if self.fail_setup {
            return Err("refused".into());
        }
        let mut log = self.log.lock().unwrap();
        let n = log
            .iter()
            .filter(|l| l.starts_with(&format!("setup {}", self.name)))
            .count()
            + 1;
        let r = format!("{}#{n}", self.name);
        log.push(format!("setup {r} after {earlier:?}"));
        Ok(r)
    }
    async fn teardown(&self, r: String) -> Result<(), BoxError> {
        self.log.lock().unwrap().push(format!("teardown {r}"));
        Ok(())
    }
}

fn stage(name: &'static str, log: &Log) -> Counted {
    Counted {
        name,
        log: log.clone(),
        fail_setup: false,
    }
}

/// `a → b → c`, where `b` is watched: setting `kill` to true fails b's resource.
fn tree(log: &Log, kill: watch::Receiver<u32>, intensity: Intensity) -> StageTreeBuilder {
    let earlier = |names: &'static [&'static str]| {
        move |r: &actors::Resources<'_>| -> Result<Vec<String>, BoxError> {
            names
                .iter()
                .map(|n| Ok(r.get::<String>(n)?.clone()))
                .collect()
        }
    };
    StageTree::builder("kernel")
        .intensity(intensity)
        .stage(stage("a", log), earlier(&[]))
        .watched_stage(stage("b", log), earlier(&["a"]), move |_r: &String| {
            let mut kill = kill.clone();
            async move {
                let seen = *kill.borrow_and_update();
                let _ = kill.wait_for(|k| *k > seen).await;
                Err::<(), BoxError>("resource died".into())
            }
            .boxed_local()
        })
        .stage(stage("c", log), earlier(&["a", "b"]))
}

fn lines(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[actix_rt::test]
async fn stages_set_up_in_order_restart_rest_for_one_and_give_up_past_the_intensity() {
    let log = Log::default();
    let (kill, killed) = watch::channel(0u32);
    let mut t = tree(&log, killed, Intensity::new(2, 60)).build();
    let (exit_tx, mut exit_rx) = watch::channel(None);
    t.start(move |r| {
        exit_tx.send_replace(Some(r));
    });
    t.ready().await.unwrap();
    assert_eq!(
        lines(&log),
        [
            "setup a#1 after []",
            "setup b#1 after [\"a#1\"]",
            "setup c#1 after [\"a#1\", \"b#1\"]"
        ]
    );
    let children = t.supervisor().unwrap().send(WhichChildren).await.unwrap();
    let ids: Vec<_> = children.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(children.iter().all(|c| c.running));

    // b's resource fails: c and b go (reverse), then b and c come back; a is kept.
    kill.send_replace(1);
    until("c#2", || {
        t.resources(|r| r.get::<String>("c").ok().cloned()) == Some("c#2".into())
    })
    .await;
    let after: Vec<String> = lines(&log)[3..].to_vec();
    assert_eq!(
        after,
        [
            "teardown b#1",
            "teardown c#1",
            "setup b#2 after [\"a#1\"]",
            "setup c#2 after [\"a#1\", \"b#2\"]"
        ]
    );
    let stages = t.stages();
    assert_eq!(
        stages
            .iter()
            .map(|s| (s.name, s.restarts))
            .collect::<Vec<_>>(),
        [("a", 0), ("b", 1), ("c", 1)]
    );
    assert!(stages.iter().all(|s| s.status == StageStatus::Ready));
    assert!(stages.iter().all(|s| s.setup_seconds.is_some()));

    // A second restart is within the intensity; the third failure is not.
    kill.send_replace(2);
    until("c#3", || {
        t.resources(|r| r.get::<String>("c").ok().cloned()) == Some("c#3".into())
    })
    .await;
    kill.send_replace(3);
    let reason = exit_rx
        .wait_for(Option::is_some)
        .await
        .unwrap()
        .clone()
        .unwrap();
    assert!(
        matches!(reason, ExitReason::Failed(ref e) if e.contains("restart intensity")),
        "{reason:?}"
    );
    let tail: Vec<String> = lines(&log).iter().rev().take(3).rev().cloned().collect();
    assert_eq!(
        tail,
        ["teardown b#3", "teardown c#3", "teardown a#1"],
        "everything released, in reverse"
    );
    assert!(t.stages().iter().all(|s| s.status != StageStatus::Ready));
    t.teardown().await;
    assert_eq!(
        lines(&log)
            .iter()
            .filter(|l| l.starts_with("teardown a"))
            .count(),
        1
    );
}

#[actix_rt::test]
async fn a_failed_initial_setup_names_its_stage_and_teardown_releases_the_rest() {
    let log = Log::default();
    let mut t = StageTree::builder("k")
        .stage(stage("a", &log), |_| Ok(vec![]))
        .stage(
            Counted {
                name: "b",
                log: log.clone(),
                fail_setup: true,
            },
            |_| Ok(vec![]),
        )
        .stage(stage("c", &log), |_| Ok(vec![]))
        .build();
    t.start(|_| ());
    let err = t.ready().await.unwrap_err();
    assert_eq!(err.failed.stage, "b");
    assert!(err.to_string().contains("refused"), "{err}");
    assert_eq!(t.teardown().await, ExitReason::Shutdown);
    assert_eq!(lines(&log), ["setup a#1 after []", "teardown a#1"]);
    let statuses: Vec<_> = t.stages().iter().map(|s| s.status).collect();
    assert_eq!(
        statuses,
        [
            StageStatus::Stopped,
            StageStatus::Failed,
            StageStatus::Stopped
        ]
    );
}

#[actix_rt::test]
async fn detach_keeps_the_resources_and_rebuild_adopts_them_without_a_setup() {
    let log = Log::default();
    let (_kill, killed) = watch::channel(0u32);
    let mut t = tree(&log, killed.clone(), Intensity::new(1, 5)).build();
    t.start(|_| ());
    t.ready().await.unwrap();
    let kept = t.detach().await;
    assert_eq!(kept.stages().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert!(lines(&log).iter().all(|l| !l.starts_with("teardown")));
    assert!(t.stages().iter().all(|s| s.status == StageStatus::Detached));

    let existing = Detached::new()
        .with("a", kept.get::<String>("a").unwrap().clone())
        .with("b", kept.get::<String>("b").unwrap().clone())
        .with("c", kept.get::<String>("c").unwrap().clone());
    let mut again = tree(&log, killed.clone(), Intensity::new(1, 5))
        .rebuild(existing)
        .unwrap();
    again.start(|_| ());
    again.ready().await.unwrap();
    assert_eq!(lines(&log).len(), 3, "no stage set up again");
    again.teardown().await;
    assert_eq!(
        lines(&log)[3..],
        ["teardown c#1", "teardown b#1", "teardown a#1"]
    );

    let wrong = Detached::new().with("a", 7u32);
    assert!(tree(&log, killed, Intensity::new(1, 5))
        .rebuild(wrong)
        .is_err());
}
