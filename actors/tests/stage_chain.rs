//! Stage chains after seed 001: ordered setup fed by earlier outputs, rollback on failure,
//! reverse and idempotent teardown, detach and rebuild, the metrics hook, the Runner actor.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Addr, AsyncContext};
use actors::{
    BoxError, ChildSpec, DetachChain, Detached, Phase, Provisioner, RemoveChild, Runner,
    SetupChain, Stage, StageChain, StageChainBuilder, StageHook, Supervisor, TeardownChain,
};

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, event: String) {
        self.0.lock().unwrap().push(event);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    Works,
    FailsSetup,
    PanicsInSetup,
    FailsTeardown,
    HangsInSetup,
}

/// A provisioner whose resource is `"<name>#<spec>"`, logging every call.
struct Fake {
    name: &'static str,
    log: Log,
    behaviour: Behaviour,
}

impl Provisioner for Fake {
    type Spec = String;
    type Resource = String;

    fn name(&self) -> &'static str {
        self.name
    }

    async fn setup(&self, spec: String) -> Result<String, BoxError> {
        self.log.push(format!("setup {}", self.name));
        tokio::time::sleep(Duration::from_millis(30)).await;
        match self.behaviour {
            Behaviour::FailsSetup => Err(format!("{} is broken", self.name).into()),
            Behaviour::PanicsInSetup => panic!("{} panicked on purpose", self.name),
            Behaviour::HangsInSetup => futures::future::pending().await,
            Behaviour::Works | Behaviour::FailsTeardown => Ok(format!("{}#{spec}", self.name)),
        }
    }

    async fn teardown(&self, resource: String) -> Result<(), BoxError> {
        self.log.push(format!("teardown {resource}"));
        tokio::time::sleep(Duration::from_millis(5)).await;
        if self.behaviour == Behaviour::FailsTeardown {
            return Err("teardown refused".into());
        }
        Ok(())
    }
}

const NAMES: [&str; 5] = ["image", "slots", "ports", "scratch", "container"];

/// The five stages of [`NAMES`]; each spec names the previous stage's resource, so the chain
/// shows what each stage received. Stage `odd` (if any) behaves as told.
fn chain_of(log: &Log, odd: Option<(usize, Behaviour)>) -> StageChainBuilder {
    NAMES
        .iter()
        .enumerate()
        .fold(StageChain::builder(), |builder, (i, &name)| {
            let behaviour = match odd {
                Some((k, b)) if k == i => b,
                _ => Behaviour::Works,
            };
            let provisioner = Fake {
                name,
                log: log.clone(),
                behaviour,
            };
            builder.stage(provisioner, move |earlier| match i {
                0 => Ok("spec".to_owned()),
                _ => Ok(earlier.get::<String>(NAMES[i - 1])?.clone()),
            })
        })
}

fn setups(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| format!("setup {n}")).collect()
}

#[actix_rt::test]
async fn stages_set_up_in_order_each_fed_by_the_earlier_ones() {
    tokio::time::pause();
    let log = Log::default();
    let mut chain = chain_of(&log, None).build();
    chain.setup().await.unwrap();
    assert!(chain.is_ready());
    assert_eq!(log.take(), setups(&NAMES));
    assert_eq!(
        chain.resources().get::<String>("container").unwrap(),
        "container#scratch#ports#slots#image#spec"
    );
    let wrong_type = chain.resources().get::<u32>("ports").unwrap_err();
    assert_eq!(
        wrong_type.to_string(),
        "no `u32` resource from stage `ports`"
    );
}

