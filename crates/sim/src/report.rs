//! The report as a table for people and as CSV for spreadsheets.

use std::fmt::Write;

use crate::sweep::Report;

fn ms(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.1}s", x / 1e3)
    } else if x >= 1_000.0 {
        format!("{:.2}s", x / 1e3)
    } else {
        format!("{x:.0}ms")
    }
}

fn num(x: f64) -> String {
    if x >= 100.0 || x == x.round() {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// The table: one row per strategy and client count.
///
/// Columns: calls, wasted calls, completion time mean/p50/p99/max over the runs, peak
/// requests per 100 ms (mean of the runs' peaks), clients that gave up, and calls avoided by
/// a breaker or a pause.
pub fn render_table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model {}: {}; {} run{} per row (seeds {}..{})",
        r.model,
        r.parameters,
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        r.seed,
        r.seed.wrapping_add(u64::from(r.runs) - 1)
    );
    if let Some(c) = r.capacity_per_100ms {
        let _ = writeln!(
            out,
            "t = 0: every worker's call has just failed at once; the PSP serves {} requests per 100 ms",
            num(c)
        );
    }
    let mut header = vec![
        "strategy",
        "clients",
        "calls",
        "wasted",
        "time mean",
        "p50",
        "p99",
        "max",
        "peak/100ms",
    ];
    let capacity = r.capacity_per_100ms.is_some();
    if capacity {
        header.extend(["x capacity", "failed", "blocked"]);
    }
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for c in &r.cells {
        let mut row = vec![
            c.strategy.clone(),
            c.clients.to_string(),
            num(c.calls),
            num(c.wasted),
            ms(c.completion_ms.mean),
            ms(c.completion_ms.p50),
            ms(c.completion_ms.p99),
            ms(c.completion_ms.max),
            num(c.peak_per_100ms),
        ];
        if let Some(cap) = r.capacity_per_100ms {
            row.push(format!("{:.1}x", c.peak_per_100ms / cap));
            row.push(num(c.failed));
            row.push(num(c.blocked));
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i == 0 {
                    format!("{s:<w$}", w = widths[i])
                } else {
                    format!("{s:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "  {}", line.join("  "));
    }
    out
}

/// CSV with a header line; times in milliseconds.
pub fn to_csv(r: &Report) -> String {
    let mut out = String::from(
        "model,strategy,clients,runs,calls,wasted,completion_mean_ms,completion_p50_ms,\
         completion_p99_ms,completion_max_ms,peak_per_100ms,peak_max,failed,blocked\n",
    );
    for c in &r.cells {
        let _ = writeln!(
            out,
            "{},\"{}\",{},{},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3},{:.2},{},{:.2},{:.2}",
            r.model,
            c.strategy.replace('"', "\"\""),
            c.clients,
            c.runs,
            c.calls,
            c.wasted,
            c.completion_ms.mean,
            c.completion_ms.p50,
            c.completion_ms.p99,
            c.completion_ms.max,
            c.peak_per_100ms,
            c.peak_max,
            c.failed,
            c.blocked
        );
    }
    out
}
