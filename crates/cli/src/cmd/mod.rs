//! One module per subcommand.

pub(crate) mod bench;
pub(crate) mod bench_api;
pub(crate) mod bench_runtime;
pub(crate) mod bench_scale;
pub(crate) mod demo;
pub(crate) mod demo_scenario;
pub(crate) mod enqueue_file;
pub(crate) mod idempotency;
pub(crate) mod operator;
pub(crate) mod policy;
pub(crate) mod psp_sim;
pub(crate) mod queue;
pub(crate) mod quota;
pub(crate) mod schedule;
pub(crate) mod serve;
pub(crate) mod simulate;
pub(crate) mod simulate_demo;
pub(crate) mod work;
