//! `redrive policy`: `show` (the delays a policy will produce, attempt by attempt), `apply`
//! (a file checked and stored as the fleet's next version, with a diff and an audit row),
//! `list` (the policies in force) and `history` (the stored versions).

use crate::out::{out, outln};
use std::process::ExitCode;

use anyhow::Context;
use redrive_policy::{
    Backoff, ExplainRow, Explanation, Jitter, PolicyError, PolicySet, RetryPolicy, explain,
    format_duration,
};
use redrive_store::PolicyVersion;
use serde_json::json;

use crate::args::{
    Global, PolicyApplyArgs, PolicyCommand, PolicyHistoryArgs, PolicyListArgs, PolicyShowArgs,
};
use crate::cmd::queue::{block_on, db_now, open, open_existing};
use crate::error::usage;
use crate::policies::{self, Source};

pub(crate) fn run(global: &Global, cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::Show(args) => show(global, args),
        PolicyCommand::Apply(args) => apply(global, args),
        PolicyCommand::List(args) => list(global, args),
        PolicyCommand::History(args) => history(global, args),
    }
}

fn show(global: &Global, args: PolicyShowArgs) -> anyhow::Result<ExitCode> {
    let set = show_set(global, &args)?;
    let policy = resolve(&set, &args)?;
    let e = explain(&policy, args.samples, args.seed);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        out!("{}", render(&policy, &e));
        out!("{}", render_declines(&policy, set.quotas()));
    }
    Ok(ExitCode::SUCCESS)
}

/// The policies `policy show` looks in: `--file`, else `--policy-version N`, else `--policies`,
/// else the latest stored version, else the built-in presets.
fn show_set(global: &Global, a: &PolicyShowArgs) -> anyhow::Result<PolicySet> {
    if let Some(path) = &a.file {
        return policies::load_file(path);
    }
    if let Some(n) = a.policy_version {
        return stored_version(global, n)?.set();
    }
    policies::source_without_store(global)?.set()
}

/// Stored version `n`, or a usage error saying which versions there are.
fn stored_version(global: &Global, n: i64) -> anyhow::Result<Source> {
    block_on_value(async move {
        let store = open_existing(global).await?;
        match store.policy_version(n).await? {
            Some(v) => Ok(Source::Stored(v)),
            None => {
                let latest = store.policy_version_number().await?;
                Err(usage(match latest {
                    Some(l) => format!(
                        "--policy-version {n}: no such version (the stored ones are 1 to {l})"
                    ),
                    None => format!(
                        "--policy-version {n}: no version of the policies is stored (`redrive policy apply FILE` stores one)"
                    ),
                }))
            }
        }
    })
}

/// Runs a future that returns a value on a fresh runtime.
fn block_on_value<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(f)
}

