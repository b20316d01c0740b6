//! Command-line arguments, parsed and validated without I/O (ripgrep's
//! "low" arguments). Commands resolve them against the database and the
//! policy registry themselves.
//!
//! The names, flags and defaults here are the CLI contract (docs/design.md, "Contracts"):
//! extend them, never rename them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The default database: an SQLite file in the working directory.
pub(crate) const DEFAULT_DB: &str = "sqlite:redrive.db";

/// redrive: a durable job queue and retry engine for payment workers.
#[derive(Debug, Parser)]
#[command(name = "redrive", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Flags every command takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct Global {
    /// Database URL: `sqlite:PATH` (created and migrated on first use by `migrate`, `enqueue`,
    /// `work`, `serve`; the other commands refuse a file that does not exist) or
    /// `postgres://...`.
    #[arg(
        long = "db",
        global = true,
        env = "REDRIVE_DATABASE_URL",
        hide_env_values = true,
        default_value = DEFAULT_DB
    )]
    pub(crate) db: String,
    /// PostgreSQL: the most connections this process opens, its pool and the one that
    /// LISTENs for wake-ups (2-1000; sets the URL's `pool_size`, default 17). Size a fleet
    /// against the server's `max_connections` (docs/scaling.md, "Connection budget").
    #[arg(
        long = "db-pool",
        global = true,
        env = "REDRIVE_DB_POOL",
        value_name = "N"
    )]
    pub(crate) db_pool: Option<u32>,
    /// PostgreSQL: where to LISTEN for wake-ups: a direct `postgres://` URL past a pooler in
    /// transaction mode (PgBouncer), or `off` to find new jobs by polling alone (sets the
    /// URL's `listen`; default: a connection like the pool's).
    #[arg(
        long = "listen-db",
        global = true,
        env = "REDRIVE_LISTEN_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL|off"
    )]
    pub(crate) listen_db: Option<String>,
    /// A TOML file of retry policies and breaker settings (added to the built-in presets).
    #[arg(long = "policies", global = true, env = "REDRIVE_POLICIES")]
    pub(crate) policies: Option<PathBuf>,
    /// More secret names whose values are never shown (repeatable, or comma-separated in the
    /// environment; `*` matches any run of characters), added to the built-in list.
    #[arg(
        long = "redact",
        global = true,
        env = "REDRIVE_REDACT",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub(crate) redact: Vec<String>,
    /// Log lines on stderr: `text` (coloured only on a terminal) or `json` (one object a line,
    /// for a log pipeline). Secrets are redacted in both. Levels: RUST_LOG.
    #[arg(
        long = "log-format",
        global = true,
        env = "REDRIVE_LOG_FORMAT",
        default_value = "text",
        value_parser = ["text", "json"]
    )]
    pub(crate) log_format: String,
}

/// Where `http` jobs may connect (`work`, `serve`): added to the policies file's `[egress]`.
#[derive(Debug, Clone, Args)]
pub(crate) struct EgressArgs {
    /// Only these hosts may be called: names, `*.suffix`, addresses, CIDR ranges, or the
    /// words `loopback`, `private` and `public` (repeatable). Loopback and private networks
    /// (127/8, ::1, 10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) are refused unless an
    /// entry here covers them: `--allow-host loopback` for a PSP simulator on this machine.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub(crate) allow_hosts: Vec<String>,
    /// Never call these hosts (repeatable; `loopback` and `private` name those ranges).
    /// Link-local and cloud metadata addresses are always denied.
    #[arg(long = "deny-host", value_name = "HOST")]
    pub(crate) deny_hosts: Vec<String>,
    /// Redirects: `none` (a 3xx is permanent) or `same-origin` (default: the policies file's,
    /// else none).
    #[arg(long)]
    pub(crate) redirects: Option<String>,
}

/// Every subcommand.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create or upgrade the database schema.
    Migrate,
    /// Add one job to a queue.
    Enqueue(EnqueueArgs),
    /// Run workers that claim and run jobs.
    Work(WorkArgs),
    /// List jobs.
    Jobs(JobsArgs),
    /// Show one job with every attempt.
    Show(ShowArgs),
    /// The dead-letter table: list, replay, purge.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Cancel a job that has not finished.
    Cancel(CancelArgs),
    /// Counts per queue and state, breakers, and jobs waiting for a kind no live worker runs.
    Stats(StatsArgs),
    /// The live workers of the fleet: host, pid, queues, kinds, concurrency, last seen.
    Workers(JsonArgs),
    /// Circuit breakers per dependency (`breakers force` to override one).
    Breakers(BreakersArgs),
    /// Retry policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run the HTTP API, the dashboard and (optionally) workers.
    Serve(ServeArgs),
    /// Run the PSP simulator.
    #[command(name = "psp-sim")]
    PspSim(PspSimArgs),
    /// Simulate what a retry policy does to a PSP when many clients fail at once.
    Simulate(SimulateArgs),
    /// Run the end-to-end demo against an in-process PSP simulator.
    Demo(DemoArgs),
    /// Benchmark the store: bulk enqueue, then drain noop jobs.
    Bench(BenchArgs),
    /// The `Idempotency-Key`s of `POST /v1/jobs`: list, recover stuck ones.
    #[command(subcommand)]
    Idempotency(IdempotencyCommand),
    // ----- retention and periodic jobs (args in the block "Retention and schedules" below)
    /// Delete finished jobs (and their attempts) older than an age, in small batches.
    Prune(PruneArgs),
    /// Periodic jobs: add (or replace), list, remove schedules.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Pause or resume a queue fleet-wide, or list the paused ones.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Pause or resume a dependency fleet-wide.
    #[command(subcommand)]
    Dependency(DependencyCommand),
    /// Bring scheduled or deferred jobs forward (budgets untouched), by ids or filter.
    #[command(name = "run-now")]
    RunNow(RunNowArgs),
    /// The audit trail of operator actions, newest first.
    Audit(AuditArgs),
    /// Card reattempt quotas and card stops: `quota show KEY`, `quota lift KEY`.
    #[command(subcommand)]
    Quota(QuotaCommand),
}

