//! Runs many seeded runs per (strategy, clients) cell, on every core, and summarises them.
//!
//! Why seeded runs and averages: one run of a randomised strategy is one sample. Run `r` of
//! every cell uses the seed `seed + r`, so strategies are compared on the same random
//! streams and a sweep prints the same numbers on every machine and thread count.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::capacity::{self, CapacityConfig};
use crate::error::SimError;
use crate::net::RunResult;
use crate::occ::{self, OccConfig};
use crate::strategy::{Retrier, Strategy};

/// The most clients one cell may simulate.
pub const MAX_CLIENTS: u32 = 100_000;

/// Which model, with its parameters.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // built once per sweep; boxing buys nothing
pub enum Model {
    /// Optimistic concurrency on one row (the AWS blog's model).
    Occ(OccConfig),
    /// A PSP with a rate limit.
    Capacity(CapacityConfig),
}

impl Model {
    /// The model's name (`occ`, `capacity`).
    pub fn name(&self) -> &'static str {
        match self {
            Model::Occ(_) => "occ",
            Model::Capacity(_) => "capacity",
        }
    }

    /// The strategies compared when none is asked for.
    pub fn default_strategies(&self) -> Vec<Strategy> {
        match self {
            Model::Occ(_) => Strategy::occ_defaults(),
            Model::Capacity(_) => Strategy::capacity_defaults(),
        }
    }

    fn retrier(&self, s: &Strategy) -> Result<Retrier, SimError> {
        match self {
            Model::Occ(c) => c.retrier(s),
            Model::Capacity(c) => {
                c.validate()?;
                c.retrier(s)
            }
        }
    }
}

/// One seeded run.
///
/// # Errors
/// [`SimError`] for a strategy or parameter the model refuses, or a client count outside
/// `1..=MAX_CLIENTS`.
pub fn run_once(
    model: &Model,
    strategy: &Strategy,
    clients: u32,
    seed: u64,
) -> Result<RunResult, SimError> {
    check_clients(clients)?;
    let r = model.retrier(strategy)?;
    run_with(model, strategy, &r, clients, seed)
}

fn run_with(
    model: &Model,
    strategy: &Strategy,
    retrier: &Retrier,
    clients: u32,
    seed: u64,
) -> Result<RunResult, SimError> {
    let mut rng = SmallRng::seed_from_u64(seed);
    match model {
        Model::Occ(c) => Ok(occ::run(c, retrier, clients, &mut rng)),
        Model::Capacity(c) => capacity::run(c, strategy, retrier, clients, seed, &mut rng),
    }
}

fn check_clients(n: u32) -> Result<(), SimError> {
    if !(1..=MAX_CLIENTS).contains(&n) {
        return Err(SimError::config(
            "clients",
            n,
            format!("from 1 to {MAX_CLIENTS}"),
        ));
    }
    Ok(())
}

/// What to sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    /// The model.
    pub model: Model,
    /// The strategies (rows of the table).
    pub strategies: Vec<Strategy>,
    /// Client counts (one, or several for a sweep).
    pub clients: Vec<u32>,
    /// Seeded runs per cell.
    pub runs: u32,
    /// Seed of the first run.
    pub seed: u64,
}

impl SweepConfig {
    /// A sweep of the model's default strategies.
    pub fn new(model: Model, clients: Vec<u32>, runs: u32, seed: u64) -> Self {
        let strategies = model.default_strategies();
        Self {
            model,
            strategies,
            clients,
            runs,
            seed,
        }
    }

    /// Runs in total (for a progress bar).
    pub fn total_runs(&self) -> u64 {
        self.strategies.len() as u64 * self.clients.len() as u64 * u64::from(self.runs)
    }
}