/// `redrive policy apply FILE`: checks the file as `--policies` would be (an invalid one is a
/// usage error, exit 2, and nothing is stored), shows its diff against the latest stored
/// version, and stores it as the next version with an audit row, or says it is unchanged.
fn apply(global: &Global, a: PolicyApplyArgs) -> anyhow::Result<ExitCode> {
    let name = a.file.display().to_string();
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read policy file {name}"))?;
    policies::check_document(&name, &text)?;
    if let Some(c) = &a.comment
        && c.len() > redrive_store::MAX_POLICY_COMMENT
    {
        return Err(usage(format!(
            "--comment: {} bytes; at most {}",
            c.len(),
            redrive_store::MAX_POLICY_COMMENT
        )));
    }
    block_on(async move {
        let store = open(global).await?;
        let latest = store.latest_policy_version().await?;
        let (old_name, old_text) = match &latest {
            Some(v) => (format!("v{} (stored)", v.version), v.body.as_str()),
            None => ("(none stored)".to_owned(), ""),
        };
        let diff = crate::diff::unified(&old_name, old_text, &name, &text);
        if a.dry_run {
            if a.json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "dry_run": true,
                        "changed": !diff.is_empty(),
                        "latest": latest.as_ref().map(|v| v.version),
                        "diff": diff,
                    }))?
                );
            } else if diff.is_empty() {
                outln!(
                    "unchanged: {name} is the stored v{} already",
                    latest.map_or(0, |v| v.version)
                );
            } else {
                out!("{diff}");
                outln!(
                    "would store v{} (dry run: nothing stored)",
                    latest.map_or(1, |v| v.version + 1)
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        let now = db_now(&store).await;
        let who = crate::cmd::operator::cli_actor();
        let applied = store
            .put_policy_version(&text, &who, a.comment.as_deref(), now)
            .await
            .map_err(|e| match e {
                redrive_store::StoreError::Invalid { .. } => usage(e.to_string()),
                other => other.into(),
            })?;
        let v = &applied.version;
        if a.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "created": applied.created,
                    "version": version_view(v),
                    "diff": diff,
                }))?
            );
        } else if !applied.created {
            outln!("unchanged: {name} is the stored v{} already", v.version);
        } else {
            out!("{diff}");
            outln!(
                "stored policies v{} ({}, sha256 {}); running workers pick it up within {}",
                v.version,
                v.applied_by,
                short_digest(&v.digest),
                format_duration(crate::policy_watch::POLICY_POLL)
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `redrive policy list`: the policies in force, one a line.
fn list(global: &Global, a: PolicyListArgs) -> anyhow::Result<ExitCode> {
    let source = match a.policy_version {
        Some(n) => stored_version(global, n)?,
        None => policies::source_without_store(global)?,
    };
    let set = source.set()?;
    let described = match &source {
        Source::Stored(v) => format!(
            "policies v{} (applied {} by {})",
            v.version,
            v.applied_at.format("%Y-%m-%d %H:%M:%S UTC"),
            v.applied_by
        ),
        Source::File { path, .. } => format!("policies from {}", path.display()),
        Source::Builtin => "the built-in policies (none stored)".into(),
    };
    if a.json {
        let rows: Vec<_> = set
            .policies()
            .map(|p| {
                json!({
                    "name": p.name(),
                    "max_attempts": p.total_max_attempts(),
                    "retry_attempts": p.retry().max_attempts(),
                    "jitter": p.retry().jitter().to_string(),
                    "deadline_ms": p.deadline().map(|d| d.as_millis()),
                    "builtin": RetryPolicy::PRESETS.contains(&p.name()),
                })
            })
            .collect();
        let version = match &source {
            Source::Stored(v) => Some(v.version),
            _ => None,
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"source": source.name(), "version": version, "policies": rows})
            )?
        );
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{described}:");
    for p in set.policies() {
        outln!(
            "  {:<16} {} attempts ({} retry{}), jitter {}{}{}",
            p.name(),
            p.total_max_attempts(),
            p.retry().max_attempts(),
            p.defer()
                .map(|d| format!(" + {} defer", d.max_defers()))
                .unwrap_or_default(),
            p.retry().jitter(),
            p.deadline()
                .map(|d| format!(", deadline {}", format_duration(d)))
                .unwrap_or_default(),
            if RetryPolicy::PRESETS.contains(&p.name()) {
                " (preset)"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `redrive policy history`: the stored versions, newest first.
fn history(global: &Global, a: PolicyHistoryArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let versions = store.policy_versions(a.limit).await?;
        if a.json {
            let rows: Vec<_> = versions.iter().map(version_view).collect();
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({"versions": rows}))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        if versions.is_empty() {
            outln!("no version of the policies is stored (`redrive policy apply FILE` stores one)");
            return Ok(ExitCode::SUCCESS);
        }
        outln!(
            "{:<8} {:<20} {:<16} {:<4} {:<12} comment",
            "version",
            "applied (UTC)",
            "by",
            "via",
            "sha256"
        );
        for v in &versions {
            outln!(
                "{:<8} {:<20} {:<16} {:<4} {:<12} {}",
                format!("v{}", v.version),
                v.applied_at.format("%Y-%m-%d %H:%M:%S"),
                v.applied_by,
                v.via,
                short_digest(&v.digest),
                v.comment.as_deref().unwrap_or("")
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// A version without its body, for JSON.
fn version_view(v: &PolicyVersion) -> serde_json::Value {
    json!({
        "version": v.version,
        "applied_at": v.applied_at,
        "applied_by": v.applied_by,
        "via": v.via,
        "digest": v.digest,
        "comment": v.comment,
    })
}

/// The first 12 hex digits of a digest.
fn short_digest(d: &str) -> &str {
    &d[..d.len().min(12)]
}

/// The decline rows of the decision table, with this policy's wait and the quotas in force.
fn render_declines(p: &RetryPolicy, quotas: &redrive_policy::QuotaRules) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "after a card decline (retry later = {}; per-card reattempt quotas {}):",
        format_duration(p.decline_retry_later()),
        quotas
            .iter()
            .filter(|(_, w)| !w.is_empty())
            .map(|(n, ws)| format!(
                "{n} {}",
                ws.iter()
                    .map(|w| format!("{}/{}", w.max(), format_duration(w.window())))
                    .collect::<Vec<_>>()
                    .join(" + ")
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut rows: Vec<Vec<String>> = vec![
        ["advice", "rule", "then", "network rule"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
    ];
    for (advice, rule, then, why) in redrive_policy::DECLINE_ROWS {
        rows.push(vec![
            (*advice).to_owned(),
            (*rule).to_owned(),
            (*then).to_owned(),
            (*why).to_owned(),
        ]);
    }
    let widths: Vec<usize> = (0..4)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let _ = writeln!(
            out,
            "  {:<w0$}  {:<w1$}  {:<w2$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
    let stops: Vec<String> = quotas
        .card_stops()
        .map(|(n, d)| format!("{n} {}", format_duration(d)))
        .collect();
    let _ = writeln!(
        out,
        "card stops after visa category 1, MAC 03, MAC 21: {} (a stopped card's other jobs: {})",
        if stops.is_empty() {
            "none".to_owned()
        } else {
            stops.join(", ")
        },
        p.card_stop().as_str()
    );
    out
}

fn has_flags(a: &PolicyShowArgs) -> bool {
    a.base.is_some()
        || a.cap.is_some()
        || a.multiplier.is_some()
        || a.jitter.is_some()
        || a.attempts.is_some()
}

/// NAME, `--file`, or the ad-hoc flags (which also override a named policy's retry phase).
fn resolve(set: &PolicySet, a: &PolicyShowArgs) -> anyhow::Result<RetryPolicy> {
    let policy = match (&a.name, &a.file) {
        (Some(name), _) => set.get(name).map_err(|e| usage(e.to_string()))?.clone(),
        (None, Some(path)) => {
            let own: Vec<_> = set
                .policies()
                .filter(|p| !RetryPolicy::PRESETS.contains(&p.name()))
                .collect();
            match own.as_slice() {
                [one] => (*one).clone(),
                [] => return Err(usage(format!("{} defines no policy", path.display()))),
                many => {
                    let names: Vec<_> = many.iter().map(|p| p.name()).collect();
                    return Err(usage(format!(
                        "{} defines several policies ({}); name the one to show",
                        path.display(),
                        names.join(", ")
                    )));
                }
            }
        }
        (None, None) if has_flags(a) => RetryPolicy::builder("custom")
            .build()
            .map_err(|e| usage(e.to_string()))?,
        (None, None) => {
            return Err(usage(
                "name a policy (payment, background, classic), give --file, or give --base/--cap/--multiplier/--jitter/--attempts",
            ));
        }
    };
    if has_flags(a) {
        return apply_flags(policy, a).map_err(|e| usage(flag_message(e)));
    }
    Ok(policy)
}

fn apply_flags(p: RetryPolicy, a: &PolicyShowArgs) -> Result<RetryPolicy, PolicyError> {
    let old = p.retry().backoff().clone();
    let mut b = p.into_builder();
    if a.base.is_some() || a.cap.is_some() || a.multiplier.is_some() {
        let (base, mult) = (old.base(), old.multiplier().unwrap_or(2.0));
        b = b.with_backoff(
            Backoff::exponential()
                .with_base(a.base.unwrap_or(base))
                .with_multiplier(a.multiplier.unwrap_or(mult))
                .with_cap(a.cap.unwrap_or(old.cap()))
                .build()?,
        );
    }
    if let Some(j) = &a.jitter {
        b = b.with_jitter(j.parse::<Jitter>()?);
    }
    if let Some(n) = a.attempts {
        b = b.with_max_attempts(n);
    }
    b.build()
}

/// Names the flag rather than the policy field.
fn flag_message(e: PolicyError) -> String {
    match e {
        PolicyError::InvalidField {
            field,
            value,
            allowed,
        } => {
            let flag = match field.rsplit('.').next().unwrap_or(&field) {
                "base" => "--base",
                "cap" => "--cap",
                "multiplier" => "--multiplier",
                "jitter" => "--jitter",
                "max_attempts" => "--attempts",
                _ => return format!("invalid {field} = {value}: must be {allowed}"),
            };
            format!("invalid {flag} {value}: must be {allowed}")
        }
        other => other.to_string(),
    }
}

fn d(ms: u64) -> String {
    format_duration(std::time::Duration::from_millis(ms))
}

fn then(r: &ExplainRow) -> String {
    if r.dies_share >= 0.999 {
        return "dead".into();
    }
    let mut parts = vec![];
    let live = 1.0 - r.dies_share / r.reached_share.max(f64::EPSILON);
    let retry = r.in_process_share * live;
    let defer = (1.0 - r.in_process_share) * live;
    let pct = |x: f64| format!("{:.0}%", x * 100.0);
    if retry >= 0.999 {
        parts.push("retry in process".to_owned());
    } else if defer >= 0.999 {
        parts.push("defer".to_owned());
    } else {
        if retry > 0.0 {
            parts.push(format!("retry {}", pct(retry)));
        }
        if defer > 0.0 {
            parts.push(format!("defer {}", pct(defer)));
        }
        if r.dies_share > 0.0 {
            parts.push(format!("dead {}", pct(1.0 - live)));
        }
    }
    parts.join(" / ")
}

fn render(p: &RetryPolicy, e: &Explanation) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let defer = p.defer().map_or(0, |d| d.max_defers());
    let _ = writeln!(
        out,
        "policy {}: at most {} attempts ({} retry{}), jitter {}, in-process waits up to {}, Retry-After clamped to {}{}{}",
        e.policy,
        e.max_attempts_total,
        p.retry().max_attempts(),
        if defer > 0 {
            format!(" + {defer} defer")
        } else {
            String::new()
        },
        p.retry().jitter(),
        format_duration(p.retry().in_process_max_wait()),
        format_duration(p.retry().retry_after_max()),
        p.retry()
            .window()
            .map(|w| format!(", retry window {}", format_duration(w)))
            .unwrap_or_default(),
        p.deadline()
            .map(|w| format!(", deadline {}", format_duration(w)))
            .unwrap_or_default(),
    );
    let _ = writeln!(
        out,
        "{} samples (seed {}), every call failing with a 5xx; delays after each attempt:",
        e.samples, e.seed
    );
    let header = [
        "attempt",
        "phase",
        "nominal",
        "range",
        "p5",
        "p50",
        "p95",
        "elapsed p50",
        "then",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for r in &e.rows {
        if r.dies_share >= 0.999 || r.nominal_ms == 0 && r.p95_ms == 0 {
            rows.push(vec![
                r.attempt.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                then(r),
            ]);
            continue;
        }
        rows.push(vec![
            r.attempt.to_string(),
            r.phase.to_owned(),
            d(r.nominal_ms),
            format!("{}..{}", d(r.range_low_ms), d(r.range_high_ms)),
            d(r.p5_ms),
            d(r.p50_ms),
            d(r.p95_ms),
            d(r.elapsed_p50_ms),
            then(r),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == r.len() {
                    c.clone()
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "  {}", line.join("  ").trim_end());
    }
    let dead: Vec<String> = e
        .dead
        .iter()
        .map(|(reason, n)| {
            format!(
                "{reason} {:.0}%",
                f64::from(*n) * 100.0 / f64::from(e.samples)
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "dies after {} attempts (p50), {} after the first call (p50): {}",
        e.attempts_p50,
        d(e.total_p50_ms),
        dead.join(", ")
    );
    out
}
