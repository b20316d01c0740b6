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

/// Calls that went through per second, and the share of calls wasted, between `from` and `to`
/// seconds of a run.
fn steady(r: &redrive_sim::RunResult, from: u64, to: u64) -> (f64, f64) {
    let (a, b) = (from as usize * 10, to as usize * 10);
    let calls: u32 = r.timeline[a..b].iter().sum();
    let served: u32 = r.served[a..b].iter().sum();
    let per_s = r.served_per_s(Duration::from_secs(from), Duration::from_secs(to));
    assert_eq!(per_s, f64::from(served) / (to - from) as f64);
    (per_s, f64::from(calls - served) / f64::from(calls.max(1)))
}

#[test]
fn an_adaptive_limit_learns_a_psp_at_50_per_s_within_10_percent() {
    // 3000 payments against 50/s: a minute of steady demand. The learned rate starts at what
    // got through before the first 429, then settles around the PSP's capacity.
    let model = Model::Capacity(CapacityConfig {
        in_process_max_wait: Duration::from_secs(1),
        ..CapacityConfig::default()
    });
    for seed in 1..=3 {
        let r = run_once(&model, &"full+adaptive".parse().unwrap(), 3000, seed).unwrap();
        let (per_s, wasted) = steady(&r, 30, 60);
        assert!((per_s - 50.0).abs() <= 5.0, "seed {seed}: {per_s:.1}/s");
        assert!(
            wasted < 0.1,
            "seed {seed}: {:.1}% of the calls wasted",
            wasted * 100.0
        );
        assert_eq!(r.failed, 0);
        // Without the limiter the PSP is about as busy, but a third of the calls are wasted.
        let r = run_once(&model, &"full".parse().unwrap(), 3000, seed).unwrap();
        let (_, wasted) = steady(&r, 30, 60);
        assert!(wasted > 0.2, "seed {seed}: {:.1}% wasted", wasted * 100.0);
    }
}

#[test]
fn an_adaptive_limit_learns_a_psp_at_50_per_s_with_the_default_in_process_wait() {
    let model = Model::Capacity(CapacityConfig::default());
    for seed in 1..=3 {
        let r = run_once(&model, &"full+adaptive".parse().unwrap(), 3000, seed).unwrap();
        let (per_s, wasted) = steady(&r, 30, 60);
        assert!((per_s - 50.0).abs() <= 5.0, "seed {seed}: {per_s:.1}/s");
        assert!(
            wasted < 0.1,
            "seed {seed}: {:.1}% of the calls wasted",
            wasted * 100.0
        );
    }
}

#[test]
fn a_configured_limit_at_capacity_keeps_the_fleet_under_it() {
    for processes in [1, 4] {
        let model = CapacityConfig {
            processes,
            ..CapacityConfig::default()
        };
        let r = capacity_report(model, &["full", "full+limit", "full+ra+limit"], 5);
        let cap = r.capacity_per_100ms.unwrap();
        let burst = f64::from(redrive_policy::DEFAULT_RATE_BURST);
        for s in ["full+limit", "full+ra+limit"] {
            let c = r.cell(s, 100).unwrap();
            // Send slots at the PSP's rate: at most its capacity (and the limiter's burst) per
            // 100 ms, almost nothing wasted, and done in about clients / capacity.
            assert!(
                f64::from(c.peak_max) <= cap + burst,
                "{processes} {s}: {}",
                c.peak_max
            );
            assert!(c.wasted <= 1.0, "{processes} {s}: {}", c.wasted);
            assert!(
                c.completion_ms.max <= 2_500.0,
                "{processes} {s}: {:?}",
                c.completion_ms
            );
            assert_eq!(c.failed, 0.0);
        }
        let full = r.cell("full", 100).unwrap();
        assert!(
            full.wasted > 20.0 && full.peak_per_100ms > 2.0 * cap,
            "{full:?}"
        );
    }
}