#[actix_rt::test]
async fn a_failure_at_each_stage_tears_down_exactly_the_earlier_stages_in_reverse() {
    tokio::time::pause();
    for k in 0..NAMES.len() {
        let log = Log::default();
        let mut chain = chain_of(&log, Some((k, Behaviour::FailsSetup))).build();
        let err = chain.setup().await.unwrap_err();
        assert_eq!(
            err.failed.stage, NAMES[k],
            "the error names the failing stage"
        );
        assert_eq!(err.failed.phase, Phase::Setup);
        assert!(
            err.to_string().contains(&format!("stage `{}`", NAMES[k])),
            "{err}"
        );
        assert!(err.rollback.is_empty());

        let mut expected = setups(&NAMES[..=k]);
        let mut resource = "spec".to_owned();
        let mut held = Vec::new();
        for name in &NAMES[..k] {
            resource = format!("{name}#{resource}");
            held.push(format!("teardown {resource}"));
        }
        expected.extend(held.into_iter().rev());
        assert_eq!(log.take(), expected, "failure at stage {k}");
        assert!(
            chain.resources().get::<String>(NAMES[0]).is_err(),
            "nothing is held"
        );

        chain.teardown().await.unwrap();
        assert_eq!(
            log.take(),
            Vec::<String>::new(),
            "a teardown after the rollback does nothing"
        );
    }
}

#[actix_rt::test]
async fn teardown_runs_in_reverse_and_a_second_teardown_is_harmless() {
    tokio::time::pause();
    let log = Log::default();
    let mut chain = chain_of(&log, None).build();
    chain.setup().await.unwrap();
    log.take();
    chain.teardown().await.unwrap();
    let torn: Vec<String> = log
        .take()
        .iter()
        .map(|e| e.split('#').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        torn,
        [
            "teardown container",
            "teardown scratch",
            "teardown ports",
            "teardown slots",
            "teardown image"
        ]
    );
    chain.teardown().await.unwrap();
    assert_eq!(log.take(), Vec::<String>::new());
}

#[actix_rt::test]
async fn teardown_after_an_interrupted_setup_releases_only_what_was_set_up() {
    tokio::time::pause();
    let log = Log::default();
    let mut chain = chain_of(&log, Some((3, Behaviour::HangsInSetup))).build();
    // The setup is abandoned while stage 3 (scratch) is in progress, as when its owner dies.
    let interrupted = tokio::time::timeout(Duration::from_secs(1), chain.setup()).await;
    assert!(interrupted.is_err());
    assert_eq!(log.take(), setups(&NAMES[..4]));
    chain.teardown().await.unwrap();
    assert_eq!(
        log.take(),
        [
            "teardown ports#slots#image#spec",
            "teardown slots#image#spec",
            "teardown image#spec"
        ]
    );
    chain.teardown().await.unwrap();
    assert_eq!(log.take(), Vec::<String>::new());
}

#[actix_rt::test]
async fn a_panicking_provisioner_is_a_named_setup_failure_with_rollback() {
    tokio::time::pause();
    let log = Log::default();
    let mut chain = chain_of(&log, Some((2, Behaviour::PanicsInSetup))).build();
    let err = chain.setup().await.unwrap_err();
    assert_eq!(err.failed.stage, "ports");
    assert!(err
        .failed
        .source
        .to_string()
        .contains("panicked on purpose"));
    assert_eq!(
        log.take()[3..],
        ["teardown slots#image#spec", "teardown image#spec"]
    );
}

#[actix_rt::test]
async fn a_spec_that_cannot_be_built_fails_its_stage() {
    let log = Log::default();
    let mut chain = StageChain::builder()
        .stage(
            Fake {
                name: "image",
                log: log.clone(),
                behaviour: Behaviour::Works,
            },
            |_| Ok("spec".into()),
        )
        .stage(
            Fake {
                name: "container",
                log: log.clone(),
                behaviour: Behaviour::Works,
            },
            |earlier| {
                Ok(earlier.get::<String>("ports")?.clone()) // no such stage before it
            },
        )
        .build();
    let err = chain.setup().await.unwrap_err();
    assert_eq!(err.failed.stage, "container");
    assert!(err.failed.source.to_string().contains("stage `ports`"));
    assert_eq!(log.take(), ["setup image", "teardown image#spec"]);
}

