//! `redrive simulate`: the thundering-herd simulator, as a table, CSV, JSON and a chart.

use crate::out::{out, outln};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redrive_sim::{
    CapacityConfig, Model, OccConfig, Outage, Overload, SimError, Strategy, SweepConfig,
};

use crate::args::{Global, SimulateArgs, parse_duration};
use crate::error::usage;

pub(crate) fn run(global: &Global, args: SimulateArgs) -> anyhow::Result<ExitCode> {
    if let Some(name) = &args.scenario {
        return crate::cmd::simulate_demo::run(global, &args, name);
    }
    // A named policy runs the `fleet` scenario with it.
    if args.policy.is_some() {
        let mut args = args;
        if args.model.trim() == "occ" {
            // The default model: a named policy is a run of the queue model.
            args.model = "capacity".into();
        }
        return crate::cmd::simulate_demo::run(global, &args, "fleet");
    }
    if args.dependency.is_some() {
        return Err(usage("--dependency applies to --scenario fleet only"));
    }
    if args.error_rate.is_some() {
        return Err(usage("--error-rate applies to --scenario fleet only"));
    }
    let cfg = resolve(&args)?;
    let bar = progress(&cfg);
    let report = redrive_sim::sweep(&cfg, &|n| bar.inc(n)).map_err(sim_error)?;
    bar.finish_and_clear();

    if let Some(path) = &args.csv {
        std::fs::write(path, redrive_sim::to_csv(&report))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        redrive_sim::plot(&report, path)?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", redrive_sim::render_table(&report));
        if let Some(path) = &args.csv {
            outln!("wrote {}", path.display());
        }
        if let Some(path) = &args.plot {
            outln!("wrote {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A bar on stderr for sweeps of many runs, hidden when stderr is not a terminal.
fn progress(cfg: &SweepConfig) -> ProgressBar {
    let total = cfg.total_runs();
    if !std::io::stderr().is_terminal() || total < 200 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("simulating {bar:40} {pos}/{len} runs {eta}") {
        bar.set_style(style);
    }
    bar
}

/// Refused input is a usage error (exit 2); anything else is not.
fn sim_error(e: SimError) -> anyhow::Error {
    match e {
        SimError::InvalidStrategy { .. } | SimError::InvalidConfig { .. } => usage(e.to_string()),
        other => other.into(),
    }
}

/// Refuses a `--plot` file that is neither `.svg` nor `.png`.
pub(crate) fn check_plot(plot: Option<&std::path::Path>) -> anyhow::Result<()> {
    if let Some(p) = plot {
        let ext = p
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        if !matches!(ext.as_deref(), Some("svg" | "png")) {
            return Err(usage(format!(
                "invalid --plot {}: the file must end in .svg or .png",
                p.display()
            )));
        }
    }
    Ok(())
}

fn resolve(a: &SimulateArgs) -> anyhow::Result<SweepConfig> {
    let clients = parse_clients(a.clients.as_deref().unwrap_or("100"))?;
    check_plot(a.plot.as_deref())?;
    let model = match a.model.trim() {
        "occ" => {
            let capacity_only = [
                (a.capacity.is_some(), "--capacity"),
                (a.burst.is_some(), "--burst"),
                (a.overload.is_some(), "--overload"),
                (a.retry_after.is_some(), "--retry-after"),
                (a.outage.is_some(), "--outage"),
                (a.max_attempts.is_some(), "--max-attempts"),
                (a.processes.is_some(), "--processes"),
                (a.clock_skew.is_some(), "--clock-skew"),
            ];
            if let Some((_, flag)) = capacity_only.iter().find(|(given, _)| *given) {
                return Err(usage(format!("{flag} applies to --model capacity only")));
            }
            let mut c = OccConfig::default();
            c.base = a.base.unwrap_or(c.base);
            c.cap = a.cap.unwrap_or(c.cap);
            Model::Occ(c)
        }
        "capacity" => {
            let mut c = CapacityConfig::default();
            c.base = a.base.unwrap_or(c.base);
            c.cap = a.cap.unwrap_or(c.cap);
            c.capacity = a.capacity.unwrap_or(c.capacity);
            c.burst = a.burst.or(c.burst);
            c.max_attempts = a.max_attempts.unwrap_or(c.max_attempts);
            c.processes = a.processes.unwrap_or(c.processes);
            c.clock_skew = a.clock_skew.unwrap_or(c.clock_skew);
            c.overload = match a.overload {
                None | Some(429) => Overload::TooManyRequests,
                Some(503) => Overload::Unavailable,
                Some(other) => {
                    return Err(usage(format!(
                        "invalid --overload {other}: must be 429 or 503"
                    )));
                }
            };
            if let Some(ra) = &a.retry_after {
                c.retry_after = parse_retry_after(ra)?;
            }
            if let Some(o) = &a.outage {
                c.outage = Some(parse_outage(o)?);
            }
            c.validate().map_err(|e| usage(flag_message(e)))?;
            Model::Capacity(c)
        }
        other => {
            return Err(usage(format!(
                "invalid --model {other:?}: must be occ or capacity"
            )));
        }
    };
    let strategies = if a.strategies.is_empty() {
        model.default_strategies()
    } else {
        a.strategies
            .iter()
            .flat_map(|s| split_list(s))
            .map(|s| {
                s.parse::<Strategy>()
                    .map_err(|e| usage(format!("invalid --strategy: {e}")))
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    // Check each strategy against the model now, so the error names the flag.
    let check = SweepConfig {
        model: model.clone(),
        strategies: strategies.clone(),
        clients: vec![1],
        runs: 1,
        seed: 0,
    };
    for s in &strategies {
        redrive_sim::run_once(&check.model, s, 1, 0)
            .map_err(|e| usage(format!("invalid --strategy {s}: {e}")))?;
    }
    Ok(SweepConfig {
        model,
        strategies,
        clients,
        runs: a.runs.unwrap_or(100),
        seed: a.seed,
    })
}

/// `--strategy a --strategy b` or `--strategy a,b`; commas inside parentheses stay.
fn split_list(s: &str) -> Vec<String> {
    let mut out = vec![];
    let mut depth = 0i32;
    let mut cur = String::new();
    for ch in s.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out.push(cur);
    out
}

pub(crate) fn parse_clients(s: &str) -> anyhow::Result<Vec<u32>> {
    let mut out = vec![];
    for part in s.split(',') {
        let n: u32 = part.trim().parse().map_err(|_| {
            usage(format!(
                "invalid --clients {s:?}: {part:?} is not a number (write 100 or 10,20,50)"
            ))
        })?;
        if !(1..=redrive_sim::MAX_CLIENTS).contains(&n) {
            return Err(usage(format!(
                "invalid --clients {n}: must be from 1 to {}",
                redrive_sim::MAX_CLIENTS
            )));
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

fn parse_outage(s: &str) -> anyhow::Result<Outage> {
    let bad = |why: String| {
        usage(format!(
            "invalid --outage {s:?}: {why} (write it like 5s+10s)"
        ))
    };
    let (start, length) = s.split_once('+').ok_or_else(|| bad("no '+'".into()))?;
    let start: Duration = parse_duration(start).map_err(bad)?;
    let length: Duration = parse_duration(length).map_err(bad)?;
    if length.is_zero() {
        return Err(bad("the length is 0".into()));
    }
    Ok(Outage { start, length })
}

/// Names the flag for a refused capacity-model parameter.
fn flag_message(e: SimError) -> String {
    match &e {
        SimError::InvalidConfig {
            field,
            value,
            reason,
        } => {
            let flag = match *field {
                "capacity" => "--capacity",
                "burst" => "--burst",
                "max attempts" => "--max-attempts",
                "processes" => "--processes",
                "clock skew" => "--clock-skew",
                _ => return e.to_string(),
            };
            format!("invalid {flag} {value}: must be {reason}")
        }
        _ => e.to_string(),
    }
}

/// `--retry-after`: whole seconds, or `none`.
pub(crate) fn parse_retry_after(ra: &str) -> anyhow::Result<Option<u64>> {
    match ra.trim() {
        "none" => Ok(None),
        s => s.parse::<u64>().map(Some).map_err(|_| {
            usage(format!(
                "invalid --retry-after {ra:?}: must be whole seconds (e.g. 1) or none"
            ))
        }),
    }
}
