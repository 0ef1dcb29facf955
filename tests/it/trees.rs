//! The supervision trees drawn in the module docs of `src/agent/mod.rs`,
//! `src/agent/kernel/mod.rs` and `src/manager/mod.rs` are the trees that run: each test starts
//! the real thing (an agent on the dummy backend, a kernel on it, a manager on SQLite), asks its
//! supervisor `WhichChildren`, and compares the ids in order with the ```text drawing parsed
//! from the source file.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use actors::WhichChildren;
use common::agent::{client, create_one, free_port, kernel_config, run_id, AgentFixture};
use kernelvisor::agent::backend::dummy::{DummyBackend, DummyDelays};
use kernelvisor::agent::backend::ContainerBackend;
use kernelvisor::agent::registry::KernelStages;
use kernelvisor::agent::Agent;
use kernelvisor::config::{AgentConfig, ManagerConfig, OnShutdown};
use kernelvisor::manager::Manager;

/// One top-level child of a drawn tree.
#[derive(Debug)]
struct Drawn {
    id: String,
    /// Inside a `┐ … ┘` bracket (or marked `┤`): started only under a condition the drawing
    /// names.
    conditional: bool,
    /// The config sections its bracket line names (`[manager]`, `[redis]`): started when any
    /// of them is configured (the previous line's when this one names none).
    sections: Vec<String>,
}

impl Drawn {
    /// Whether it runs with the `configured` sections.
    fn runs_with(&self, configured: &[&str]) -> bool {
        !self.conditional
            || self
                .sections
                .iter()
                .any(|s| configured.contains(&s.as_str()))
    }
}

/// The root's direct children in the first ```text block of the module doc of `file`
/// (relative to the crate root): lines `//! ├─ id …` or `//! └─ id …`, in order.
fn drawn_tree(file: &str) -> (String, Vec<Drawn>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let source = std::fs::read_to_string(&path).unwrap();
    let mut lines = source
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .skip_while(|l| l.trim() != "```text")
        .skip(1)
        .take_while(|l| l.trim() != "```");
    let root = lines
        .next()
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("{file}: no ```text tree in the module doc"))
        .to_owned();
    let mut children = Vec::new();
    let mut bracket = false;
    for line in lines {
        let Some(rest) = line
            .strip_prefix("├─ ")
            .or_else(|| line.strip_prefix("└─ "))
        else {
            continue;
        };
        let opens = line.contains('┐');
        // `┤ with [section]`: one conditional child, a bracket of one line.
        let single = line.contains('┤');
        let conditional = bracket || opens || single;
        let mut sections: Vec<String> = match line.rfind(['┐', '│', '┘', '┤']) {
            Some(at) if conditional => line[at..]
                .split('[')
                .skip(1)
                .filter_map(|t| t.split_once(']').map(|(name, _)| name.to_owned()))
                .collect(),
            _ => Vec::new(),
        };
        if conditional && sections.is_empty() {
            sections = children
                .last()
                .map(|c: &Drawn| c.sections.clone())
                .unwrap_or_default();
        }
        children.push(Drawn {
            id: rest.split_whitespace().next().unwrap().to_owned(),
            conditional,
            sections,
        });
        bracket = (bracket || opens) && !line.contains('┘');
    }
    assert!(!children.is_empty(), "{file}: the tree has no children");
    (root, children)
}

async fn running(supervisor: &actix::Addr<actors::Supervisor>) -> Vec<String> {
    let children = supervisor.send(WhichChildren).await.unwrap();
    assert!(children.iter().all(|c| c.running), "{children:?}");
    children.into_iter().map(|c| c.id).collect()
}

fn agent_config(fx: &AgentFixture, manager: bool) -> AgentConfig {
    agent_config_with(fx, manager, false)
}

fn agent_config_with(fx: &AgentFixture, manager: bool, redis: bool) -> AgentConfig {
    let mut toml = fx.config_toml("backend = \"dummy\"\n");
    if manager {
        toml += &format!(
            "[manager]\nevent-addr = {{ host = \"127.0.0.1\", port = {} }}\n",
            free_port()
        );
    }
    if redis {
        // Nothing listens there: the bus sender keeps its events and retries.
        toml += &format!(
            "[redis]\naddr = {{ host = \"127.0.0.1\", port = {} }}\n",
            free_port()
        );
    }
    let path = fx.dir.path().join("agent.toml");
    std::fs::write(&path, toml).unwrap();
    AgentConfig::load(&path).unwrap()
}

#[actix_rt::test]
async fn the_agent_tree_is_the_drawn_one() {
    let (root, drawn) = drawn_tree("src/agent/mod.rs");
    assert_eq!(root, "agent");
    for (manager, redis) in [(true, true), (true, false), (false, true), (false, false)] {
        let fx = AgentFixture::new("trees", 30_980, 4);
        let dummy =
            Arc::new(DummyBackend::new(DummyDelays::default())) as Arc<dyn ContainerBackend>;
        let agent = Agent::start(agent_config_with(&fx, manager, redis), Some(dummy))
            .await
            .unwrap();
        let configured: Vec<&str> = [("manager", manager), ("redis", redis)]
            .into_iter()
            .filter_map(|(s, on)| on.then_some(s))
            .collect();
        let expected: Vec<&str> = drawn
            .iter()
            .filter(|c| c.runs_with(&configured))
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(
            running(&agent.supervisor()).await,
            expected,
            "with [manager]: {manager}, with [redis]: {redis}"
        );
        agent.shutdown(OnShutdown::Preserve).await;
    }
}

#[actix_rt::test]
async fn the_kernel_tree_is_the_drawn_one() {
    let (root, drawn) = drawn_tree("src/agent/kernel/mod.rs");
    assert_eq!(root, "Kernel");
    let fx = AgentFixture::new("trees-kernel", 30_990, 4);
    let dummy = Arc::new(DummyBackend::new(DummyDelays::default())) as Arc<dyn ContainerBackend>;
    let agent = Agent::start(agent_config(&fx, false), Some(dummy))
        .await
        .unwrap();
    let peer = client(agent.endpoint()).await;
    let kid = format!("k-tree-{}", run_id());
    create_one(
        &peer,
        "s-tree",
        &kid,
        kernel_config("0.1", 32 << 20, vec![]),
    )
    .await
    .unwrap();
    let stages = agent
        .registry()
        .send(KernelStages(kid))
        .await
        .unwrap()
        .expect("a running kernel has a stage supervisor");
    let expected: Vec<&str> = drawn.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(running(&stages).await, expected);
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn the_manager_tree_is_the_drawn_one() {
    let (root, drawn) = drawn_tree("src/manager/mod.rs");
    assert_eq!(root, "manager");
    assert!(drawn.iter().all(|c| !c.conditional));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let text = format!(
        "[manager]\nevent-listen-addr = {{ host = \"127.0.0.1\", port = {} }}\n\
         [store]\nurl = \"sqlite://{d}/m.db\"\n\
         [api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {} }}\nworkers = 1\nadmin-token-file = \"{d}/admin-token\"\n\
         [logging]\nlevel = \"warn\"\n",
        free_port(),
        free_port(),
    );
    std::fs::write(dir.path().join("m.toml"), text).unwrap();
    let config = ManagerConfig::load(&dir.path().join("m.toml")).unwrap();
    let manager = Manager::start(&config).await.unwrap();
    let expected: Vec<&str> = drawn.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(running(&manager.supervisor()).await, expected);
    manager.stop().await;
}
