//! The policies a command works with: the built-in presets plus `--policies FILE`.

use std::path::Path;

use anyhow::Context;
use redrive_policy::PolicySet;

use crate::args::Global;
use crate::error::usage;

/// Loads the presets and, if given, the global `--policies` file.
pub(crate) fn load(global: &Global) -> anyhow::Result<PolicySet> {
    match &global.policies {
        Some(path) => load_file(path),
        None => Ok(PolicySet::builtin()),
    }
}

/// Loads the presets plus one TOML file. A file that cannot be read is a runtime error; one that
/// is invalid is a usage error naming the field.
pub(crate) fn load_file(path: &Path) -> anyhow::Result<PolicySet> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    PolicySet::from_toml(&text).map_err(|e| usage(format!("{}: {e}", path.display())))
}