/// `redrive quota ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum QuotaCommand {
    /// A card key's reattempts in each window of its network's quota (from the policies file),
    /// and its card stop if a decline stopped it.
    Show(QuotaShowArgs),
    /// Lifts a card key's stop (set by a Visa category 1 / MAC 03 / MAC 21 decline; audited):
    /// its jobs are called again from their next claim.
    Lift(QuotaShowArgs),
}

/// `redrive quota show` and `redrive quota lift`.
#[derive(Debug, Args)]
pub(crate) struct QuotaShowArgs {
    /// The card key (a job's `quota_key`).
    pub(crate) key: String,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive idempotency ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum IdempotencyCommand {
    /// List keys by id (`--stuck`: those whose request vanished before answering).
    List(IdempotencyListArgs),
    /// Release stuck keys, so that the next request with each enqueues again (and finds its
    /// job by the key if the vanished request made it). Keys that completed or whose request
    /// still runs are skipped (exit 1).
    Recover(IdempotencyRecoverArgs),
}

/// `redrive idempotency list`.
#[derive(Debug, Args)]
pub(crate) struct IdempotencyListArgs {
    /// Only stuck keys (short for `--state stuck`).
    #[arg(long, conflicts_with = "state")]
    pub(crate) stuck: bool,
    /// Only keys in this state: all, in_progress, stuck, completed.
    #[arg(long)]
    pub(crate) state: Option<String>,
    /// At most this many keys.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) limit: u32,
    /// Only keys after this record id (keyset pagination).
    #[arg(long)]
    pub(crate) after: Option<i64>,
    /// The scope of the keys (`redrive serve` uses `default`).
    #[arg(long, default_value = "default")]
    pub(crate) scope: String,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive idempotency recover`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["keys", "all_stuck"])))]
pub(crate) struct IdempotencyRecoverArgs {
    /// The keys.
    #[arg(value_name = "KEY")]
    pub(crate) keys: Vec<String>,
    /// Every stuck key (of `--scope`).
    #[arg(long = "all-stuck")]
    pub(crate) all_stuck: bool,
    /// The scope of the keys (`redrive serve` uses `default`).
    #[arg(long, default_value = "default")]
    pub(crate) scope: String,
    /// Print the result as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `--json` alone.
#[derive(Debug, Args)]
pub(crate) struct JsonArgs {
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatsArgs {
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
    /// Show at most this many queues (the busiest), breakers (those open or paused first) and
    /// unhandled groups; how many were left out is printed (`more` in the JSON).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) limit: u32,
}

/// `redrive enqueue`.
#[derive(Debug, Args)]
pub(crate) struct EnqueueArgs {
    /// Queue name.
    #[arg(long, required_unless_present = "file")]
    pub(crate) queue: Option<String>,
    /// Job kind (e.g. `http`, `noop`, or one of your own).
    #[arg(long, required_unless_present = "file")]
    pub(crate) kind: Option<String>,
    /// Enqueue the jobs of an NDJSON file (`-`: standard input) instead: one JSON object per
    /// line with the fields of `POST /v1/jobs` (`queue`, `kind`, `payload`, `key`, `delay`,
    /// `run_at`, `policy`, `dependency`, `priority`, `max_attempts`, `quota_key`). Every line
    /// is checked first (a bad one: exit 2 naming its line and field, nothing enqueued), then
    /// the jobs go in transactions of 1,000; a job whose key exists is not enqueued twice.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["queue", "kind", "payload", "key",
          "delay", "run_at", "policy", "dependency", "priority", "max_attempts", "quota_key"])]
    pub(crate) file: Option<String>,
    /// JSON payload, or `@FILE` to read it from a file.
    #[arg(long)]
    pub(crate) payload: Option<String>,
    /// Idempotency key (unique per queue; a repeat returns the existing job).
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// Run after this delay (e.g. `30s`, `5m`).
    #[arg(long, value_parser = parse_duration, conflicts_with = "run_at")]
    pub(crate) delay: Option<Duration>,
    /// Run at this RFC 3339 time.
    #[arg(long = "run-at", value_parser = parse_rfc3339)]
    pub(crate) run_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Retry policy name.
    #[arg(long)]
    pub(crate) policy: Option<String>,
    /// Dependency (breaker) name; `http` jobs default to the URL's host.
    #[arg(long)]
    pub(crate) dependency: Option<String>,
    /// Priority: lower runs first (-1000000..=1000000).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) priority: Option<i32>,
    /// Attempts this job may make in all, from 1 to its policy's total (default: the policy's
    /// total). It lowers the policy's budget, never raises it: the workers dead-letter the job
    /// (`attempts_exhausted`) after this many attempts.
    #[arg(long = "max-attempts", value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: Option<u32>,
    /// The card key the networks' reattempt quotas count against (a card fingerprint or
    /// payment-method id; a card number is refused).
    #[arg(long = "quota-key")]
    pub(crate) quota_key: Option<String>,
    /// Print the job as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive work`.
#[derive(Debug, Args)]
pub(crate) struct WorkArgs {
    /// Queues to work (repeatable); default: every queue.
    #[arg(long = "queue")]
    pub(crate) queues: Vec<String>,
    /// Kinds to run (repeatable): `noop`, `http`; default: both. Jobs of other kinds are not
    /// claimed: they wait for a worker that runs them.
    #[arg(long = "kind", value_name = "KIND")]
    pub(crate) kinds: Vec<String>,
    /// Jobs run at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) concurrency: u32,
    /// Exit once no job is due, this process runs none and no job of its queues and kinds
    /// is leased by another process. Jobs leased elsewhere (by a live worker, or by one that
    /// was killed, until their lease expires and they are taken back) are waited for, at most
    /// --until-idle-wait, and run here if they come back. Jobs due later (scheduled,
    /// deferred) are not waited for.
    #[arg(long = "until-idle")]
    pub(crate) until_idle: bool,
    /// With --until-idle: how long to wait at most for jobs leased by another process (0s:
    /// do not wait). Not with --max-jobs.
    #[arg(long = "until-idle-wait", default_value = "2m", value_parser = parse_duration)]
    pub(crate) until_idle_wait: std::time::Duration,
    /// Exit after this many jobs finished their attempt.
    #[arg(long = "max-jobs")]
    pub(crate) max_jobs: Option<u64>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9090 or localhost:9090).
    #[arg(long = "metrics-addr", value_parser = parse_addr)]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Allow --metrics-addr beyond loopback: /metrics is then served without authentication
    /// to anyone who can reach the address (job counts, queue and dependency names).
    #[arg(long = "metrics-public", requires = "metrics_addr")]
    pub(crate) metrics_public: bool,
    /// How often one background task reads the gauges that need the database
    /// (`redrive_jobs`, `redrive_oldest_available_seconds`); a scrape never queries.
    #[arg(long = "metrics-refresh", default_value = "5s", value_parser = parse_positive_duration)]
    pub(crate) metrics_refresh: std::time::Duration,
    /// How many queue names (and, separately, dependency names) get their own metric label;
    /// the busiest first, every later one is counted under `other` (bounds /metrics and
    /// memory with thousands of queues).
    #[arg(long = "metrics-max-labels", env = "REDRIVE_METRICS_MAX_LABELS", default_value_t = redrive_store::labels::DEFAULT_MAX_LABELS)]
    pub(crate) metrics_max_labels: usize,
    /// After SIGINT/SIGTERM, how long running attempts may take to finish.
    #[arg(long = "shutdown-grace", default_value = "30s", value_parser = parse_duration)]
    pub(crate) shutdown_grace: std::time::Duration,
    /// Lease length (heartbeats every third of it).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) lease: std::time::Duration,
    /// Fail closed: when a dependency's breaker row cannot be read, defer the job this long
    /// instead of calling (default: call, fail open; docs/safety.md has the trade-off).
    #[arg(long = "fail-closed", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) fail_closed: Option<std::time::Duration>,
    #[command(flatten)]
    pub(crate) egress: EgressArgs,
    #[command(flatten)]
    pub(crate) housekeeping: HousekeepingArgs,
}

/// `redrive jobs`.
#[derive(Debug, Args)]
pub(crate) struct JobsArgs {
    /// Only jobs in this state.
    #[arg(long)]
    pub(crate) state: Option<String>,
    /// Only jobs of this queue.
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// Only the jobs with this idempotency key (one per queue at most).
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// At most this many jobs.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) limit: u32,
    /// Only jobs after this id (keyset pagination).
    #[arg(long)]
    pub(crate) after: Option<i64>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive show`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "key"])))]
pub(crate) struct ShowArgs {
    /// Job id.
    pub(crate) id: Option<i64>,
    /// The job with this idempotency key (a key is unique per queue: give `--queue` when
    /// several queues hold it).
    #[arg(long, conflicts_with = "id")]
    pub(crate) key: Option<String>,
    /// With `--key`: the queue of the job.
    #[arg(long, requires = "key")]
    pub(crate) queue: Option<String>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive cancel`: ids, or a filter (`--all` for every unfinished job).
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(true)
    .args(["ids", "all", "queue", "kind", "dependency", "dead_reason", "signature"])))]
