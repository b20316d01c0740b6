//! The simulator's findings, asserted on seeded runs: the AWS post's (occ) and the second
//! seed's table (capacity).

use std::time::Duration;

use redrive_sim::{
    CapacityConfig, Model, OccConfig, Outage, Report, Strategy, SweepConfig, plot, render_table,
    run_once, sweep, to_csv,
};

fn occ_report(clients: Vec<u32>, runs: u32) -> Report {
    let cfg = SweepConfig::new(Model::Occ(OccConfig::default()), clients, runs, 1);
    sweep(&cfg, &|_| {}).unwrap()
}

fn capacity_report(model: CapacityConfig, strategies: &[&str], runs: u32) -> Report {
    let cfg = SweepConfig {
        strategies: strategies.iter().map(|s| s.parse().unwrap()).collect(),
        ..SweepConfig::new(Model::Capacity(model), vec![100], runs, 1)
    };
    sweep(&cfg, &|_| {}).unwrap()
}

#[test]
fn occ_reproduces_the_aws_findings_at_100_clients() {
    let r = occ_report(vec![100], 30);
    let c = |s: &str| r.cell(s, 100).unwrap();
    let (none, expo, full, equal, decorr) = (
        c("none"),
        c("exponential"),
        c("full"),
        c("equal"),
        c("decorrelated"),
    );
    // Jitter makes far fewer calls than plain exponential backoff…
    assert!(
        expo.calls > 2.0 * full.calls,
        "{} vs {}",
        expo.calls,
        full.calls
    );
    assert!(
        expo.calls > 1.5 * decorr.calls,
        "{} vs {}",
        expo.calls,
        decorr.calls
    );
    assert!(expo.calls > 1.5 * equal.calls);
    // …and plain exponential takes an order of magnitude longer.
    assert!(
        expo.completion_ms.mean > 10.0 * full.completion_ms.mean,
        "{} vs {}",
        expo.completion_ms.mean,
        full.completion_ms.mean
    );
    // No backoff at all: fastest, and the most calls.
    for other in [expo, full, equal, decorr] {
        assert!(
            none.completion_ms.mean < other.completion_ms.mean,
            "{}",
            other.strategy
        );
    }
    for other in r.cells.iter().filter(|x| x.strategy != "none") {
        assert!(none.calls > other.calls, "{}", other.strategy);
    }
    // Every client wrote exactly once.
    for cell in &r.cells {
        assert!(
            (cell.calls - cell.wasted - 100.0).abs() < 1e-6,
            "{}",
            cell.strategy
        );
        assert_eq!(cell.failed, 0.0);
    }
}

#[test]
fn occ_calls_grow_with_contention() {
    let r = occ_report(vec![10, 40], 10);
    for s in &r.strategies {
        assert!(
            r.cell(s, 40).unwrap().calls > r.cell(s, 10).unwrap().calls,
            "{s}"
        );
    }
}

#[test]
fn runs_are_deterministic_per_seed() {
    let model = Model::Occ(OccConfig::default());
    let full: Strategy = "full".parse().unwrap();
    assert_eq!(
        run_once(&model, &full, 30, 9).unwrap(),
        run_once(&model, &full, 30, 9).unwrap()
    );
    assert_ne!(
        run_once(&model, &full, 30, 9).unwrap(),
        run_once(&model, &full, 30, 10).unwrap()
    );
    let a = occ_report(vec![20], 5);
    let b = occ_report(vec![20], 5);
    assert_eq!(a, b);
}

#[test]
fn capacity_shows_waves_without_jitter_and_spread_with_it() {
    let r = capacity_report(
        CapacityConfig::default(),
        &["exponential", "full", "exponential+ra", "full+ra"],
        20,
    );
    let cap = r.capacity_per_100ms.unwrap();
    assert_eq!(cap, 5.0);
    let c = |s: &str| r.cell(s, 100).unwrap();
    let (expo, full) = (c("exponential"), c("full"));
    // Synchronised waves: the whole herd in one 100 ms, many times the capacity.
    assert!(expo.peak_per_100ms >= 10.0 * cap, "{}", expo.peak_per_100ms);
    // Full jitter: within a small factor of capacity.
    assert!(full.peak_per_100ms <= 5.0 * cap, "{}", full.peak_per_100ms);
    assert!(
        expo.wasted > 5.0 * full.wasted,
        "{} vs {}",
        expo.wasted,
        full.wasted
    );
    // Honouring Retry-After cuts wasted calls further.
    let (expo_ra, full_ra) = (c("exponential+ra"), c("full+ra"));
    assert!(
        full_ra.wasted < full.wasted / 2.0,
        "{} vs {}",
        full_ra.wasted,
        full.wasted
    );
    assert!(expo_ra.wasted < expo.wasted / 2.0);
    assert!(full_ra.blocked > 0.0);
    for cell in &r.cells {
        assert_eq!(cell.failed, 0.0, "{}", cell.strategy);
        assert!(
            (cell.calls - cell.wasted - 100.0).abs() < 1e-6,
            "{}",
            cell.strategy
        );
    }
}

