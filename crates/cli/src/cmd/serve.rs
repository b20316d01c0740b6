//! `redrive serve`: the HTTP API, the dashboard and `/metrics` over the `--db` store.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusBuilder;
use redrive_service::{AppConfig, ServiceConfig, ServiceError};

use crate::args::{Global, ServeArgs};
use crate::cmd::queue::{block_on, open};
use crate::error::usage;
use crate::policies;

pub(crate) fn run(global: &Global, a: ServeArgs) -> anyhow::Result<ExitCode> {
    let addr: SocketAddr = a.addr.parse().map_err(|_| {
        usage(format!(
            "--addr: {:?} is not an address like 127.0.0.1:8080",
            a.addr
        ))
    })?;
    if a.workers > 0 {
        return Err(usage(
            "--workers: running workers inside serve is not available in this build yet; run `redrive work` beside it",
        ));
    }
    let token = a.token.clone().filter(|t| !t.is_empty());
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(usage(ServiceError::TokenRequired { addr }.to_string()));
    }
    let set = policies::load(global)?;
    block_on(async move {
        let store = open(global).await?;
        let prometheus = PrometheusBuilder::new()
            .install_recorder()
            .context("installing the Prometheus recorder")?;
        let config = ServiceConfig {
            addr,
            store,
            app: AppConfig {
                token,
                policies: set,
                prometheus: Some(prometheus),
            },
        };
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        match redrive_service::serve(config, shutdown).await {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e @ (ServiceError::TokenRequired { .. } | ServiceError::InvalidToken { .. })) => {
                Err(usage(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    })
}
