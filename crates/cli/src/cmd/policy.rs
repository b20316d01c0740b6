//! `redrive policy show`.

use std::process::ExitCode;

use crate::args::{Global, PolicyCommand};

pub(crate) fn run(_global: &Global, cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::Show(_args) => Err(anyhow::anyhow!("`redrive policy show` is not available in this build yet")),
    }
}