#[actix_rt::test]
async fn teardown_failures_are_reported_and_the_rest_still_torn_down() {
    tokio::time::pause();
    let log = Log::default();
    let mut chain = chain_of(&log, Some((1, Behaviour::FailsTeardown))).build();
    chain.setup().await.unwrap();
    log.take();
    let err = chain.teardown().await.unwrap_err();
    assert_eq!(err.errors.len(), 1);
    assert_eq!(
        (err.errors[0].stage, err.errors[0].phase),
        ("slots", Phase::Teardown)
    );
    assert_eq!(log.take().len(), 5, "every stage was torn down");
    chain.teardown().await.unwrap();
    assert_eq!(
        log.take(),
        Vec::<String>::new(),
        "a failed teardown is never retried"
    );
}

#[actix_rt::test]
async fn detach_leaves_every_resource_and_a_rebuilt_chain_tears_them_down() {
    tokio::time::pause();
    let log = Log::default();
    let mut chain = chain_of(&log, None).build();
    chain.setup().await.unwrap();
    log.take();

    let detached = chain.detach();
    assert_eq!(detached.stages().collect::<Vec<_>>(), NAMES);
    assert_eq!(
        detached.get::<String>("ports").unwrap(),
        "ports#slots#image#spec"
    );
    chain.teardown().await.unwrap();
    drop(chain);
    assert_eq!(log.take(), Vec::<String>::new(), "nothing was released");

    // Recovery: a new chain of the same shape owns them again and releases them in reverse.
    let mut rebuilt = chain_of(&log, None).rebuild(detached).unwrap();
    assert!(rebuilt.is_ready());
    rebuilt.setup().await.unwrap();
    assert_eq!(
        log.take(),
        Vec::<String>::new(),
        "adopted stages are not set up again"
    );
    rebuilt.teardown().await.unwrap();
    let torn: Vec<String> = log
        .take()
        .iter()
        .map(|e| e.split('#').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        torn,
        [
            "teardown container",
            "teardown scratch",
            "teardown ports",
            "teardown slots",
            "teardown image"
        ]
    );
}

#[actix_rt::test]
async fn recovery_from_known_resources_finishes_the_missing_stages() {
    tokio::time::pause();
    let log = Log::default();
    // What the store remembers: the first two stages; the rest never finished.
    let known = Detached::new()
        .with("image", "image#old".to_owned())
        .with("slots", "slots#old".to_owned());
    let mut chain = chain_of(&log, None).rebuild(known).unwrap();
    chain.setup().await.unwrap();
    assert_eq!(log.take(), setups(&NAMES[2..]));
    assert_eq!(
        chain.resources().get::<String>("ports").unwrap(),
        "ports#slots#old"
    );

    let wrong = chain_of(&log, None)
        .rebuild(Detached::new().with("ports", 7u16))
        .unwrap_err();
    assert_eq!((wrong.stage, wrong.phase), ("ports", Phase::Adopt));
    let unknown = chain_of(&log, None)
        .rebuild(Detached::new().with("gpu", 0u8))
        .unwrap_err();
    assert_eq!((unknown.stage, unknown.phase), ("gpu", Phase::Adopt));
}

/// Records every hook call as (phase, stage, duration in ms, ok).
#[derive(Default)]
struct Recorder(Mutex<Vec<(&'static str, &'static str, u128, bool)>>);

impl StageHook for Recorder {
    fn on_setup(&self, stage: &'static str, duration: Duration, result: Result<(), &BoxError>) {
        self.0
            .lock()
            .unwrap()
            .push(("setup", stage, duration.as_millis(), result.is_ok()));
    }

    fn on_teardown(&self, stage: &'static str, duration: Duration, result: Result<(), &BoxError>) {
        self.0
            .lock()
            .unwrap()
            .push(("teardown", stage, duration.as_millis(), result.is_ok()));
    }
}

