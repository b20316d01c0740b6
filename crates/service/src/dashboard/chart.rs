//! The chart of attempts per second, by class, as inline SVG.

use maud::{Markup, html};
use redrive_store::{AttemptBucket, Timestamp};

use super::{CHART_BUCKET, CHART_WINDOW};

pub(super) const CLASSES: [(&str, &str); 7] = [
    ("success", "#059669"),
    ("rate_limited", "#d97706"),
    ("infrastructure", "#dc2626"),
    ("timeout", "#7c3aed"),
    ("permanent", "#111827"),
    ("auth", "#2563eb"),
    ("exception", "#db2777"),
];

pub(super) fn class_colour(class: &str) -> &'static str {
    CLASSES
        .iter()
        .find(|(c, _)| *c == class)
        .map_or("#6b7280", |(_, col)| col)
}

/// Attempts per second by class as an inline SVG, one line per class.
pub(crate) fn chart(buckets: &[AttemptBucket], from: Timestamp, to: Timestamp) -> Markup {
    let step_ms = CHART_BUCKET.as_millis() as i64;
    let n = ((to - from).num_milliseconds() / step_ms).max(1) as usize;
    let (w, h, left, bottom, top) = (720.0_f64, 200.0_f64, 44.0_f64, 22.0_f64, 10.0_f64);
    let mut classes: Vec<&str> = buckets.iter().map(|b| b.class.as_str()).collect();
    classes.sort_by_key(|c| CLASSES.iter().position(|(k, _)| k == c).unwrap_or(99));
    classes.dedup();
    let per_sec = |count: u64| count as f64 / CHART_BUCKET.as_secs_f64();
    let max = buckets
        .iter()
        .map(|b| per_sec(b.count))
        .fold(0.0_f64, f64::max)
        .max(0.1);
    let x = |i: usize| left + (w - left - 8.0) * (i as f64 + 0.5) / n as f64;
    let y = |v: f64| top + (h - top - bottom) * (1.0 - v / max);
    let series: Vec<(&str, String, u64)> = classes
        .iter()
        .map(|c| {
            let mut vals = vec![0u64; n];
            for b in buckets.iter().filter(|b| b.class == *c) {
                let i = ((b.start - from).num_milliseconds() / step_ms).clamp(0, n as i64 - 1);
                vals[i as usize] += b.count;
            }
            let pts = vals
                .iter()
                .enumerate()
                .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(per_sec(*v))))
                .collect::<Vec<_>>()
                .join(" ");
            (*c, pts, vals.iter().sum())
        })
        .collect();
    let minutes = CHART_WINDOW.as_secs() / 60;
    html! {
        figure #attempts-chart {
            figcaption { "Attempts per second by class, last " (minutes) " minutes (" (CHART_BUCKET.as_secs()) " s buckets)" }
            svg xmlns="http://www.w3.org/2000/svg" width=(w) height=(h) viewBox=(format!("0 0 {w} {h}")) role="img" aria-label="attempts per second by class" style="background:#fff;border:1px solid #e5e7eb" {
                line x1=(left) y1=(top) x2=(left) y2=(h - bottom) stroke="#9ca3af" {}
                line x1=(left) y1=(h - bottom) x2=(w - 8.0) y2=(h - bottom) stroke="#9ca3af" {}
                text x=(left - 4.0) y=(top + 8.0) text-anchor="end" font-size="10" { (format!("{max:.1}/s")) }
                text x=(left - 4.0) y=(h - bottom) text-anchor="end" font-size="10" { "0" }
                text x=(left) y=(h - 6.0) font-size="10" { "-" (minutes) "m" }
                text x=(w - 8.0) y=(h - 6.0) text-anchor="end" font-size="10" { "now" }
                @if series.is_empty() {
                    text x=(w / 2.0) y=(h / 2.0) text-anchor="middle" fill="#6b7280" { "no attempts in the last " (minutes) " minutes" }
                }
                @for (c, pts, _) in &series {
                    polyline fill="none" stroke=(class_colour(c)) stroke-width="2" points=(pts) data-class=(c) {}
                }
            }
            p.legend {
                @for (c, _, total) in &series {
                    span style=(format!("color:{};margin-right:12px", class_colour(c))) { "■ " (c) " (" (total) ")" }
                }
            }
        }
    }
}
