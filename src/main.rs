//! The `kernelvisor` binary: `agent`, `manager`, `keygen`, `ctl`, `completions`.

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

use kernelvisor::config::{AgentConfig, ManagerConfig};
use kernelvisor::rpc::curve::{write_certificates, KeyPair};

/// Node agent and control plane for running compute kernels on GPU clusters.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent daemon on this node.
    Agent {
        /// Path of agent.toml.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Run the manager.
    Manager {
        /// Path of manager.toml.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Write a CURVE key pair as DIR/NAME.key and DIR/NAME.key_secret (zmq.auth format).
    Keygen {
        /// Base name of the certificate files.
        name: String,
        /// Directory to write into (created if missing).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Talk to a running manager over its HTTP API (agents, sessions, access keys, health).
    Ctl(kernelvisor::ctl::CtlArgs),
    /// Print a shell completion script to stdout (`kernelvisor completions bash >
    /// /etc/bash_completion.d/kernelvisor`; zsh: a file named `_kernelvisor` in `$fpath`; fish:
    /// `~/.config/fish/completions/kernelvisor.fish`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Agent { config } => {
            let config = AgentConfig::load(&config)?;
            config.logging.init()?;
            // Kernels' streams, logs and services each hold descriptors; take what is allowed.
            match kernelvisor::limits::raise_open_files() {
                Ok((soft, _)) => tracing::debug!(soft, "open-file limit"),
                Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
            }
            actix_rt::System::new().block_on(kernelvisor::agent::run(config))
        }
        Command::Manager { config } => {
            let config = ManagerConfig::load(&config)?;
            config.logging.init()?;
            actix_rt::System::new().block_on(kernelvisor::manager::run(config))
        }
        Command::Keygen { name, dir } => {
            let (public, secret) = write_certificates(&dir, &name, &KeyPair::generate()?)?;
            println!("{}\n{}", public.display(), secret.display());
            Ok(())
        }
        Command::Ctl(args) => std::process::exit(kernelvisor::ctl::run(args)?),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "kernelvisor", &mut script);
            // `| head` closing the pipe early is no error.
            match std::io::Write::write_all(&mut std::io::stdout(), &script) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
                _ => Ok(()),
            }
        }
    }
}
