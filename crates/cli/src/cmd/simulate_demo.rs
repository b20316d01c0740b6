//! `redrive simulate --model capacity --scenario demo|fleet`: a whole run predicted by the
//! simulator's `queue` model, so that what the simulator shows is what the fleet does (R23).
//! - `demo`: `redrive demo`'s default run, with the demo's own scenario and policies
//!   (`demo_scenario`);
//! - `fleet`: three `redrive work --concurrency 16` processes with the default policies
//!   (the `payment` preset, the default flow control) draining 1,000 charges from a PSP at
//!   50/s with `Retry-After: 1`, 10% 5xx and an outage at 4 s for 5 s.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redrive_policy::PolicySet;
use redrive_psp_sim::Faults;
use redrive_sim::{PspModel, PspOutage, QueueConfig, QueueRun, QueueSummary};
use serde::Serialize;

use crate::args::{DemoArgs, Global, SimulateArgs};
use crate::cmd::demo_scenario::{CALL_TIMEOUT, DEPENDENCY, POLL_INTERVAL, policies, scenario};
use crate::cmd::simulate::{check_plot, parse_clients};
use crate::error::usage;

/// Runs per prediction when `--runs` is not given.
const DEFAULT_RUNS: u32 = 5;

/// The `fleet` scenario: worker processes, workers each, charges.
const FLEET: (u32, u32, u32) = (3, 16, 1000);

/// `redrive demo`'s arguments as a plain `redrive demo` has them.
#[derive(Debug, Parser)]
struct DemoDefaults {
    #[command(flatten)]
    demo: DemoArgs,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    model: &'static str,
    scenario: &'a str,
    jobs: u32,
    workers: u32,
    processes: u32,
    clock_skew_ms: u128,
    psp: &'a PspModel,
    mean: QueueSummary,
    runs: &'a [QueueRun],
}

