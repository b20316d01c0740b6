//! `redrive psp-sim`: the PSP simulator on a real socket, until Ctrl-C.
//!
//! Prints one line, `listening on http://ADDR` (the address actually bound),
//! to stdout. The outage window of `--outage START+LENGTH` counts from the
//! server's start; `POST /_sim/faults` changes the faults while it runs.

use std::io::Write;
use std::process::ExitCode;

use redrive_psp_sim::{Faults, FaultsError, PspSim, parse_outage};

use crate::args::{Global, PspSimArgs};
use crate::error::usage;

pub(crate) fn run(_global: &Global, args: PspSimArgs) -> anyhow::Result<ExitCode> {
    let faults = faults(&args).map_err(|e| usage(flag_message(&e)))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let sim = PspSim::builder()
            .faults(faults)
            .ledger_dedupe(args.ledger_dedupe)
            .with_idempotency_layer()
            .start(&args.addr.to_string())
            .await?;
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening on {}", sim.url())?;
            out.flush()?;
        }
        stop_signal().await?;
        sim.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// The flags as faults, checked.
fn faults(a: &PspSimArgs) -> Result<Faults, FaultsError> {
    let mut f = Faults::none();
    if let Some(x) = a.error_rate {
        f.error_rate = x;
    }
    f.rate_limit = a.rate_limit;
    f.retry_after = a.retry_after.map(std::time::Duration::from_secs);
    if let Some(o) = &a.outage {
        f.outage = Some(parse_outage(o)?);
    }
    if let Some(l) = a.latency {
        f.latency = l;
    }
    if let Some(x) = a.timeout_after_commit {
        f.timeout_after_commit = x;
    }
    f.seed = a.seed;
    if let Some(x) = a.decline_rate {
        f.decline_rate = x;
    }
    if let Some(m) = &a.decline_mix {
        f.decline_mix = redrive_psp_sim::parse_decline_mix(m)?;
    }
    f.validate()?;
    Ok(f)
}

/// Names the flag rather than the JSON field.
fn flag_message(e: &FaultsError) -> String {
    let flag = match e.field() {
        "error_rate" => "--error-rate",
        "rate_limit" => "--rate-limit",
        "retry_after" => "--retry-after",
        "latency" | "latency_ms" => "--latency",
        "timeout_after_commit" => "--timeout-after-commit",
        "seed" => "--seed",
        "decline_rate" => "--decline-rate",
        "decline_mix" => "--decline-mix",
        f if f.starts_with("outage") => "--outage",
        _ => return e.to_string(),
    };
    match e {
        FaultsError::Invalid { value, allowed, .. } => {
            format!("invalid {flag} {value}: must be {allowed}")
        }
        other => format!("{flag}: {other}"),
    }
}

/// Ctrl-C, or SIGTERM on Unix.
async fn stop_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