pub(crate) struct CancelArgs {
    /// Job ids.
    #[arg(value_name = "ID")]
    pub(crate) ids: Vec<i64>,
    #[command(flatten)]
    pub(crate) bulk: BulkArgs,
}

/// `redrive dead ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadCommand {
    /// List dead jobs.
    List(DeadListArgs),
    /// Replay dead jobs: budgets reset, history kept.
    Replay(DeadSelection),
    /// Delete dead jobs for good (asks first; `--yes` to skip the question).
    Purge(DeadSelection),
}

/// `redrive dead list`.
#[derive(Debug, Args)]
pub(crate) struct DeadListArgs {
    /// Only jobs of this queue.
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// At most this many jobs.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) limit: u32,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Which dead jobs: ids, all, or a filter (every condition given must hold; ids with a
/// filter: those of the ids that match it).
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(true)
    .args(["ids", "all", "queue", "kind", "dependency", "dead_reason", "signature"])))]
pub(crate) struct DeadSelection {
    /// Job ids.
    pub(crate) ids: Vec<i64>,
    #[command(flatten)]
    pub(crate) bulk: BulkArgs,
    /// Do not ask for confirmation (needed by `purge` when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

/// `redrive policy ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Print the delays a policy will produce, attempt by attempt.
    Show(PolicyShowArgs),
    /// Check a policies file and store it in the database as the fleet's next version
    /// (audited, with a diff against the stored one); running workers pick it up.
    Apply(PolicyApplyArgs),
    /// The policies in force (the stored version, or `--policies`, or built-in), one a line.
    List(PolicyListArgs),
    /// The stored versions of the policies: number, time, author, digest, comment.
    History(PolicyHistoryArgs),
}