pub(crate) fn run(global: &Global, a: &SimulateArgs, name: &str) -> anyhow::Result<ExitCode> {
    let cfg = resolve(global, a, name)?;
    let runs = a.runs.unwrap_or(DEFAULT_RUNS);
    let bar = progress(runs);
    let results = redrive_sim::run_queue_many(&cfg, runs, a.seed, &|n| bar.inc(n))
        .map_err(|e| usage(e.to_string()))?;
    bar.finish_and_clear();
    if let Some(path) = &a.csv {
        std::fs::write(path, redrive_sim::queue_csv(&results))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    if let (Some(path), Some(first)) = (&a.plot, results.first()) {
        let title = format!(
            "redrive simulate --scenario {name}: PSP load, {} charges, {} (seed {})",
            cfg.jobs,
            workers(&cfg),
            first.seed
        );
        redrive_sim::plot_load(
            &first.load_chart(title, cfg.psp.outage, cfg.psp.rate_limit),
            path,
        )?;
    }
    if a.json {
        let report = Report {
            model: "capacity",
            scenario: name,
            jobs: cfg.jobs,
            workers: cfg.workers,
            processes: cfg.processes,
            clock_skew_ms: cfg.clock_skew.as_millis(),
            psp: &cfg.psp,
            mean: QueueSummary::of(&results),
            runs: &results,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let title = format!(
        "scenario {name}: {} charges, {}; the PSP: {}; {} run{} (seeds {}..{})",
        cfg.jobs,
        workers(&cfg),
        describe(&cfg.psp),
        runs,
        if runs == 1 { "" } else { "s" },
        a.seed,
        a.seed.wrapping_add(u64::from(runs) - 1)
    );
    print!("{}", redrive_sim::render_queue(&title, &results));
    let m = QueueSummary::of(&results);
    if let Some(l) = m.psp_load {
        println!(
            "psp_load (mean): limit_rps {} peak_ratio {:.2} share_429 {:.3} minimum_seconds {:.1} vs_minimum {:.2} back_after_outage_s {} peak_1s {:.2} back_80_s {}",
            l.limit_rps,
            l.peak_ratio,
            l.share_429,
            l.minimum_seconds,
            l.vs_minimum,
            l.back_after_outage_s
                .map_or("-".into(), |b| format!("{b:.2}")),
            l.peak_1s,
            l.back_80_s.map_or("-".into(), |b| format!("{b:.2}"))
        );
    }
    for p in [&a.csv, &a.plot].into_iter().flatten() {
        println!("wrote {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// "16 workers" for one process, "3 processes × 16 workers" for several, with the clock
/// skew if any.
fn workers(cfg: &QueueConfig) -> String {
    let mut s = if cfg.processes == 1 {
        format!("{} workers", cfg.workers)
    } else {
        format!("{} processes × {} workers", cfg.processes, cfg.workers)
    };
    if !cfg.clock_skew.is_zero() {
        let skew = redrive_policy::format_duration(cfg.clock_skew);
        s.push_str(&format!(" (clocks skewed over ±{skew})"));
    }
    s
}

/// The scenario's run as the `queue` model's parameters.
fn resolve(global: &Global, a: &SimulateArgs, name: &str) -> anyhow::Result<QueueConfig> {
    let fleet = match name.trim() {
        "demo" => false,
        "fleet" => true,
        _ => {
            return Err(usage(format!(
                "invalid --scenario {name:?}: must be demo or fleet"
            )));
        }
    };
    if a.model.trim() != "capacity" {
        return Err(usage("--scenario applies to --model capacity only"));
    }
    let fixed = [
        (!a.strategies.is_empty(), "--strategy"),
        (a.base.is_some(), "--base"),
        (a.cap.is_some(), "--cap"),
        (a.capacity.is_some() && !fleet, "--capacity"),
        (a.burst.is_some(), "--burst"),
        (a.overload.is_some(), "--overload"),
        (a.retry_after.is_some() && !fleet, "--retry-after"),
        (a.error_rate.is_some() && !fleet, "--error-rate"),
        (a.outage.is_some(), "--outage"),
        (a.max_attempts.is_some(), "--max-attempts"),
        (a.policy.is_some() && !fleet, "--policy"),
        (a.dependency.is_some() && !fleet, "--dependency"),
    ];
    if let Some((_, flag)) = fixed.iter().find(|(given, _)| *given) {
        return Err(usage(format!(
            "{flag} does not apply with --scenario {name}: the scenario sets it"
        )));
    }
    check_plot(a.plot.as_deref())?;
    let demo = DemoDefaults::try_parse_from(["demo"])?.demo;
    let default_workers = if fleet {
        FLEET.1
    } else {
        u32::try_from(demo.concurrency)?
    };
    let workers = match &a.clients {
        None => default_workers,
        Some(s) => match parse_clients(s)?.as_slice() {
            [n] => *n,
            _ => {
                return Err(usage(format!(
                    "invalid --clients {s:?}: with --scenario demo, one number of workers"
                )));
            }
        },
    };
    let processes = a.processes.unwrap_or(if fleet { FLEET.0 } else { 1 });
    let clock_skew = a.clock_skew.unwrap_or_default();
    let cfg = if fleet {
        // The policies in force: `--policies FILE`, else the stored version, else built-in.
        let set = crate::policies::source_without_store(global)?.set()?;
        let policy = set
            .get(a.policy.as_deref().unwrap_or(PolicySet::DEFAULT_POLICY))
            .map_err(|e| usage(format!("--policy: {e}")))?
            .clone();
        let dependency = a.dependency.as_deref().unwrap_or(DEPENDENCY);
        // The fleet's PSP may be changed (issue 35's second fleet: 40/s, `Retry-After: 3`,
        // 5% 5xx); the rest of the scenario is fixed.
        let retry_after = match &a.retry_after {
            None => Some(1),
            Some(ra) => crate::cmd::simulate::parse_retry_after(ra)?,
        }
        .map(std::time::Duration::from_secs);
        let psp = PspModel {
            rate_limit: Some(a.capacity.unwrap_or(50.0)),
            retry_after,
            error_rate: a.error_rate.unwrap_or(0.1),
            outage: Some(PspOutage {
                start: std::time::Duration::from_secs(4),
                length: std::time::Duration::from_secs(5),
            }),
            ..PspModel::default()
        };
        QueueConfig {
            jobs: FLEET.2,
            workers,
            processes,
            clock_skew,
            ..QueueConfig::new(policy, set.flow(dependency), psp)
        }
    } else {
        let (set, policy) = policies()?;
        let psp = psp_model(&scenario(&demo))?;
        QueueConfig {
            jobs: u32::try_from(demo.charges)?,
            workers,
            processes,
            clock_skew,
            call_timeout: CALL_TIMEOUT,
            poll: POLL_INTERVAL,
            ..QueueConfig::new(policy, set.flow(DEPENDENCY), psp)
        }
    };
    cfg.validate().map_err(|e| usage(e.to_string()))?;
    Ok(cfg)
}

/// The PSP simulator's faults as the `queue` model's PSP.
fn psp_model(f: &Faults) -> anyhow::Result<PspModel> {
    if !f.processing.is_zero() {
        anyhow::bail!("the queue model has no in-flight processing time at the PSP");
    }
    Ok(PspModel {
        rate_limit: f.rate_limit,
        retry_after: f.retry_after,
        error_rate: f.error_rate,
        outage: f.outage.map(|o| PspOutage {
            start: o.start,
            length: o.length,
        }),
        outage_retry_after: f.outage_retry_after,
        latency: f.latency,
        lost_answers: f.timeout_after_commit,
        hold_back: f.timeout_delay,
    })
}

fn describe(p: &PspModel) -> String {
    use redrive_policy::format_duration as d;
    let mut parts = Vec::new();
    if p.error_rate > 0.0 {
        parts.push(format!("{:.0}% 5xx", p.error_rate * 100.0));
    }
    if let Some(r) = p.rate_limit {
        let ra = p
            .retry_after
            .map_or(String::new(), |s| format!(" with Retry-After {}", d(s)));
        parts.push(format!("rate limit {r}/s{ra}"));
    }
    if let Some(o) = p.outage {
        parts.push(format!("outage {}+{}", d(o.start), d(o.length)));
    }
    if p.lost_answers > 0.0 {
        parts.push(format!(
            "{:.0}% answers lost after the charge",
            p.lost_answers * 100.0
        ));
    }
    parts.push(format!("latency {}", d(p.latency)));
    parts.join(", ")
}

fn progress(runs: u32) -> ProgressBar {
    if !std::io::stderr().is_terminal() || runs < 20 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(u64::from(runs)), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("simulating {bar:40} {pos}/{len} runs {eta}") {
        bar.set_style(style);
    }
    bar
}
