//! The agent's metrics: `/metrics` over HTTP parsed as Prometheus text, every Backend.AI
//! family with its labels after a kernel ran, a busy container's CPU from its cgroup files,
//! and a kernel's series gone when it terminates. Real Docker engine, real HTTP.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::time::Duration;

use common::agent::{call, client, create_one, field, kernel_config, map, AgentFixture};
use common::wait_until;
use kernelvisor::agent::Agent;
use kernelvisor::config::OnShutdown;

const MIB: u64 = 1 << 20;

/// `GET /metrics` over plain HTTP/1.0.
async fn scrape(addr: std::net::SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect to /metrics");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        body.to_owned()
    })
    .await
    .unwrap()
}

fn parse(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("valid Prometheus text format")
}

fn labels_of(s: &prometheus_parse::Sample) -> BTreeSet<String> {
    s.labels.keys().filter(|k| *k != "le").cloned().collect()
}

/// The value of the one sample of `metric` whose labels include all of `want`.
fn value(scrape: &prometheus_parse::Scrape, metric: &str, want: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && want.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .find_map(|s| match s.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Untyped(v) => Some(v),
            _ => None,
        })
}

#[actix_rt::test]
async fn busy_kernel_shows_in_seed_metrics_and_its_series_go_when_it_ends() {
    let fx = AgentFixture::new("metrics", 31720, 4);
    let toml = fx.config_toml("") + "[stats]\nnode-interval = 0.5\ncontainer-interval = 1.0\n";
    let path = fx.dir.path().join("agent.toml");
    std::fs::write(&path, toml).unwrap();
    let agent = Agent::start(kernelvisor::config::AgentConfig::load(&path).unwrap(), None)
        .await
        .expect("agent starts (is the Docker engine up?)");
    let peer = client(agent.endpoint()).await;

    // No GPU here: hwinfo says so, and the agent runs on.
    let hw = call(&peer, "gather_hwinfo", vec![]).await.unwrap();
    let has_cuda = hw
        .as_map()
        .unwrap()
        .iter()
        .any(|(k, _)| k.as_str() == Some("cuda"));
    let gpus_here = std::path::Path::new("/dev/nvidiactl").exists();
    assert_eq!(has_cuda, gpus_here, "{hw}");

    // A busy loop in a one-core kernel, and a failing call for the failure counter.
    let kid = format!("k-busy-{}", common::agent::run_id());
    let environ = map(vec![("KERNEL_CMD", "while :; do :; done".into())]);
    let config = kernel_config("1", 64 * MIB, vec![("environ", environ)]);
    let info = create_one(&peer, "s-busy", &kid, config)
        .await
        .expect("create the busy kernel");
    assert_eq!(field(&info, "status").as_str(), Some("RUNNING"));
    let missing = call(
        &peer,
        "destroy_kernel",
        vec!["no-such-kernel".into(), "s".into()],
    )
    .await;
    assert!(missing.is_err());

    // The busy loop shows within a few container intervals, and within its one-core limit.
    // Its share is the machine's to give: on a loaded host (a whole test run on two cores) it
    // gets a fraction of a core, so the floor is what tells it from an idle kernel (0 %), not
    // a share it cannot be promised.
    let addr = agent.metrics_addr();
    let cpu = |s: &prometheus_parse::Scrape| {
        value(
            s,
            "backendai_container_utilization",
            &[
                ("container_metric_name", "cpu_util"),
                ("kernel_id", kid.as_str()),
                ("value_type", "current"),
            ],
        )
    };
    let mut seen = None;
    for _ in 0..100 {
        let s = parse(&scrape(addr).await);
        if let Some(v) = cpu(&s) {
            seen = Some(v);
            if v > 1.0 {
                break;
            }
        }
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let util = seen.expect("cpu_util of the busy kernel within ten seconds");
    assert!(
        util > 1.0 && util < 110.0,
        "busy loop in a one-core kernel at {util}% of one core"
    );
    let text = scrape(addr).await;
    let s = parse(&text);
    // Read from the cgroup files of this host's cgroup version, not Docker's stats API.
    assert!(
        value(
            &s,
            "kernelvisor_container_samples_total",
            &[("source", "cgroup")]
        ) >= Some(2.0),
        "{text}"
    );
    assert_eq!(
        value(
            &s,
            "kernelvisor_container_samples_total",
            &[("source", "engine")]
        ),
        None
    );

    // Every Backend.AI agent metric family, declared and with exactly its labels on every sample.
    let seed: HashMap<&str, &[&str]> = HashMap::from([
        ("backendai_rpc_requests_total", &["method"][..]),
        (
            "backendai_rpc_failure_requests_total",
            &["method", "exception"][..],
        ),
        ("backendai_rpc_request_duration_seconds", &["method"][..]),
        (
            "backendai_container_utilization",
            &[
                "container_metric_name",
                "agent_id",
                "kernel_id",
                "session_id",
                "user_id",
                "project_id",
                "value_type",
            ][..],
        ),
        (
            "backendai_device_utilization",
            &["device_metric_name", "agent_id", "device_id", "value_type"][..],
        ),
        (
            "backendai_sync_container_lifecycle_trigger_count_total",
            &["agent_id"][..],
        ),
        (
            "backendai_sync_container_lifecycle_success_count_total",
            &["agent_id"][..],
        ),
        (
            "backendai_sync_container_lifecycle_failure_count_total",
            &["agent_id", "exception"][..],
        ),
        (
            "backendai_stat_task_trigger_count_total",
            &["agent_id", "stat_scope"][..],
        ),
        (
            "backendai_stat_task_success_count_total",
            &["agent_id", "stat_scope"][..],
        ),
        (
            "backendai_stat_task_failure_count_total",
            &["agent_id", "stat_scope", "exception"][..],
        ),
        ("backendai_agent_heartbeat", &[][..]),
        ("backendai_kernel_count", &[][..]),
    ]);
    for (family, labels) in &seed {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} is not declared:\n{text}"
        );
        let want: BTreeSet<String> = labels.iter().map(|l| l.to_string()).collect();
        for sample in s.samples.iter().filter(|x| {
            x.metric == *family
                || x.metric
                    .strip_prefix(*family)
                    .is_some_and(|r| ["_bucket", "_sum", "_count"].contains(&r))
        }) {
            assert_eq!(labels_of(sample), want, "labels of {sample:?}");
        }
    }
    // The ones a kernel's life must have produced have samples.
    let a = fx.agent_id.as_str();
    assert!(
        value(
            &s,
            "backendai_rpc_requests_total",
            &[("method", "create_kernels")]
        ) >= Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "backendai_rpc_failure_requests_total",
            &[
                ("method", "destroy_kernel"),
                ("exception", "KernelNotFound")
            ]
        ),
        Some(1.0)
    );
    assert!(s.samples.iter().any(
        |x| x.metric == "backendai_rpc_request_duration_seconds_count"
            && x.labels.get("method") == Some("create_kernels")
    ));
    for (metric, vt) in [
        ("cpu_util", "capacity"),
        ("cpu_used", "current"),
        ("mem", "current"),
        ("mem", "capacity"),
        ("net_rx", "current"),
        ("net_tx", "current"),
    ] {
        assert!(
            value(
                &s,
                "backendai_container_utilization",
                &[
                    ("container_metric_name", metric),
                    ("kernel_id", kid.as_str()),
                    ("value_type", vt),
                    ("agent_id", a),
                    ("user_id", "u-1"),
                    ("project_id", "p-1"),
                    ("session_id", "s-busy")
                ]
            )
            .is_some(),
            "{metric}/{vt} of the kernel:\n{text}"
        );
    }
    assert_eq!(
        value(
            &s,
            "backendai_container_utilization",
            &[
                ("container_metric_name", "cpu_util"),
                ("kernel_id", kid.as_str()),
                ("value_type", "capacity")
            ]
        ),
        Some(100.0)
    );
    assert_eq!(
        value(
            &s,
            "backendai_container_utilization",
            &[
                ("container_metric_name", "mem"),
                ("kernel_id", kid.as_str()),
                ("value_type", "capacity")
            ]
        ),
        Some((64 * MIB) as f64)
    );
    assert!(
        value(
            &s,
            "backendai_device_utilization",
            &[
                ("device_metric_name", "mem"),
                ("device_id", "node"),
                ("value_type", "capacity"),
                ("agent_id", a)
            ]
        ) > Some(0.0)
    );
    assert!(value(
        &s,
        "backendai_device_utilization",
        &[
            ("device_metric_name", "cpu_util"),
            ("device_id", "node"),
            ("value_type", "current")
        ]
    )
    .is_some());
    assert!(
        value(
            &s,
            "backendai_stat_task_success_count_total",
            &[("stat_scope", "container"), ("agent_id", a)]
        ) >= Some(1.0)
    );
    assert!(
        value(
            &s,
            "backendai_stat_task_success_count_total",
            &[("stat_scope", "node")]
        ) >= Some(1.0)
    );
    assert!(
        value(
            &s,
            "backendai_sync_container_lifecycle_trigger_count_total",
            &[("agent_id", a)]
        ) >= Some(1.0)
    );
    assert_eq!(value(&s, "backendai_kernel_count", &[]), Some(1.0));
    assert!(s
        .samples
        .iter()
        .any(|x| x.metric == "kernelvisor_stage_duration_seconds_count"
            && x.labels.get("stage") == Some("container")
            && x.labels.get("phase") == Some("setup")));
    assert!(!s
        .samples
        .iter()
        .any(|x| x.metric.starts_with("backendai_device_utilization")
            && x.labels
                .get("device_metric_name")
                .is_some_and(|m| m.starts_with("cuda"))
            && !gpus_here));

    // Destroyed: every series of the kernel goes at once.
    call(
        &peer,
        "destroy_kernel",
        vec![kid.clone().into(), "s-busy".into()],
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the kernel's series disappear",
        || async {
            let text = scrape(addr).await;
            !text.contains(&kid)
        },
    )
    .await;
    let s = parse(&scrape(addr).await);
    assert!(s
        .samples
        .iter()
        .any(|x| x.metric == "kernelvisor_stage_duration_seconds_count"
            && x.labels.get("phase") == Some("teardown")));
    peer.close();
    agent.shutdown(OnShutdown::Terminate).await;
    assert!(fx.containers().is_empty());
}