/// `redrive policy apply`.
#[derive(Debug, Args)]
pub(crate) struct PolicyApplyArgs {
    /// The policies file (the format of `--policies`: policies, breakers, quotas, egress,
    /// alerts, payload, schedules).
    pub(crate) file: PathBuf,
    /// A note kept with the version (shown by `policy history`).
    #[arg(long, short = 'm')]
    pub(crate) comment: Option<String>,
    /// Check and show the diff; store nothing.
    #[arg(long = "dry-run")]
    pub(crate) dry_run: bool,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive policy list`.
#[derive(Debug, Args)]
pub(crate) struct PolicyListArgs {
    /// A stored version instead of the policies in force.
    #[arg(long = "policy-version", value_name = "N")]
    pub(crate) policy_version: Option<i64>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive policy history`.
#[derive(Debug, Args)]
pub(crate) struct PolicyHistoryArgs {
    /// Versions shown at most, newest first.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) limit: u32,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive policy show`.
#[derive(Debug, Args)]
pub(crate) struct PolicyShowArgs {
    /// A named policy (`payment`, `background`, `classic`, or one from `--file`, `--policies`
    /// or the stored policies).
    pub(crate) name: Option<String>,
    /// A TOML file of policies; with NAME, the one to show; alone, its only policy.
    #[arg(long)]
    pub(crate) file: Option<PathBuf>,
    /// A stored version of the policies (default: `--policies`, else the latest stored
    /// version, else the built-in presets).
    #[arg(long = "policy-version", value_name = "N", conflicts_with = "file")]
    pub(crate) policy_version: Option<i64>,
    /// Base delay (ad-hoc policy).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) base: Option<Duration>,
    /// Delay cap (ad-hoc policy).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) cap: Option<Duration>,
    /// Backoff multiplier (ad-hoc policy).
    #[arg(long)]
    pub(crate) multiplier: Option<f64>,
    /// Jitter: none, full, equal, decorrelated, proportional(F) (ad-hoc policy).
    #[arg(long)]
    pub(crate) jitter: Option<String>,
    /// Maximum attempts (ad-hoc policy).
    #[arg(long)]
    pub(crate) attempts: Option<u32>,
    /// Delays sampled per attempt for the percentiles.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) samples: u32,
    /// Seed for the sampled delays.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) addr: String,
    /// Run this many workers in the same process (0: enqueue and show only).
    #[arg(long, default_value_t = 0)]
    pub(crate) workers: u32,
    /// How often one background task reads the gauges of `/metrics` that need the database
    /// (`redrive_jobs`, `redrive_oldest_available_seconds`); a scrape never queries.
    #[arg(long = "metrics-refresh", default_value = "5s", value_parser = parse_positive_duration)]
    pub(crate) metrics_refresh: std::time::Duration,
    /// How many queue names (and, separately, dependency names) get their own metric label;
    /// the busiest first, every later one is counted under `other` (bounds /metrics and
    /// memory with thousands of queues).
    #[arg(long = "metrics-max-labels", env = "REDRIVE_METRICS_MAX_LABELS", default_value_t = redrive_store::labels::DEFAULT_MAX_LABELS)]
    pub(crate) metrics_max_labels: usize,
    /// With --workers: the queues they work (repeatable); default: every queue.
    #[arg(long = "queue", requires = "workers")]
    pub(crate) queues: Vec<String>,
    /// With --workers: the kinds they run (repeatable): `noop`, `http`; default: both. Jobs
    /// of other kinds are not claimed: they wait for a worker that runs them.
    #[arg(long = "kind", value_name = "KIND", requires = "workers")]
    pub(crate) kinds: Vec<String>,
    /// Bearer token every `/v1` call (and `/metrics`) must carry. Prefer REDRIVE_API_TOKEN or
    /// --token-file: a command line is visible to every user of the machine. Beyond loopback
    /// it needs at least 16 characters.
    ///
    /// `label:secret` labels it (the audit trail names the label; a plain secret is labelled
    /// `token`); repeat to accept several.
    #[arg(long, env = "REDRIVE_API_TOKEN", hide_env_values = true)]
    pub(crate) token: Vec<String>,
    /// A read-only token, `label:secret` (repeatable): GET requests only; any write gets 403.
    #[arg(
        long = "read-token",
        env = "REDRIVE_API_READ_TOKEN",
        hide_env_values = true,
        value_name = "LABEL:SECRET"
    )]
    pub(crate) read_tokens: Vec<String>,
    /// Read the token from the first line of this file (trimmed); not with --token or
    /// REDRIVE_API_TOKEN.
    #[arg(long = "token-file", value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
    /// A host name (with an optional port) the service answers as besides localhost,
    /// 127.0.0.1 and [::1] (repeatable). Other `Host` headers get 421: always without a token,
    /// and with one once any --public-host is given.
    // `[::1]` is help text, not an intra-doc link.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long = "public-host", value_name = "HOST[:PORT]", value_parser = parse_public_host)]
    pub(crate) public_hosts: Vec<String>,
    /// Mark the dashboard's session cookie `Secure` (when served behind TLS).
    #[arg(long = "cookie-secure")]
    pub(crate) cookie_secure: bool,
    /// Serve `/metrics` without the token.
    #[arg(long = "metrics-public")]
    pub(crate) metrics_public: bool,
    /// Refuse (422, naming the member) a job whose payload carries card data: a card number
    /// (Luhn-valid, 13-19 digits) or a member such as `card_number`, `pan`, `cvc`. Card data
    /// is masked on every surface either way; a payment fleet should store PSP tokens.
    /// Also `refuse_card_data = true` in the policies file's `[payload]` section.
    #[arg(long = "refuse-card-data", env = "REDRIVE_REFUSE_CARD_DATA")]
    pub(crate) refuse_card_data: bool,
    /// Time allowed for a request's header (from the accept for a connection's first request).
    #[arg(long = "header-timeout", default_value = "10s", value_parser = parse_positive_duration)]
    pub(crate) header_timeout: Duration,
    /// Close a keep-alive connection that moves no byte for this long between requests.
    #[arg(long = "idle-timeout", default_value = "60s", value_parser = parse_positive_duration)]
    pub(crate) idle_timeout: Duration,
    /// Connections served at once; more wait to be accepted. Keep it under the descriptor
    /// limit (`ulimit -n`).
    #[arg(long = "max-connections", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) max_connections: u32,
    #[command(flatten)]
    pub(crate) egress: EgressArgs,
    /// How long an `Idempotency-Key` of `POST /v1/jobs` stays claimed by a request whose
    /// process vanished (killed, crashed) before a repeat takes it over and enqueues again
    /// (at least 100ms; a live request renews its claim every third of it).
    #[arg(
        long = "idempotency-recovery-window",
        default_value = "30s",
        value_parser = parse_recovery_window
    )]
    pub(crate) idempotency_recovery_window: Duration,
    #[command(flatten)]
    pub(crate) housekeeping: HousekeepingArgs,
}

