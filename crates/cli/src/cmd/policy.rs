//! `redrive policy show`: the delays a policy will produce, attempt by attempt.

use crate::out::{out, outln};
use std::process::ExitCode;

use redrive_policy::{
    Backoff, ExplainRow, Explanation, Jitter, PolicyError, RetryPolicy, explain, format_duration,
};

use crate::args::{Global, PolicyCommand, PolicyShowArgs};
use crate::error::usage;
use crate::policies;

pub(crate) fn run(global: &Global, cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::Show(args) => show(global, args),
    }
}

fn show(global: &Global, args: PolicyShowArgs) -> anyhow::Result<ExitCode> {
    let policy = resolve(global, &args)?;
    let e = explain(&policy, args.samples, args.seed);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        out!("{}", render(&policy, &e));
        let set = match &args.file {
            Some(path) => policies::load_file(path)?,
            None => policies::load(global)?,
        };
        out!("{}", render_declines(&policy, set.quotas()));
    }
    Ok(ExitCode::SUCCESS)
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
fn resolve(global: &Global, a: &PolicyShowArgs) -> anyhow::Result<RetryPolicy> {
    let set = match &a.file {
        Some(path) => policies::load_file(path)?,
        None => policies::load(global)?,
    };
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