/// Mean, median, 99th percentile and maximum, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Spread {
    /// Mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl Spread {
    fn of(mut xs: Vec<f64>) -> Self {
        if xs.is_empty() {
            return Self::default();
        }
        xs.sort_by(f64::total_cmp);
        let rank = |p: f64| xs[((p * xs.len() as f64).ceil() as usize).clamp(1, xs.len()) - 1];
        Spread {
            mean: xs.iter().sum::<f64>() / xs.len() as f64,
            p50: rank(0.50),
            p99: rank(0.99),
            max: xs[xs.len() - 1],
        }
    }
}

/// One (strategy, clients) cell, averaged over its runs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Cell {
    /// The strategy, as `--strategy` reads it.
    pub strategy: String,
    /// Clients (workers).
    pub clients: u32,
    /// Runs averaged.
    pub runs: u32,
    /// Calls per run (mean).
    pub calls: f64,
    /// Calls that did not succeed, per run (mean).
    pub wasted: f64,
    /// Completion time of a run (when its last client finished), over the runs, in ms.
    pub completion_ms: Spread,
    /// The most calls in one 100 ms bucket, per run (mean).
    pub peak_per_100ms: f64,
    /// The largest such peak of any run.
    pub peak_max: u32,
    /// Clients that gave up, per run (mean).
    pub failed: f64,
    /// Calls not made because the breaker was open or the fleet paused, per run (mean).
    pub blocked: f64,
    /// The first run's calls per 100 ms (one seeded picture, not an average).
    pub timeline: Vec<u32>,
}

/// A whole sweep's results.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// `occ` or `capacity`.
    pub model: String,
    /// The model's parameters, in words (for titles and tables).
    pub parameters: String,
    /// For the capacity model: requests per 100 ms the PSP serves.
    pub capacity_per_100ms: Option<f64>,
    /// Runs per cell.
    pub runs: u32,
    /// Seed of the first run.
    pub seed: u64,
    /// Client counts swept.
    pub clients: Vec<u32>,
    /// Strategies, in order.
    pub strategies: Vec<String>,
    /// One cell per strategy and client count, strategy-major.
    pub cells: Vec<Cell>,
}

impl Report {
    /// The cell of this strategy and client count.
    pub fn cell(&self, strategy: &str, clients: u32) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.strategy == strategy && c.clients == clients)
    }
}

fn describe(model: &Model) -> String {
    use redrive_policy::format_duration as f;
    match model {
        Model::Occ(c) => format!(
            "base {}, cap {}, network |Normal({}, {})| per message, first delay expo({})",
            f(c.base),
            f(c.cap),
            f(c.net.mean),
            f(c.net.sd),
            c.exponent_offset
        ),
        Model::Capacity(c) => format!(
            "capacity {} req/s (burst {}), beyond it {}{}{}, base {}, cap {}, {} attempts",
            c.capacity,
            c.burst_size(),
            c.overload.status(),
            c.retry_after
                .map(|s| format!(" with Retry-After: {s}"))
                .unwrap_or_else(|| " without Retry-After".into()),
            c.outage
                .map(|o| format!(", outage {}+{}", f(o.start), f(o.length)))
                .unwrap_or_default(),
            f(c.base),
            f(c.cap),
            c.max_attempts
        ),
    }
}

