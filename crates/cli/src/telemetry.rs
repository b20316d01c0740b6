//! Log lines and traces: the `tracing` subscriber of the binary.
//!
//! Logs go to stderr as text (coloured only on a terminal) or JSON (`--log-format json`, one
//! object a line), every line passed through the same redaction as the rest of the output
//! (`redrive_http::redact`). With the `otel` feature and an `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), the spans of the service, the runtime and the `http`
//! kind are also exported over OTLP (`OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf`, the
//! default, or `http/json`).

use std::io::{IsTerminal, Write};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

impl LogFormat {
    pub(crate) fn parse(s: &str) -> Self {
        if s == "json" { Self::Json } else { Self::Text }
    }
}

/// Stderr, each log line redacted before it is written: text as a whole; JSON value by value
/// (so the line stays valid JSON).
#[derive(Debug, Clone, Copy)]
struct Redacting(LogFormat);

impl<'a> MakeWriter<'a> for Redacting {
    type Writer = RedactingWriter;
    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter(self.0)
    }
}

#[derive(Debug)]
struct RedactingWriter(LogFormat);

impl Write for RedactingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes each event as one buffer (one line or several).
        let text = String::from_utf8_lossy(buf);
        let out = match self.0 {
            LogFormat::Text => redrive_http::redact::redact_text(&text),
            LogFormat::Json => text
                .split_inclusive('\n')
                .map(redact_json_line)
                .collect::<String>(),
        };
        std::io::stderr().lock().write_all(out.as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// A JSON log line with every string value redacted (not a JSON line: redacted as text).
fn redact_json_line(line: &str) -> String {
    let body = line.trim_end_matches('\n');
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(body) else {
        return redrive_http::redact::redact_text(line);
    };
    redact_value(&mut v);
    let mut out = v.to_string();
    if line.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn redact_value(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => *s = redrive_http::redact::redact_text(s),
        serde_json::Value::Array(a) => a.iter_mut().for_each(redact_value),
        serde_json::Value::Object(o) => o.values_mut().for_each(redact_value),
        _ => {}
    }
}

/// Flushes the exported spans when dropped (at the end of `main`).
#[derive(Debug)]
pub(crate) struct Guard {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("redrive: exporting the last spans failed: {e}");
        }
    }
}

/// The log lines' layer, unfiltered.
fn log_layer<S>(format: LogFormat) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer;
    let ansi = format == LogFormat::Text && std::io::stderr().is_terminal();
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(Redacting(format))
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(Redacting(format))
            .boxed(),
    }
}

/// Installs the subscriber: `default` is the level filter when RUST_LOG is not set.
///
/// Without span export, RUST_LOG filters the whole subscriber, not the log layer alone: a
/// per-layer filter loses events (tokio-rs/tracing#2519: sqlx asks `enabled` for its own
/// query logs after every statement, and the next event whose callsite is cached as always
/// enabled reads that stale answer; `RUST_LOG=redrive_runtime::completer=debug` printed no
/// group commit on PostgreSQL). With span export each layer keeps its own filter (the spans
/// are exported whatever RUST_LOG says of the log lines), and that loss can come back.
pub(crate) fn init(format: LogFormat, default: &str) -> Guard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    #[cfg(feature = "otel")]
    {
        use tracing_subscriber::Layer;
        match otel::layer() {
            Ok(Some((l, p))) => {
                let logs = log_layer(format).with_filter(filter).boxed();
                let _ = tracing_subscriber::registry()
                    .with(vec![logs, l])
                    .try_init();
                return Guard { provider: Some(p) };
            }
            Ok(None) => {}
            Err(e) => eprintln!("redrive: OpenTelemetry export is off: {e}"),
        }
    }
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(log_layer(format))
        .try_init();
    Guard {
        #[cfg(feature = "otel")]
        provider: None,
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{LevelFilter, Targets};

    type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

    /// The OTLP layer when an endpoint is configured (`None` otherwise): the spans of
    /// redrive's crates at `info` and above, whatever RUST_LOG says of the log lines.
    pub(super) fn layer() -> Result<Option<(Boxed, SdkTracerProvider)>, String> {
        let configured = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
        if !configured {
            return Ok(None);
        }
        // The specification's default is http/protobuf (the crate's, with JSON built in too,
        // would be JSON): choose it unless the environment says otherwise.
        let protocol = [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
        let protocol = match protocol.as_deref() {
            None | Some("http/protobuf") => opentelemetry_otlp::Protocol::HttpBinary,
            Some("http/json") => opentelemetry_otlp::Protocol::HttpJson,
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL={other:?}: this build exports over http/protobuf or http/json"
                ));
            }
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .build()
            .map_err(|e| format!("building the OTLP exporter: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("redrive")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("redrive");
        let targets = Targets::new()
            .with_target("redrive_service", LevelFilter::INFO)
            .with_target("redrive_runtime", LevelFilter::INFO)
            .with_target("redrive_http", LevelFilter::INFO);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(targets)
            .boxed();
        Ok(Some((layer, provider)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_stays_json_with_its_secrets_masked() {
        let line = "{\"msg\":\"call https://u:hunter2@psp.example/x?api_key=abc\",\"n\":1}\n";
        let out = redact_json_line(line);
        assert!(out.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        let msg = v["msg"].as_str().unwrap();
        assert!(!msg.contains("hunter2") && !msg.contains("abc"), "{msg}");
        assert_eq!(v["n"], 1);
    }
}
