//! W3C trace context (`traceparent`) for one trace from enqueue to the dependency.
//!
//! A job may carry the `traceparent` of the request that enqueued it (stored with the job).
//! Each attempt's span joins that trace ([`set_parent`]), and the `http` kind sends a
//! `traceparent` on its outbound call ([`outbound`]) so the dependency's own traces join too.
//!
//! Storing and passing on the string is always on and costs nothing. With the `otel` cargo
//! feature the spans themselves become OpenTelemetry spans (through `tracing-opentelemetry`;
//! the binary installs the exporter): [`set_parent`] makes the attempt a child of the stored
//! context and [`outbound`] sends the current span's own context. Without the feature nothing
//! of OpenTelemetry is compiled: [`set_parent`] does nothing and [`outbound`] passes the stored
//! string on unchanged.

pub use redrive_store::{TraceParent, TraceParentError};

/// Makes `span` a child of the trace context `traceparent` (an invalid one is ignored). Does
/// nothing without the `otel` feature.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    #[cfg(feature = "otel")]
    if let Some(tp) = traceparent.and_then(|t| TraceParent::parse(t).ok()) {
        use opentelemetry::trace::{
            SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
        };
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let sc = SpanContext::new(
            TraceId::from_bytes(tp.trace_id),
            SpanId::from_bytes(tp.span_id),
            TraceFlags::new(tp.flags),
            true,
            TraceState::default(),
        );
        let cx = opentelemetry::Context::new().with_remote_span_context(sc);
        // Fails only when no OpenTelemetry layer is installed: then there is no trace to join.
        let _ = span.set_parent(cx);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, traceparent);
}

/// The `traceparent` of `span` as an OpenTelemetry span (`None` without the `otel` feature or
/// when no OpenTelemetry layer records it).
pub fn of_span(span: &tracing::Span) -> Option<String> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if !sc.is_valid() {
            return None;
        }
        Some(
            TraceParent {
                trace_id: sc.trace_id().to_bytes(),
                span_id: sc.span_id().to_bytes(),
                flags: sc.trace_flags().to_u8(),
            }
            .to_string(),
        )
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = span;
        None
    }
}

/// The `traceparent` to send on an outbound call made inside the current span: that span's
/// own context with the `otel` feature (so the callee's spans are its children), else the
/// job's stored `traceparent` unchanged.
pub fn outbound(stored: Option<&str>) -> Option<String> {
    of_span(&tracing::Span::current()).or_else(|| stored.map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbound_passes_the_stored_one_on_without_a_span() {
        let s = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert_eq!(outbound(Some(s)).as_deref(), Some(s));
        assert_eq!(outbound(None), None);
    }
}