fn parse_recovery_window(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    let min = redrive_service::MIN_IDEMPOTENCY_RECOVERY_WINDOW;
    if d < min {
        return Err(format!("{s:?} is shorter than the minimum {min:?}"));
    }
    if d >= Duration::from_secs(24 * 60 * 60) {
        return Err(format!(
            "{s:?} must be shorter than the 24h the keys are kept"
        ));
    }
    Ok(d)
}

/// `redrive psp-sim`.
#[derive(Debug, Args)]
pub(crate) struct PspSimArgs {
    /// Address to listen on, e.g. 127.0.0.1:8081 or localhost:8081 (port 0 picks one and
    /// prints it).
    #[arg(long, default_value = "127.0.0.1:8081", value_parser = parse_addr)]
    pub(crate) addr: std::net::SocketAddr,
    /// Share of requests answered 500/502/503 (0..1).
    #[arg(long = "error-rate")]
    pub(crate) error_rate: Option<f64>,
    /// Beyond this many requests per second, answer 429.
    #[arg(long = "rate-limit")]
    pub(crate) rate_limit: Option<f64>,
    /// Seconds sent as Retry-After with every 429 (omit: no header).
    #[arg(long = "retry-after")]
    pub(crate) retry_after: Option<u64>,
    /// Outage window START+LENGTH, e.g. `5s+5s`: every request in it gets 503.
    #[arg(long)]
    pub(crate) outage: Option<String>,
    /// Latency added to every answer.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) latency: Option<Duration>,
    /// Share of charges whose answer is delayed past any client timeout.
    #[arg(long = "timeout-after-commit")]
    pub(crate) timeout_after_commit: Option<f64>,
    /// Seed that makes the faults reproducible.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Share of authorisations declined with a 402 carrying the network's advice.
    #[arg(long = "decline-rate")]
    pub(crate) decline_rate: Option<f64>,
    /// The declines' kinds and weights, e.g. `visa1:0.2,visa2:0.5,mc24:0.3` (kinds: visa1..visa4,
    /// mc01, mc02, mc03, mc04, mc21, mc24..mc30; default: all visa2).
    #[arg(long = "decline-mix")]
    pub(crate) decline_mix: Option<String>,
    /// `on` (the default): the ledger itself refuses a second charge for a key. `off`: only
    /// the idempotency layer in front of the charges protects them, as at a real PSP, so
    /// `duplicate_effects` in `/_sim/stats` shows what the layer and the clients achieved.
    #[arg(long = "ledger-dedupe", default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub(crate) ledger_dedupe: bool,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

/// `redrive simulate`.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Model: `occ` (optimistic concurrency, the AWS blog's) or `capacity` (a PSP with a rate limit).
    #[arg(long, default_value = "occ")]
    pub(crate) model: String,
    /// Clients: one number, or a comma-separated sweep (`10,20,50`) (default 100; with
    /// `--scenario demo`, the workers: default the demo's 16).
    #[arg(long)]
    pub(crate) clients: Option<String>,
    /// Strategies to compare (repeatable); default: all.
    #[arg(long = "strategy")]
    pub(crate) strategies: Vec<String>,
    /// Seeded runs averaged per cell (default 100; with `--scenario demo`, 5).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) runs: Option<u32>,
    /// Seed of the first run.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Write the results as CSV to this file.
    #[arg(long)]
    pub(crate) csv: Option<PathBuf>,
    /// Write a chart to this file (`.svg` or `.png`).
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
    /// Backoff base (default: occ 5ms, capacity 1s).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) base: Option<Duration>,
    /// Backoff cap (default: occ 2s, capacity 30s).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) cap: Option<Duration>,
    /// Capacity model: requests per second the PSP serves (default 50).
    #[arg(long)]
    pub(crate) capacity: Option<f64>,
    /// Capacity model: requests the PSP's token bucket holds (default: 100 ms of capacity).
    #[arg(long)]
    pub(crate) burst: Option<u32>,
    /// Capacity model: the status beyond capacity, 429 or 503 (default 429).
    #[arg(long)]
    pub(crate) overload: Option<u16>,
    /// Capacity model: whole seconds sent as Retry-After beyond capacity, or `none` (default 1).
    #[arg(long = "retry-after")]
    pub(crate) retry_after: Option<String>,
    /// `--scenario fleet`: the share of the PSP's answers that are 5xx, 0 to 1 (default 0.1).
    #[arg(long = "error-rate")]
    pub(crate) error_rate: Option<f64>,
    /// Capacity model: outage window START+LENGTH (e.g. `0s+5s`): every request in it gets 503.
    #[arg(long)]
    pub(crate) outage: Option<String>,
    /// Capacity model: attempts per worker, the failed first call included (default 50).
    #[arg(long = "max-attempts")]
    pub(crate) max_attempts: Option<u32>,
    /// Capacity model: worker processes the clients are spread over, each with its own view
    /// of the flow control (breaker window, send slots) (default 1; with `--scenario fleet`,
    /// 3).
    #[arg(long)]
    pub(crate) processes: Option<u32>,
    /// Capacity model: the worker processes' clocks are off the true time by offsets spread
    /// evenly over -D..=+D (e.g. `2s`; default 0s).
    #[arg(long = "clock-skew", value_parser = parse_duration)]
    pub(crate) clock_skew: Option<Duration>,
    /// Capacity model: predict a whole run of a named scenario instead of the herd: `demo`
    /// (what `redrive demo` does by default: its queue, workers, policies and PSP) or `fleet`
    /// (3 `redrive work --concurrency 16` processes with the default policies, 1,000 charges,
    /// a PSP at 50/s with `Retry-After: 1`, 10% 5xx and an outage 4s+5s; `--capacity`,
    /// `--retry-after` and `--error-rate` change its PSP).
    #[arg(long)]
    pub(crate) scenario: Option<String>,
    /// Capacity model: run the `fleet` scenario (implied) with this named policy of the
    /// policies in force (`--policies FILE`, else the latest stored version, else the
    /// built-in presets) instead of the default `payment`.
    #[arg(long)]
    pub(crate) policy: Option<String>,
    /// With `--scenario fleet`: the dependency whose breaker and rate settings of the
    /// policies in force the scenario uses (default `psp`: `[breaker.psp]`, else
    /// `[breaker.default]`).
    #[arg(long)]
    pub(crate) dependency: Option<String>,
}