#[actix_rt::test]
async fn every_stage_reports_durations_and_failures_to_the_hook() {
    tokio::time::pause();
    let hook = Arc::new(Recorder::default());
    let mut chain = chain_of(&Log::default(), Some((2, Behaviour::FailsSetup)))
        .hook(hook.clone())
        .build();
    chain.setup().await.unwrap_err();
    let expected = [
        ("setup", "image", 30, true),
        ("setup", "slots", 30, true),
        ("setup", "ports", 30, false),
        ("teardown", "slots", 5, true),
        ("teardown", "image", 5, true),
    ];
    let calls = hook.0.lock().unwrap().clone();
    assert_eq!(calls.len(), expected.len());
    for (call, want) in calls.iter().zip(expected) {
        assert_eq!((call.0, call.1, call.3), (want.0, want.1, want.3));
        // Paused time: the provisioner's sleep exactly, give or take the timer's 1 ms tick.
        assert!((want.2..=want.2 + 1).contains(&call.2), "{call:?}");
    }
}

#[actix_rt::test]
async fn a_single_stage_owns_one_resource() {
    let log = Log::default();
    let mut stage = Stage::new(Fake {
        name: "ports",
        log: log.clone(),
        behaviour: Behaviour::Works,
    });
    assert_eq!(stage.setup("a".into()).await.unwrap(), "ports#a");
    let again = stage.setup("b".into()).await.unwrap_err();
    assert_eq!(again.phase, Phase::Setup, "one resource at a time");
    assert_eq!(stage.detach().as_deref(), Some("ports#a"));
    stage.teardown().await.unwrap();
    stage.adopt("ports#z".into()).unwrap();
    stage.teardown().await.unwrap();
    stage.teardown().await.unwrap();
    assert_eq!(log.take(), ["setup ports", "teardown ports#z"]);
}

/// A runner under a supervisor, its address published by the factory as an agent would.
fn supervised_runner(log: &Log, slot: &Arc<Mutex<Option<Addr<Runner>>>>) -> ChildSpec {
    let (log, slot) = (log.clone(), slot.clone());
    ChildSpec::actor("kernel-1", move |ctx, exit| {
        *slot.lock().unwrap() = Some(ctx.address());
        Runner::new(chain_of(&log, None).build()).with_exit(exit)
    })
    .shutdown(actors::Shutdown::millis(10_000))
}

#[actix_rt::test]
async fn a_runner_tears_its_chain_down_when_its_supervisor_removes_it() {
    tokio::time::pause();
    let log = Log::default();
    let slot = Arc::default();
    let registry = Supervisor::build("kernels")
        .child(supervised_runner(&log, &slot))
        .start();
    let runner = slot.lock().unwrap().clone().unwrap();
    runner.send(SetupChain).await.unwrap().unwrap();
    assert_eq!(log.take(), setups(&NAMES));

    let reason = registry
        .addr()
        .send(RemoveChild("kernel-1".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reason, Some(actors::ExitReason::Shutdown));
    assert_eq!(
        log.take().len(),
        5,
        "all five stages torn down before the reply"
    );
    assert!(!runner.connected());
}

#[actix_rt::test]
async fn a_detached_runner_stops_without_teardown() {
    tokio::time::pause();
    let log = Log::default();
    let runner = Runner::new(chain_of(&log, None).build()).start();
    runner.send(SetupChain).await.unwrap().unwrap();
    runner.send(TeardownChain).await.unwrap().unwrap();
    runner.send(SetupChain).await.unwrap().unwrap();
    log.take();
    let detached = runner.send(DetachChain).await.unwrap();
    assert_eq!(detached.stages().count(), 5);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!runner.connected(), "the runner stopped");
    assert_eq!(log.take(), Vec::<String>::new(), "and released nothing");

    // The next agent adopts the resources in a new runner, which releases them on stop.
    let rebuilt = Runner::new(chain_of(&log, None).rebuild(detached).unwrap()).start();
    rebuilt.send(TeardownChain).await.unwrap().unwrap();
    assert_eq!(log.take().len(), 5);
}