/// Runs the sweep on every core. `progress` is called with the number of runs just finished.
///
/// # Errors
/// [`SimError`] for a refused strategy, parameter, client count, or zero runs; nothing runs
/// then.
pub fn sweep(cfg: &SweepConfig, progress: &(dyn Fn(u64) + Sync)) -> Result<Report, SimError> {
    if cfg.runs == 0 {
        return Err(SimError::config("runs", 0, "at least 1"));
    }
    if cfg.strategies.is_empty() {
        return Err(SimError::config("strategies", "[]", "at least one"));
    }
    if cfg.clients.is_empty() {
        return Err(SimError::config("clients", "[]", "at least one count"));
    }
    for &n in &cfg.clients {
        check_clients(n)?;
    }
    let retriers = cfg
        .strategies
        .iter()
        .map(|s| cfg.model.retrier(s))
        .collect::<Result<Vec<_>, _>>()?;

    // Work items: (strategy, clients, run); the biggest client counts first for balance.
    let mut items: Vec<(usize, usize, u32)> = Vec::new();
    let mut order: Vec<usize> = (0..cfg.clients.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(cfg.clients[i]));
    for &ci in &order {
        for si in 0..cfg.strategies.len() {
            for r in 0..cfg.runs {
                items.push((si, ci, r));
            }
        }
    }
    let n_cells = cfg.strategies.len() * cfg.clients.len();
    let results: Vec<Mutex<Vec<Option<RunResult>>>> = (0..n_cells)
        .map(|_| Mutex::new(vec![None; cfg.runs as usize]))
        .collect();
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<SimError>> = Mutex::new(None);
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(items.len())
        .max(1);
    // Chunks of runs per grab keep the atomic cheap and the load balanced.
    let chunk = (items.len() / (threads * 64)).clamp(1, 64);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let start = next.fetch_add(chunk, Ordering::Relaxed);
                    if start >= items.len() {
                        break;
                    }
                    let end = (start + chunk).min(items.len());
                    for &(si, ci, r) in &items[start..end] {
                        let seed = cfg.seed.wrapping_add(u64::from(r));
                        let res = run_with(
                            &cfg.model,
                            &cfg.strategies[si],
                            &retriers[si],
                            cfg.clients[ci],
                            seed,
                        );
                        match res {
                            Ok(res) => {
                                let cell = si * cfg.clients.len() + ci;
                                let mut slot =
                                    results[cell].lock().unwrap_or_else(|p| p.into_inner());
                                slot[r as usize] = Some(res);
                            }
                            Err(e) => {
                                *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                                next.store(items.len(), Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                    progress((end - start) as u64);
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }

    let mut cells = Vec::with_capacity(n_cells);
    for (si, s) in cfg.strategies.iter().enumerate() {
        for (ci, &clients) in cfg.clients.iter().enumerate() {
            let runs: Vec<RunResult> = results[si * cfg.clients.len() + ci]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
                .flatten()
                .collect();
            cells.push(summarise(s.to_string(), clients, runs));
        }
    }
    Ok(Report {
        model: cfg.model.name().to_owned(),
        parameters: describe(&cfg.model),
        capacity_per_100ms: match &cfg.model {
            Model::Capacity(c) => Some(c.capacity / 10.0),
            Model::Occ(_) => None,
        },
        runs: cfg.runs,
        seed: cfg.seed,
        clients: cfg.clients.clone(),
        strategies: cfg.strategies.iter().map(ToString::to_string).collect(),
        cells,
    })
}

fn summarise(strategy: String, clients: u32, runs: Vec<RunResult>) -> Cell {
    let k = runs.len().max(1) as f64;
    let mean = |f: &dyn Fn(&RunResult) -> f64| runs.iter().map(f).sum::<f64>() / k;
    Cell {
        strategy,
        clients,
        runs: runs.len() as u32,
        calls: mean(&|r| r.calls as f64),
        wasted: mean(&|r| r.wasted as f64),
        completion_ms: Spread::of(
            runs.iter()
                .map(|r| r.completion.as_secs_f64() * 1e3)
                .collect(),
        ),
        peak_per_100ms: mean(&|r| f64::from(r.peak())),
        peak_max: runs.iter().map(RunResult::peak).max().unwrap_or(0),
        failed: mean(&|r| f64::from(r.failed)),
        blocked: mean(&|r| r.blocked as f64),
        timeline: runs.first().map(|r| r.timeline.clone()).unwrap_or_default(),
    }
}

/// The run length a bucket index stands for (for charts): bucket `i` starts at `i · 100 ms`.
pub fn bucket_start(i: usize) -> Duration {
    crate::net::BUCKET * u32::try_from(i).unwrap_or(u32::MAX)
}
