//! Small renderings shared by the pages: times, durations, state badges, links.

use chrono::{DateTime, Utc};
use maud::{Markup, html};
use redrive_store::{JobState, Timestamp};

pub(super) fn fmt_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

pub(super) fn fmt_dur(d: chrono::Duration) -> String {
    let s = d.num_seconds().abs();
    if s < 1 {
        format!("{}ms", d.num_milliseconds().abs())
    } else if s < 120 {
        format!("{s}s")
    } else if s < 7200 {
        format!("{}m {}s", s / 60, s % 60)
    } else if s < 172_800 {
        format!("{}h {}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d {}h", s / 86_400, (s % 86_400) / 3600)
    }
}

pub(super) fn relative(t: Timestamp, now: Timestamp) -> String {
    let d = t - now;
    if d.num_milliseconds() >= 0 {
        format!("in {}", fmt_dur(d))
    } else {
        format!("{} ago", fmt_dur(d))
    }
}

pub(super) fn when(t: Option<Timestamp>, now: Timestamp) -> Markup {
    match t {
        Some(t) => {
            html! { span title=(fmt_time(t)) { (fmt_time(t)) " " span.muted { "(" (relative(t, now)) ")" } } }
        }
        None => html! { span.muted { "—" } },
    }
}

pub(super) fn jobs_link(queue: Option<&str>, state: Option<JobState>) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    if let Some(q) = queue {
        s.append_pair("queue", q);
    }
    if let Some(st) = state {
        s.append_pair("state", st.as_str());
    }
    let q = s.finish();
    if q.is_empty() {
        "/jobs".into()
    } else {
        format!("/jobs?{q}")
    }
}

pub(super) fn state_badge(s: &str) -> Markup {
    html! { span class=(format!("state-{s}")) { (s) } }
}

/// A breaker's state as the fleet sees it: coloured by the effective state, labelled
/// `open (forced)` / `closed (forced)` when an operator forced it.
pub(super) fn breaker_badge(b: &crate::views::BreakerView) -> Markup {
    html! { span class=(format!("state-{}", b.effective_state)) { (b.state_label) } }
}

pub(super) fn duration(v: Option<std::time::Duration>) -> String {
    v.map_or("—".into(), |d| {
        fmt_dur(chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX))
    })
}