/// `redrive demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Keep the dashboard up afterwards.
    #[arg(long)]
    pub(crate) serve: bool,
    /// Where `--serve` listens (loopback only).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = parse_loopback)]
    pub(crate) addr: std::net::SocketAddr,
    /// Charges to make.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) charges: u64,
    /// Jobs run at once.
    #[arg(long, default_value_t = 16, value_parser = parse_concurrency)]
    pub(crate) concurrency: usize,
    /// Seed of the simulator's faults and the workers' jitter.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// A healthy PSP (no faults): for measuring throughput.
    #[arg(long = "no-faults")]
    pub(crate) no_faults: bool,
    /// Keep the simulator's idempotency layer with `--no-faults` too (the bad day has it
    /// unless `--no-sim-idempotency-layer`), to measure throughput with the layer in front of
    /// the charges.
    #[arg(long = "sim-idempotency-layer")]
    pub(crate) sim_idempotency_layer: bool,
    /// Leave the simulator's idempotency layer out on the bad day too. The simulator's ledger
    /// runs without its own dedupe, as a real PSP's would, so nothing then stops a repeated
    /// charge: the answers lost after the charge become double charges, the report says so
    /// and the demo fails. Shows what the layer is for, and that the check can fail.
    #[arg(
        long = "no-sim-idempotency-layer",
        conflicts_with = "sim_idempotency_layer"
    )]
    pub(crate) no_sim_idempotency_layer: bool,
    /// Where the charts go.
    #[arg(long, default_value = "redrive-demo")]
    pub(crate) out: std::path::PathBuf,
    /// Give up after this many seconds.
    #[arg(long = "timeout", default_value_t = 180)]
    pub(crate) timeout_s: u64,
    /// Print the report as one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// An address to listen on: `IP:PORT`, or `NAME:PORT` resolved (e.g. `localhost:9090`; the
/// first address the name resolves to).
pub(crate) fn parse_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Ok(a);
    }
    let bad = || format!("{s:?} is not an address like 127.0.0.1:8080 or localhost:8080");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    use std::net::ToSocketAddrs;
    let mut addrs: Vec<std::net::SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{s:?}: cannot resolve {host}: {e}"))?
        .collect();
    // Prefer IPv4 (`localhost` → 127.0.0.1), as most clients try it first.
    addrs.sort_by_key(|a| !a.is_ipv4());
    addrs.into_iter().next().ok_or_else(bad)
}

fn parse_loopback(s: &str) -> Result<std::net::SocketAddr, String> {
    match parse_addr(s) {
        Ok(a) if a.ip().is_loopback() => Ok(a),
        Ok(_) => Err(format!(
            "{s:?} is not a loopback address (the demo serves without a token)"
        )),
        Err(e) => Err(e),
    }
}

fn parse_concurrency(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number from 1 to 10000")),
    }
}

