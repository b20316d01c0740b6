//! The `redrive` binary: the queue, the workers, the service, the PSP
//! simulator and the tuning tools, behind one command.
//!
//! Exit codes: 0 on success, 2 on a usage error, 1 on any other error, with a
//! one-line message on stderr (secrets redacted). A closed stdout (`| head`) ends a command
//! quietly with 0. Log lines (stderr) are text coloured only when stderr is a terminal, or JSON
//! with `--log-format json`; with the `otel` feature spans are exported over OTLP.

use std::process::ExitCode;

use clap::Parser;

mod args;
mod clock;
mod cmd;
mod diff;
mod error;
mod out;
mod policies;
mod policy_watch;
mod telemetry;

use args::{Cli, Command};
use error::UsageError;

/// mimalloc instead of the system allocator: a worker with thousands of jobs in flight
/// allocates and frees a few dozen small objects per job from two threads, and glibc's
/// allocator spent a fifth of its CPU on that (`docs/benchmarks.md`, issue 21). It keeps
/// more memory resident; build with `--no-default-features` for the system allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and errors to stderr (exit 2).
            let code = e.exit_code();
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
            } else {
                // One line, as the contract says: clap's message up to its usage hint.
                let text = e.render().to_string();
                let msg: Vec<&str> = text
                    .lines()
                    .take_while(|l| {
                        !l.starts_with("Usage:") && !l.starts_with("For more information")
                    })
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect();
                let msg = redrive_http::redact::redact_text(&msg.join(" "));
                eprintln!("redrive: {}", msg.trim_start_matches("error: "));
            }
            return ExitCode::from(code as u8);
        }
    };
    // Logs (breaker transitions, dead jobs, store trouble) to stderr; RUST_LOG overrides.
    // The demo draws a progress bar there, so it only shows errors by default.
    let default = if matches!(cli.command, args::Command::Demo(_)) {
        "error"
    } else {
        "warn"
    };
    redrive_http::redact::add_secret_names(&cli.global.redact);
    let _telemetry = telemetry::init(telemetry::LogFormat::parse(&cli.global.log_format), default);
    match run(cli) {
        Ok(code) => code,
        Err(err) if out::is_closed_stdout(&err) => ExitCode::SUCCESS,
        Err(err) => {
            let usage = err.downcast_ref::<UsageError>().is_some();
            eprintln!("redrive: {}", one_line(&err));
            if usage {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

/// The error and its causes on one line, each cause printed once, secrets redacted.
///
/// The workspace's own errors state each cause once, but `sqlx`'s messages embed their
/// source's text and also return it as the source (e.g. `error returned from database: {0}`
/// over the server's error), so a cause already in the line is skipped.
fn one_line(err: &anyhow::Error) -> String {
    let mut out = err.to_string();
    for cause in err.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    redrive_http::redact::redact_text(&out.replace('\n', " "))
}

/// `url` with redrive's parameter `name` set to `value` (`--db-pool`, `--listen-db`); SQLite
/// URLs are left as they are (one file, no server connections).
fn with_param(url: &str, name: &str, value: &str) -> String {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return url.to_owned();
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let prefix = format!("{name}=");
    let mut params: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with(&prefix))
        .map(str::to_owned)
        .collect();
    params.push(format!("{name}={value}"));
    format!("{base}?{}", params.join("&"))
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut global = cli.global;
    if let Some(n) = global.db_pool {
        global.db = with_param(&global.db, "pool_size", &n.to_string());
    }
    if let Some(listen) = &global.listen_db {
        let value = if listen == "off" {
            "off".to_owned()
        } else {
            redrive_store::percent_encode(listen)
        };
        global.db = with_param(&global.db, "listen", &value);
    }
    match cli.command {
        Command::Policy(cmd) => cmd::policy::run(&global, cmd),
        Command::Simulate(args) => cmd::simulate::run(&global, args),
        Command::Migrate => cmd::queue::migrate(&global),
        Command::Work(a) => cmd::work::run(&global, a),
        Command::Enqueue(a) => cmd::queue::enqueue(&global, a),
        Command::Jobs(a) => cmd::queue::jobs(&global, a),
        Command::Show(a) => cmd::queue::show(&global, a),
        Command::Dead(c) => cmd::queue::dead(&global, c),
        Command::Cancel(a) => cmd::operator::cancel(&global, a),
        Command::Stats(a) => cmd::queue::stats(&global, a),
        Command::Workers(a) => cmd::queue::workers(&global, a),
        Command::Breakers(a) => cmd::operator::breakers(&global, a),
        Command::Bench(a) => cmd::bench::run(&global, a),
        Command::PspSim(args) => cmd::psp_sim::run(&global, args),
        Command::Demo(a) => cmd::demo::run(&global, a),
        Command::Serve(a) => cmd::serve::run(&global, a),
        Command::Idempotency(c) => cmd::idempotency::run(&global, c),
        Command::Prune(a) => cmd::schedule::prune(&global, a),
        Command::Schedule(c) => cmd::schedule::run(&global, c),
        Command::Queue(c) => cmd::operator::queue(&global, c),
        Command::Dependency(c) => cmd::operator::dependency(&global, c),
        Command::RunNow(a) => cmd::operator::run_now(&global, a),
        Command::Audit(a) => cmd::operator::audit(&global, a),
        Command::Quota(c) => cmd::quota::run(&global, c),
    }
}
