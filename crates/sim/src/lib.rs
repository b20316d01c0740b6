//! The thundering-herd simulator: what a retry policy does to a PSP when many clients fail
//! at once, as numbers and as charts (`redrive simulate`).
//!
//! A deterministic discrete-event simulation: a binary heap of `(time, sequence, event)`,
//! one [`rand::rngs::SmallRng`] seeded per run, and the policy crate's own
//! [`Backoff`](redrive_policy::Backoff), [`Jitter`](redrive_policy::Jitter), `Retry-After`
//! parsing, [`RetryPolicy`](redrive_policy::RetryPolicy) decisions, and flow control (R23):
//! every simulated call goes through a [`FlowClient`](redrive_policy::FlowClient) per worker
//! process and one shared [`FlowRow`](redrive_policy::FlowRow) moved by
//! [`FlowConfig::apply`](redrive_policy::FlowConfig::apply), exactly as the runtime's workers
//! call. The simulator has no retry, breaker or limiter maths of its own, so what it shows is
//! what redrive does.
//!
//! Three models:
//! - [`occ`]: the AWS Architecture Blog's "Exponential Backoff And Jitter" (2015) model,
//!   N clients updating one row with optimistic concurrency;
//! - [`capacity`]: N payment workers whose calls just failed at once, retrying against a PSP
//!   that serves C requests per second and answers 429 or 503 beyond that;
//! - [`queue`]: a queue of jobs drained by one worker process against a PSP with a bad day,
//!   the way `redrive demo` runs (`redrive simulate --model capacity --scenario demo`).
//!
//! ```
//! use redrive_sim::{Model, OccConfig, SweepConfig, sweep};
//!
//! let cfg = SweepConfig {
//!     strategies: vec!["exponential".parse()?, "full".parse()?],
//!     ..SweepConfig::new(Model::Occ(OccConfig::default()), vec![50], 20, 1)
//! };
//! let report = sweep(&cfg, &|_| {})?;
//! let expo = report.cell("exponential", 50).unwrap();
//! let full = report.cell("full", 50).unwrap();
//! assert!(full.calls < expo.calls);
//! # Ok::<(), redrive_sim::SimError>(())
//! ```

pub mod capacity;
mod error;
mod fleet;
mod net;
pub mod occ;
mod plot;
pub mod queue;
mod report;
mod strategy;
mod sweep;

pub use capacity::{CapacityConfig, Outage, Overload};
pub use error::SimError;
pub use net::{BUCKET, Net, RunResult};
pub use occ::OccConfig;
pub use plot::{LoadChart, plot, plot_load};
pub use queue::{
    BreakerChange, PspLoad, PspModel, PspOutage, QueueConfig, QueueRun, QueueSummary, queue_csv,
    render_queue, run_queue, run_queue_many,
};
pub use report::{render_table, to_csv};
pub use strategy::{RateMode, Retrier, STRATEGY_FORMS, Shape, Strategy};
pub use sweep::{
    Cell, MAX_CLIENTS, Model, Report, Spread, SweepConfig, bucket_start, run_once, sweep,
};
