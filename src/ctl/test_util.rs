//! Helpers shared by ctl's unit tests: parsing a command line as `kernelvisor ctl` does.

use clap::Parser;

use super::{AccessKeyCommand, CtlArgs, CtlCommand};

// No doc comment: clap would take it as the about of `ctl` (it takes `CtlArgs`' instead).
#[derive(Parser)]
pub struct Cli {
    #[command(flatten)]
    pub ctl: CtlArgs,
}

/// Parses `kernelvisor ctl ARGS…`.
pub fn parse(args: &[&str]) -> Result<CtlArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("ctl").chain(args.iter().copied())).map(|c| c.ctl)
}

/// Output captured from a writer, as text.
pub fn text(buf: Vec<u8>) -> String {
    String::from_utf8(buf).unwrap()
}

/// Parses `access-key ARGS…`.
pub fn key_command(args: &[&str]) -> AccessKeyCommand {
    match parse(&[&["access-key"][..], args].concat())
        .unwrap()
        .command
    {
        CtlCommand::AccessKey(c) => c,
        other => panic!("{other:?}"),
    }
}
