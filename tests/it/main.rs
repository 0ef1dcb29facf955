//! kernelvisor's integration tests, one binary (`cargo nextest run` gives each test a process of
//! its own; `just test-all` runs it so). One module per former test file; `tests/common` holds
//! what they share. Test groups in `.config/nextest.toml` keep apart what must not run side by
//! side.
//!
//! Tests of different modules run side by side now (two at a time), so what they hold on the
//! host must be theirs alone: agent ids carry a run id, and each module's agent host-port range
//! (`AgentFixture::new(name, lo, len)`, the module doc's "Agent host ports") is distinct from every
//! other module's — pick a free one above the highest in use (36659) for a new module.
//!
//! Why one binary: 43 binaries each linked the whole crate (15 GB, 65–120 s after a one-line
//! change); one links it once (docs/benchmarks.md, "Development").

#[path = "../common/mod.rs"]
mod common;

mod accelerator_placement;
mod accelerators;
mod agent_events;
mod agent_methods_upstream;
mod agent_metrics;
mod agent_restart;
mod api_fuzz;
mod api_tls;
mod backend_docker;
mod bai_calls;
mod bai_compat;
mod bai_events;
mod bai_ext_fuzz;
mod bai_ext_server;
mod bai_halfstack;
mod bai_sidechannels;
mod cluster_kernels;
mod cluster_selector;
mod cluster_sessions;
mod config;
mod console;
mod cordon_drain;
mod ctl_runner;
mod dangling;
mod dev_run;
mod engine_restart;
mod events;
mod exec_streaming;
mod files_direct;
mod gang_restart;
mod grace;
mod ha;
mod image_commit;
mod image_placement;
mod images;
mod interop;
mod kernel_config_upstream;
mod kernel_methods;
mod kernels;
mod manager_intake;
mod manager_scenarios;
mod module_cycles;
mod preemption;
mod queue;
mod readme_tour;
mod reclaim;
mod rpc;
mod runner_kernels;
mod security;
mod services_files;
mod session_commit;
mod stuck_kernels;
mod supervision;
mod swarm_overlay;
mod terminal;
mod trees;
mod workloads;