/// `redrive bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Jobs enqueued and drained per run.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) jobs: u64,
    /// Drain concurrency (repeatable); default: 1, 8 and 64.
    #[arg(long)]
    pub(crate) concurrency: Vec<u32>,
    /// Producers enqueueing at once, each in batches of 5,000 jobs (one transaction per
    /// batch); default: 1 on SQLite (one writer), 4 on PostgreSQL (a server process each).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) producers: Option<u32>,
    /// Jobs already waiting in the queue before each timed drain (written in bulk by the
    /// database, due before the drained ones): the drain takes `--jobs` from the top of this
    /// deep queue.
    #[arg(long, default_value_t = 0)]
    pub(crate) backlog: u64,
    /// Finished jobs (succeeded, one attempt each) already in the tables: what a retention
    /// window leaves behind (written in bulk by the database).
    #[arg(long, default_value_t = 0)]
    pub(crate) history: u64,
    /// Size of each job's payload in bytes (its JSON text, `{"pad":"xx…"}`); default: `{}`.
    #[arg(long = "payload-bytes", value_parser = clap::value_parser!(u64).range(2..=1_048_576))]
    pub(crate) payload_bytes: Option<u64>,
    /// Instead of the in-process drains: `redrive work --until-idle` processes draining the
    /// same PostgreSQL queue at once, each at the first `--concurrency` (default 64); total
    /// drain, each one's share and peak resident memory (repeatable, e.g. 1, 4 and 8).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) processes: Vec<u32>,
    /// Also drain the same jobs with the batched claim and fenced completion written as plain
    /// SQL (no attempt rows, no runtime), in the same process: the practical limit here.
    #[arg(long)]
    pub(crate) ceiling: bool,
    /// Instead of the drains: claims across N queues. A worker of every queue drains
    /// `--jobs` jobs spread over N queues and the same jobs in one queue (medians of 3
    /// rounds), and one claim of every queue is timed with 1, 1,000 and 100,000 queue names.
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=1_000_000))]
    pub(crate) queues: Option<u64>,
    /// Instead of the drains: enqueue through the HTTP API. A service started in this process
    /// on a temporary database (as `--db`'s backend) takes `--jobs` keyed `noop` jobs as
    /// `POST /v1/jobs/batch` requests of 1,000 over real HTTP on loopback, from `--producers`
    /// clients at once (default 2); jobs/s of 5 runs (each on a fresh database) and their
    /// median.
    #[arg(long = "api-batch", conflicts_with_all = ["queues", "processes", "ceiling", "backlog", "history", "concurrency"])]
    pub(crate) api_batch: bool,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Parses `250ms`, `30s`, `5m`, `1h` into a [`Duration`].
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    redrive_policy::parse_duration(s).map_err(|e| e.to_string())
}

/// A duration above zero (e.g. `10s`).
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: must be more than zero"));
    }
    Ok(d)
}

/// A `--public-host` value: `host[:port]`.
fn parse_public_host(s: &str) -> Result<String, String> {
    redrive_service::validate_public_host(s)
        .map(|()| s.to_owned())
        .map_err(|e| match e {
            redrive_service::ServiceError::InvalidPublicHost { reason, .. } => reason.to_owned(),
            other => other.to_string(),
        })
}

fn parse_rfc3339(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("expected an RFC 3339 time like 2026-12-02T10:00:00Z: {e}"))
}

// ===== operator controls: queue and dependency pauses, forced breakers, run now, bulk
// filters, audit =====

/// The filter and output flags every bulk operator action takes (`dead replay`, `dead purge`,
/// `cancel`, `run-now`).
#[derive(Debug, Clone, Args)]
pub(crate) struct BulkArgs {
    /// Every job the action applies to (narrowed by the filters, if any).
    #[arg(long)]
    pub(crate) all: bool,
    /// Only jobs of this queue.
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// Only jobs of this kind.
    #[arg(long)]
    pub(crate) kind: Option<String>,
    /// Only jobs of this dependency.
    #[arg(long)]
    pub(crate) dependency: Option<String>,
    /// Only dead jobs with this dead reason (`permanent`, `attempts_exhausted`, …).
    #[arg(long = "reason", value_name = "DEAD_REASON")]
    pub(crate) dead_reason: Option<String>,
    /// Only jobs whose last error has this signature (digits and ids masked, as in the
    /// dashboard's dead-letter groups: `charge <id> declined (code N)`).
    #[arg(long)]
    pub(crate) signature: Option<String>,
    /// Print what would change, change nothing.
    #[arg(long = "dry-run")]
    pub(crate) dry_run: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive breakers`: list them, or `force` one.
#[derive(Debug, Args)]
pub(crate) struct BreakersArgs {
    #[command(subcommand)]
    pub(crate) command: Option<BreakersCommand>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive breakers ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum BreakersCommand {
    /// Force a dependency's breaker open or closed for the whole fleet, or hand it back to the
    /// machine (`auto`).
    Force(ForceArgs),
}

/// `redrive breakers force NAME open|closed|auto`.
#[derive(Debug, Args)]
pub(crate) struct ForceArgs {
    /// The dependency.
    pub(crate) name: String,
    /// `open` (no call at all, probes included), `closed` (every call goes, whatever the
    /// failure rate) or `auto`.
    #[arg(value_parser = ["open", "closed", "auto"])]
    pub(crate) mode: String,
    /// Print the row after it as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive queue ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Workers stop claiming from the queue (running jobs finish).
    Pause(QueueNameArgs),
    /// Workers claim from the queue again.
    Resume(QueueNameArgs),
    /// The paused queues.
    List(JsonArgs),
}

/// A queue to pause or resume.
#[derive(Debug, Args)]
pub(crate) struct QueueNameArgs {
    /// The queue.
    pub(crate) queue: String,
    /// Print the result as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive dependency ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DependencyCommand {
    /// Hold every call to the dependency, fleet-wide, until `--until` or until resumed (its
    /// jobs are not claimed meanwhile).
    Pause(DependencyPauseArgs),
    /// Lift a pause.
    Resume(DependencyNameArgs),
}

/// `redrive dependency pause`.
#[derive(Debug, Args)]
pub(crate) struct DependencyPauseArgs {
    /// The dependency.
    pub(crate) name: String,
    /// Until this RFC 3339 time, or for this long (`30m`); default: until resumed.
    #[arg(long, value_parser = parse_until)]
    pub(crate) until: Option<Until>,
    /// Print the row after it as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive dependency resume`.
#[derive(Debug, Args)]
pub(crate) struct DependencyNameArgs {
    /// The dependency.
    pub(crate) name: String,
    /// Print the row after it as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The end of a pause: a time, or a duration from now.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    /// At this time.
    At(chrono::DateTime<chrono::Utc>),
    /// This long from now.
    In(Duration),
}

fn parse_until(s: &str) -> Result<Until, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(Until::At(t.with_timezone(&chrono::Utc)));
    }
    match redrive_policy::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(Until::In(d)),
        _ => Err(format!(
            "{s:?} is neither an RFC 3339 time (2026-12-02T10:00:00Z) nor a duration above zero (30m)"
        )),
    }
}