#[test]
fn without_a_retry_after_header_ra_changes_nothing() {
    let model = CapacityConfig {
        retry_after: None,
        ..CapacityConfig::default()
    };
    let m = Model::Capacity(model);
    let a = run_once(&m, &"full".parse().unwrap(), 100, 4).unwrap();
    let b = run_once(&m, &"full+ra".parse().unwrap(), 100, 4).unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_breaker_blocks_calls_during_an_outage() {
    let model = CapacityConfig {
        outage: Some(Outage {
            start: Duration::ZERO,
            length: Duration::from_secs(20),
        }),
        ..CapacityConfig::default()
    };
    let r = capacity_report(model, &["full", "full+breaker"], 5);
    let (full, br) = (
        r.cell("full", 100).unwrap(),
        r.cell("full+breaker", 100).unwrap(),
    );
    assert!(br.blocked > 0.0);
    assert!(
        br.wasted < full.wasted / 2.0,
        "{} vs {}",
        br.wasted,
        full.wasted
    );
    // Nobody succeeds before the outage ends.
    for c in [full, br] {
        assert!(c.completion_ms.mean >= 20_000.0, "{}", c.completion_ms.mean);
    }
}

#[test]
fn attempts_run_out_for_immediate_retries() {
    let r = capacity_report(CapacityConfig::default(), &["none"], 3);
    let none = r.cell("none", 100).unwrap();
    assert!(none.failed > 0.0);
    // Each worker stops at 50 attempts: 49 calls after the failed first one at most.
    assert!(none.calls <= 100.0 * 49.0);
}

#[test]
fn occ_refuses_capacity_only_modifiers() {
    let m = Model::Occ(OccConfig::default());
    let e = run_once(&m, &"full+ra".parse().unwrap(), 10, 1).unwrap_err();
    assert!(e.to_string().contains("full+ra"), "{e}");
}

#[test]
fn tables_csv_and_charts() {
    let r = occ_report(vec![10, 20], 3);
    let t = render_table(&r);
    for s in &r.strategies {
        assert!(t.contains(s.as_str()), "{t}");
    }
    assert!(t.contains("peak/100ms"), "{t}");
    let csv = to_csv(&r);
    assert_eq!(csv.lines().count(), 1 + 7 * 2, "{csv}");
    assert!(csv.starts_with("model,strategy,clients,runs,calls,wasted,completion_mean_ms"));

    let dir = tempfile::tempdir().unwrap();
    for name in ["sweep.svg", "sweep.png"] {
        let p = dir.path().join(name);
        plot(&r, &p).unwrap();
        assert!(std::fs::metadata(&p).unwrap().len() > 1000);
    }
    let svg = std::fs::read_to_string(dir.path().join("sweep.svg")).unwrap();
    assert!(svg.contains("decorrelated"));
    let single = capacity_report(CapacityConfig::default(), &["exponential", "full"], 2);
    plot(&single, &dir.path().join("timeline.svg")).unwrap();
    let e = plot(&r, &dir.path().join("chart.jpg")).unwrap_err();
    assert!(e.to_string().contains(".svg or .png"), "{e}");
}

#[test]
fn bad_inputs_are_refused_with_their_name() {
    let m = Model::Occ(OccConfig::default());
    let full: Strategy = "full".parse().unwrap();
    let e = run_once(&m, &full, 0, 1).unwrap_err().to_string();
    assert!(e.contains("clients"), "{e}");
    let cfg = SweepConfig::new(m, vec![10], 0, 1);
    let e = sweep(&cfg, &|_| {}).unwrap_err().to_string();
    assert!(e.contains("runs"), "{e}");
    let bad = CapacityConfig {
        capacity: -1.0,
        ..CapacityConfig::default()
    };
    let e = run_once(&Model::Capacity(bad), &full, 10, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("capacity"), "{e}");
}

/// The demo's load chart draws the PSP's rate limit as a line, and leaves it out when there
/// is none.
#[test]
fn the_load_chart_draws_the_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    let chart = redrive_sim::LoadChart {
        title: "load".into(),
        ok: vec![3, 8, 12, 6],
        limited: vec![0, 0, 4, 1],
        failed: vec![1, 0, 0, 2],
        open: vec![(0.1, 0.2)],
        outage: Some((0.0, 0.2)),
        limit: Some(8.0),
    };
    let with = dir.path().join("with.svg");
    redrive_sim::plot_load(&chart, &with).unwrap();
    let svg = std::fs::read_to_string(&with).unwrap();
    assert!(svg.contains("rate limit (8 per 100 ms)"), "{svg}");
    let without = dir.path().join("without.svg");
    redrive_sim::plot_load(
        &redrive_sim::LoadChart {
            limit: None,
            ..chart
        },
        &without,
    )
    .unwrap();
    let svg = std::fs::read_to_string(&without).unwrap();
    assert!(!svg.contains("rate limit"), "{svg}");
    assert!(svg.contains("breaker open"), "{svg}");
}
