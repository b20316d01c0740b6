//! Writing to stdout without panicking when the reader goes away (`redrive jobs | head -1`):
//! a closed pipe ends the command quietly with exit 0, as other Unix tools do.

use std::io::Write;

/// Stdout was closed by its reader: the command stops, quietly, successfully.
#[derive(Debug, thiserror::Error)]
#[error("stdout closed")]
pub(crate) struct StdoutClosed;

/// Writes to stdout; a closed pipe is [`StdoutClosed`].
pub(crate) fn write(args: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
    }
}

/// Whether an error is (or was caused by) a closed stdout.
pub(crate) fn is_closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<StdoutClosed>()
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` that returns [`StdoutClosed`] (with `?`) instead of panicking.
macro_rules! outln {
    () => {
        $crate::out::write(format_args!("\n"))?
    };
    ($($t:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($t)*)))?
    };
}

/// `print!` that returns [`StdoutClosed`] (with `?`) instead of panicking.
macro_rules! out {
    ($($t:tt)*) => {
        $crate::out::write(format_args!($($t)*))?
    };
}

pub(crate) use {out, outln};