/// `redrive run-now`: ids, or a filter.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(true)
    .args(["ids", "all", "queue", "kind", "dependency", "dead_reason", "signature"])))]
pub(crate) struct RunNowArgs {
    /// Job ids.
    #[arg(value_name = "ID")]
    pub(crate) ids: Vec<i64>,
    #[command(flatten)]
    pub(crate) bulk: BulkArgs,
}

/// `redrive audit`.
#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// At most this many rows.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) limit: u32,
    /// Only rows older than this id (keyset pagination).
    #[arg(long)]
    pub(crate) before: Option<i64>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

// ===== Retention and schedules (issue 17, items 4 and 5) =====

/// The workers' housekeeping (`work`, `serve --workers`): retention of finished jobs and the
/// scheduler of periodic jobs.
#[derive(Debug, Clone, Args)]
pub(crate) struct HousekeepingArgs {
    /// Delete succeeded jobs this long after they finished (`off`: keep them).
    #[arg(long = "retention-succeeded", value_name = "AGE", default_value = "7d", value_parser = parse_retention)]
    pub(crate) retention_succeeded: Age,
    /// Delete cancelled jobs this long after they were cancelled (`off`: keep them).
    #[arg(long = "retention-cancelled", value_name = "AGE", default_value = "7d", value_parser = parse_retention)]
    pub(crate) retention_cancelled: Age,
    /// Delete dead jobs this long after they died (`off`: keep them).
    #[arg(long = "retention-dead", value_name = "AGE", default_value = "30d", value_parser = parse_retention)]
    pub(crate) retention_dead: Age,
    /// How often the pruner (one per fleet, by a lease in the store) starts a round.
    #[arg(long = "prune-every", value_name = "INTERVAL", default_value = "1m", value_parser = parse_positive_duration)]
    pub(crate) prune_every: Duration,
    /// Run no pruner in this process (finished jobs are kept unless another process prunes).
    #[arg(long = "no-prune")]
    pub(crate) no_prune: bool,
    /// Run no scheduler in this process (schedules tick only where another process runs one).
    #[arg(long = "no-scheduler")]
    pub(crate) no_scheduler: bool,
}

/// A retention age (`None`: `off`, kept for ever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Age(pub(crate) Option<Duration>);

/// An age, or `off` (never).
fn parse_retention(s: &str) -> Result<Age, String> {
    if matches!(s, "off" | "never") {
        return Ok(Age(None));
    }
    parse_positive_duration(s).map(|d| Age(Some(d)))
}

/// `redrive prune`.
#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
    /// Delete jobs finished longer ago than this (default: 7d for succeeded and cancelled,
    /// 30d for dead).
    #[arg(long = "older-than", value_parser = parse_duration)]
    pub(crate) older_than: Option<Duration>,
    /// Only jobs in this state: succeeded, cancelled or dead (repeatable; default all three).
    #[arg(long = "state", value_name = "STATE")]
    pub(crate) states: Vec<String>,
    /// Print what would be deleted (jobs and attempts per state), change nothing.
    #[arg(long = "dry-run")]
    pub(crate) dry_run: bool,
    /// Jobs per batch (one short transaction each).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) batch: u32,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive schedule ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Add a schedule, or replace the one of that name (a replacement with the same cron
    /// expression keeps its place).
    Add(ScheduleAddArgs),
    /// List the schedules with their next and last ticks.
    List(JsonArgs),
    /// Remove schedules (their jobs stay). Unknown names are named, exit 1.
    Remove(ScheduleRemoveArgs),
}

/// `redrive schedule add`.
#[derive(Debug, Args)]
pub(crate) struct ScheduleAddArgs {
    /// The schedule's name (its jobs' keys are `schedule:NAME:TICK`).
    pub(crate) name: String,
    /// Cron expression in UTC with seconds: `SEC MIN HOUR DOM MON DOW [YEAR]` (e.g.
    /// `0 0 2 * * *` daily at 02:00; a 5-field crontab line runs at second 0).
    #[arg(long)]
    pub(crate) cron: String,
    /// Queue of each tick's job.
    #[arg(long)]
    pub(crate) queue: String,
    /// Kind of each tick's job.
    #[arg(long)]
    pub(crate) kind: String,
    /// JSON payload, or `@FILE` to read it from a file.
    #[arg(long)]
    pub(crate) payload: Option<String>,
    /// Retry policy name.
    #[arg(long)]
    pub(crate) policy: Option<String>,
    /// Dependency (breaker) name; `http` jobs default to the URL's host.
    #[arg(long)]
    pub(crate) dependency: Option<String>,
    /// Priority: lower runs first.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) priority: Option<i32>,
    /// Ticks missed while no scheduler ran: `skip`, `last` (run the latest once; the
    /// default) or `all` (at most the latest 100).
    #[arg(long, default_value = "last")]
    pub(crate) missed: String,
    /// Print the schedule as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redrive schedule remove`.
#[derive(Debug, Args)]
pub(crate) struct ScheduleRemoveArgs {
    /// Schedule names.
    #[arg(required = true, value_name = "NAME")]
    pub(crate) names: Vec<String>,
}
