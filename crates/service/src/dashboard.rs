//! The dashboard: server-rendered HTML (maud) with a few lines of JavaScript that reload the
//! page's live part every 2 seconds (pausable, and paused while a box is ticked).
//!
//! Pages: `/` (queues, breakers, attempts per second, dead by reason), `/jobs` (filtered list
//! with a keyset "next page"), `/jobs/{id}` (fields and the attempt timeline), `/dead` (grouped
//! by reason and error signature, replay or purge one, a selection or all), `/breakers`,
//! `/workers` (the live workers, and the jobs waiting for a kind none of them runs), and
//! `/search?q=` (the search box of every page: a job id, an idempotency key or a dependency).
//! Forms POST to the dashboard's own routes; every POST must come from this host (its
//! `Origin`, else `Referer`), and with a token configured the dashboard needs a session cookie
//! set by `/login`: a random id, HttpOnly, SameSite=Strict, `Secure` with `--cookie-secure`,
//! expiring after the session time to live and revoked by `/logout`. Failed logins are
//! limited per client address (429 problem+json with `Retry-After`). Errors, results and
//! reasons go through the shared redaction before they are shown.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use redrive_http::redact::{redact_text, redact_value};
use redrive_store::{
    Actor, AttemptBucket, BulkAction, DependencyOp, Job, JobFilter, JobId, JobState, QueueCount,
    Timestamp,
};

use crate::api::{breaker_views, parse_id, parse_list, read_body, replay_one};
use crate::auth::{self, Identity, SESSION_COOKIE};
use crate::error::ApiError;
use crate::state::AppState;
use crate::views::BreakerView;

/// How far back the chart of attempts looks.
pub(crate) const CHART_WINDOW: Duration = Duration::from_secs(10 * 60);
/// One point of the chart.
pub(crate) const CHART_BUCKET: Duration = Duration::from_secs(10);
/// Ids listed (with a checkbox) per dead group.
pub(crate) const IDS_PER_GROUP: u32 = 50;

pub(crate) fn routes(state: AppState) -> Router<AppState> {
    let guarded = Router::new()
        .route("/", get(overview))
        .route("/jobs", get(jobs))
        .route("/jobs/{id}", get(job))
        .route("/jobs/{id}/replay", post(job_replay))
        .route("/jobs/{id}/cancel", post(job_cancel))
        .route("/dead", get(dead))
        .route("/dead/replay", post(dead_replay))
        .route("/dead/purge", post(dead_purge))
        .route("/breakers", get(breakers))
        .route("/workers", get(workers))
        .route("/search", get(search))
        .route("/jobs/{id}/run-now", post(job_run_now))
        .route("/queues/{queue}/pause", post(queue_pause))
        .route("/queues/{queue}/resume", post(queue_resume))
        .route("/breakers/{name}/force", post(breaker_force))
        .route("/dependencies/{name}/pause", post(dependency_pause))
        .route("/dependencies/{name}/resume", post(dependency_resume))
        .route("/bulk", post(bulk_action))
        .route("/audit", get(audit_page))
        .route_layer(middleware::from_fn_with_state(state, auth::require_session));
    Router::new()
        .merge(guarded)
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
}

/// A dashboard failure, shown as an HTML page.
struct Page(ApiError);

impl From<ApiError> for Page {
    fn from(e: ApiError) -> Self {
        Page(e)
    }
}

impl From<redrive_store::StoreError> for Page {
    fn from(e: redrive_store::StoreError) -> Self {
        Page(e.into())
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let e = self.0;
        let body = layout(
            e.title,
            false,
            html! {
                div.problem {
                    h2 { (e.status.as_u16()) " — " (e.title) }
                    p { (e.detail) }
                    @if let Some(f) = &e.field {
                        p { "Field: " code { (f) } @if let Some(v) = &e.value { " = " code { (v) } } }
                    }
                    p { a href="/" { "Back to the overview" } }
                }
            },
        );
        (e.status, html_response(body)).into_response()
    }
}

fn html_response(m: Markup) -> Response {
    let mut res = m.into_string().into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res.headers_mut()
        .insert("x-frame-options", HeaderValue::from_static("DENY"));
    res
}

const CSS: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#f6f7f9}
header{background:#1f2937;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#e5e7eb;text-decoration:none;font-weight:600}header a:hover{color:#fff}
header .brand{font-size:16px;margin-right:12px}header .spacer{flex:1}
header form{margin:0}header input{font:inherit;padding:2px 6px;width:16em}
.warn{background:#fffbeb;border:1px solid #f59e0b;padding:8px 12px;margin:8px 0}
button,.button{font:inherit;padding:4px 10px;border:1px solid #9ca3af;border-radius:4px;background:#fff;cursor:pointer;color:#111;text-decoration:none}
button.danger{border-color:#b91c1c;color:#b91c1c}button.primary{border-color:#1d4ed8;color:#1d4ed8}
main{padding:16px;max-width:1200px}
table{border-collapse:collapse;background:#fff;margin:8px 0 16px}
th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
.zero{color:#9ca3af}.state-dead,.state-open{color:#b91c1c;font-weight:600}
.state-succeeded,.state-closed{color:#047857}.state-running,.state-half_open{color:#b45309}
.state-deferred{color:#7c3aed}.muted{color:#6b7280}
pre{background:#fff;border:1px solid #e5e7eb;padding:8px;overflow:auto;max-height:300px}
.problem{background:#fff;border:1px solid #fca5a5;padding:12px}
ol.timeline{list-style:none;padding:0;border-left:3px solid #d1d5db;margin-left:8px}
ol.timeline li{position:relative;padding:4px 0 10px 16px}
ol.timeline li::before{content:"";position:absolute;left:-8px;top:8px;width:12px;height:12px;border-radius:50%;background:var(--c,#6b7280)}
.group{background:#fff;border:1px solid #e5e7eb;padding:8px 12px;margin:8px 0}
.cards{display:flex;gap:16px;flex-wrap:wrap}.card{background:#fff;border:1px solid #e5e7eb;padding:8px 12px}
"#;

const JS: &str = r#"
(function(){
  var key='redrive-live-paused';
  var btn=document.getElementById('live-toggle');
  function paused(){return localStorage.getItem(key)==='1';}
  function show(){if(btn){btn.textContent=paused()?'Resume live refresh':'Pause live refresh';}}
  if(btn){btn.addEventListener('click',function(){localStorage.setItem(key,paused()?'0':'1');show();});}
  show();
  setInterval(function(){
    if(paused()||document.hidden)return;
    var live=document.getElementById('live');
    if(!live||live.dataset.live!=='1')return;
    if(live.querySelector('input:checked')||live.contains(document.activeElement)&&document.activeElement.tagName!=='BODY')return;
    fetch(location.href,{credentials:'same-origin'}).then(function(r){
      if(!r.ok)return null;return r.text();
    }).then(function(t){
      if(!t)return;
      var doc=new DOMParser().parseFromString(t,'text/html');
      var next=doc.getElementById('live');
      if(next){live.innerHTML=next.innerHTML;}
    }).catch(function(){});
  },2000);
})();
"#;

fn layout(title: &str, live: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · redrive" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    a.brand href="/" { "redrive" }
                    a href="/" { "Overview" }
                    a href="/jobs" { "Jobs" }
                    a href="/dead" { "Dead letters" }
                    a href="/breakers" { "Breakers" }
                    a href="/workers" { "Workers" }
                    a href="/audit" { "Audit" }
                    span.spacer {}
                    form #search method="get" action="/search" role="search" {
                        input #search-q type="search" name="q" placeholder="Job id, key or dependency" aria-label="Search by job id, idempotency key or dependency";
                        " " button type="submit" { "Search" }
                    }
                    @if live { button #live-toggle type="button" { "Pause live refresh" } }
                }
                main {
                    h1 { (title) }
                    div #live data-live=(if live { "1" } else { "0" }) { (body) }
                }
                script { (PreEscaped(JS)) }
            }
        }
    }
}

fn fmt_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn fmt_dur(d: chrono::Duration) -> String {
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

fn relative(t: Timestamp, now: Timestamp) -> String {
    let d = t - now;
    if d.num_milliseconds() >= 0 {
        format!("in {}", fmt_dur(d))
    } else {
        format!("{} ago", fmt_dur(d))
    }
}

fn when(t: Option<Timestamp>, now: Timestamp) -> Markup {
    match t {
        Some(t) => {
            html! { span title=(fmt_time(t)) { (fmt_time(t)) " " span.muted { "(" (relative(t, now)) ")" } } }
        }
        None => html! { span.muted { "—" } },
    }
}

fn jobs_link(queue: Option<&str>, state: Option<JobState>) -> String {
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

fn state_badge(s: &str) -> Markup {
    html! { span class=(format!("state-{s}")) { (s) } }
}

fn queue_table(counts: &[QueueCount], paused: &[String]) -> Markup {
    let mut queues: Vec<&str> = counts.iter().map(|c| c.queue.as_str()).collect();
    // A paused queue without jobs still shows (to be resumed).
    queues.extend(paused.iter().map(String::as_str));
    queues.sort_unstable();
    queues.dedup();
    let is_paused = |q: &str| paused.iter().any(|p| p == q);
    let count = |q: &str, s: JobState| {
        counts
            .iter()
            .find(|c| c.queue == q && c.state == s)
            .map_or(0, |c| c.count)
    };
    html! {
        @if queues.is_empty() {
            p.muted { "No jobs yet. Enqueue one with " code { "POST /v1/jobs" } " or " code { "redrive enqueue" } "." }
        } @else {
            table #queues {
                thead { tr {
                    th { "Queue" }
                    @for s in JobState::ALL { th { (s.as_str()) } }
                    th { "total" }
                    th { "Claims" }
                } }
                tbody {
                    @for q in &queues {
                        tr data-queue=(q) {
                            td { a href=(jobs_link(Some(q), None)) { (q) } }
                            @for s in JobState::ALL {
                                @let n = count(q, s);
                                td.n data-state=(s.as_str()) {
                                    @if n == 0 { span.zero { "0" } }
                                    @else { a class=(format!("state-{}", s.as_str())) href=(jobs_link(Some(q), Some(s))) { (n) } }
                                }
                            }
                            td.n { (JobState::ALL.iter().map(|s| count(q, *s)).sum::<u64>()) }
                            td.claims {
                                @let path = form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>();
                                @if is_paused(q) {
                                    strong.state-open.paused { "paused" } " "
                                    form method="post" action=(format!("/queues/{path}/resume")) style="display:inline" {
                                        button.primary.resume-queue type="submit" { "Resume" }
                                    }
                                } @else {
                                    span.state-closed { "on" } " "
                                    form method="post" action=(format!("/queues/{path}/pause")) style="display:inline" {
                                        button.pause-queue type="submit" { "Pause" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

const CLASSES: [(&str, &str); 7] = [
    ("success", "#059669"),
    ("rate_limited", "#d97706"),
    ("infrastructure", "#dc2626"),
    ("timeout", "#7c3aed"),
    ("permanent", "#111827"),
    ("auth", "#2563eb"),
    ("exception", "#db2777"),
];

fn class_colour(class: &str) -> &'static str {
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

/// Jobs waiting for a queue and kind no live worker runs, as a warning (nothing if none).
fn unhandled_warning(unhandled: &[redrive_store::Unhandled]) -> Markup {
    html! {
        @if !unhandled.is_empty() {
            div.warn #unhandled {
                strong { "Waiting for a kind no live worker runs" }
                " — these jobs will not run until a worker for their queue and kind starts ("
                a href="/workers" { "workers" } "):"
                table { thead { tr { th { "Queue" } th { "Kind" } th { "Jobs" } th { "Oldest run at" } } }
                    tbody { @for u in unhandled {
                        tr data-queue=(u.queue) data-kind=(u.kind) {
                            td { a href=(jobs_link(Some(&u.queue), None)) { (u.queue) } }
                            td { (u.kind) } td.n { (u.jobs) } td { (fmt_time(u.oldest_run_at)) }
                        }
                    } }
                }
            }
        }
    }
}

async fn overview(State(state): State<AppState>) -> Result<Response, Page> {
    let store = &state.inner.store;
    let now = Utc::now();
    let counts = store.counts().await?;
    let unhandled = store.unhandled(now).await?;
    let paused: Vec<String> = store
        .paused_queues()
        .await?
        .into_iter()
        .map(|p| p.queue)
        .collect();
    let breakers = breaker_views(store).await?;
    let from = now - chrono::Duration::from_std(CHART_WINDOW).unwrap_or_default();
    let buckets = store.attempt_rate(from, now, CHART_BUCKET).await?;
    let reasons = store.dead_reasons().await?;
    let not_closed: Vec<&BreakerView> = breakers
        .iter()
        .filter(|b| b.state != "closed" || b.paused_until.is_some())
        .collect();
    let body = html! {
        (unhandled_warning(&unhandled))
        h2 { "Queues" }
        (queue_table(&counts, &paused))
        div.cards {
            div.card #breakers-summary {
                h2 { "Breakers" }
                @if breakers.is_empty() { p.muted { "No dependency has a breaker yet." } }
                @else {
                    p { (breakers.iter().filter(|b| b.state == "closed").count()) " closed, "
                        (breakers.iter().filter(|b| b.state == "open").count()) " open, "
                        (breakers.iter().filter(|b| b.state == "half_open").count()) " half-open" }
                    ul {
                        @for b in &not_closed {
                            li { a href="/breakers" { (b.name) } ": " (state_badge(&b.state))
                                @if let Some(t) = b.next_probe_at { " · next probe " (relative(t, now)) }
                                @if let Some(t) = b.paused_until { " · paused " (relative(t, now)) }
                            }
                        }
                    }
                }
            }
            div.card #dead-summary {
                h2 { "Dead letters by reason" }
                @if reasons.is_empty() { p.muted { "No dead jobs." } }
                @else {
                    table { tbody {
                        @for r in &reasons {
                            tr { td { a href="/dead" { (r.reason) } } td.n data-reason=(r.reason) { (r.count) } }
                        }
                    } }
                }
            }
        }
        (chart(&buckets, from, now))
        p.muted { "Updated " (fmt_time(now)) }
    };
    Ok(html_response(layout("Overview", true, body)))
}

fn job_row(j: &Job, now: Timestamp) -> Markup {
    let why = j
        .dead_reason
        .map(|r| r.as_str())
        .or(j.defer_reason.map(|r| r.as_str()))
        .unwrap_or("");
    html! {
        tr data-id=(j.id) {
            td { a href=(format!("/jobs/{}", j.id)) { (j.id) } }
            td { (j.queue) }
            td { (j.kind) }
            td { (state_badge(j.state.as_str())) }
            td.n { (j.attempts) "/" (j.max_attempts) }
            td { (when(Some(j.run_at), now)) }
            td { (why) @if let Some(e) = &j.last_error { " " span.muted { (redact_text(e).chars().take(120).collect::<String>()) } } }
        }
    }
}

async fn jobs(State(state): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, Page> {
    let p = parse_list(q.as_deref(), true)?;
    let page = state.inner.store.list(&p).await?;
    let now = Utc::now();
    let next_link = page.next.map(|n| {
        let mut s = form_urlencoded::Serializer::new(String::new());
        if let Some(st) = p.state {
            s.append_pair("state", st.as_str());
        }
        if let Some(qu) = &p.queue {
            s.append_pair("queue", qu);
        }
        if let Some(k) = &p.key {
            s.append_pair("key", k);
        }
        if let Some(l) = p.limit {
            s.append_pair("limit", &l.to_string());
        }
        s.append_pair("after", &n.to_string());
        format!("/jobs?{}", s.finish())
    });
    let mut title = match (&p.state, &p.queue) {
        (Some(s), Some(q)) => format!("Jobs: {q}, {s}"),
        (Some(s), None) => format!("Jobs: {s}"),
        (None, Some(q)) => format!("Jobs: {q}"),
        (None, None) => "Jobs".into(),
    };
    if let Some(k) = &p.key {
        title = format!("{title} with key {k}");
    }
    let body = html! {
        form method="get" action="/jobs" {
            label { "State " select name="state" {
                option value="" { "any" }
                @for s in JobState::ALL {
                    option value=(s.as_str()) selected[p.state == Some(s)] { (s.as_str()) }
                }
            } }
            " "
            label { "Queue " input name="queue" value=(p.queue.clone().unwrap_or_default()); }
            " "
            label { "Key " input name="key" value=(p.key.clone().unwrap_or_default()); }
            " " button type="submit" { "Filter" }
        }
        @if page.jobs.is_empty() { p.muted { "No jobs match." } }
        @else {
            table #jobs {
                thead { tr { th { "Id" } th { "Queue" } th { "Kind" } th { "State" } th { "Attempts" } th { "Run at" } th { "Reason / last error" } } }
                tbody { @for j in &page.jobs { (job_row(j, now)) } }
            }
        }
        @if let Some(l) = next_link { p { a.button #next-page href=(l) { "Next page →" } } }
        @if p.after.is_some() { p { a href=(jobs_link(p.queue.as_deref(), p.state)) { "← First page" } } }
        details #bulk {
            summary { "Bulk action by filter" }
            form method="post" action="/bulk" {
                label { "Action " select name="action" {
                    option value="replay" { "replay (dead)" }
                    option value="purge" { "purge (dead)" }
                    option value="cancel" { "cancel (unfinished)" }
                    option value="run_now" { "run now (waiting)" }
                } } " "
                label { "Queue " input name="queue" value=(p.queue.clone().unwrap_or_default()); } " "
                label { "Kind " input name="kind"; } " "
                label { "Dependency " input name="dependency"; } " "
                label { "Dead reason " input name="dead_reason"; } " "
                label { "Error signature " input name="signature"; } " "
                label { input type="checkbox" name="all" value="1"; " every job (no filter)" } " "
                label { input type="checkbox" name="dry_run" value="1" checked; " dry run" } " "
                button.primary #bulk-submit type="submit" { "Go" }
            }
        }
    };
    Ok(html_response(layout(&title, true, body)))
}

fn ms(v: Option<u64>) -> String {
    v.map_or("—".into(), |m| {
        fmt_dur(chrono::Duration::milliseconds(m as i64))
    })
}

async fn job(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, Page> {
    let id = parse_id(&id)?;
    let store = &state.inner.store;
    let j = store
        .get(id)
        .await?
        .ok_or(redrive_store::StoreError::JobNotFound { id })?;
    let attempts = store.attempts(id).await?;
    let now = Utc::now();
    let declines = store.declines(id).await?;
    let quota = match &j.quota_key {
        Some(k) => quota_use(store, &state.inner.policies, k, now).await?,
        None => Vec::new(),
    };
    let payload = redrive_http::redact_payload(&j.payload);
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let body = html! {
        p { "State: " strong #job-state { (state_badge(j.state.as_str())) }
            @if let Some(r) = &j.dead_reason { " — died: " strong { (r) } }
            @if let Some(r) = &j.defer_reason { " — deferred: " strong { (r) } }
        }
        div {
            @if j.state == JobState::Dead {
                form method="post" action=(format!("/jobs/{id}/replay")) style="display:inline" {
                    button.primary #replay type="submit" { "Replay" }
                }
                " "
            }
            @if BulkAction::RunNow.states().contains(&j.state) && j.run_at > now {
                form method="post" action=(format!("/jobs/{id}/run-now")) style="display:inline" {
                    button.primary #run-now type="submit" { "Run now" }
                }
                " "
            }
            @if !j.state.is_final() {
                form method="post" action=(format!("/jobs/{id}/cancel")) style="display:inline" {
                    button.danger #cancel type="submit" { "Cancel" }
                }
            }
        }
        table #fields { tbody {
            tr { th { "Queue" } td { a href=(jobs_link(Some(&j.queue), None)) { (j.queue) } } }
            tr { th { "Kind" } td { (j.kind) } }
            tr { th { "Key" } td { (j.key.as_deref().unwrap_or("—")) } }
            tr { th { "Dependency" } td { (j.dependency.as_deref().unwrap_or("—")) } }
            @if let Some(k) = &j.quota_key { tr { th { "Quota key" } td #quota-key { (k) } } }
            tr { th { "Policy" } td { (j.policy) } }
            tr { th { "Priority" } td { (j.priority) } }
            tr { th { "Attempts" } td { (j.attempts) " of " (j.max_attempts) " (exceptions " (j.exceptions) ", defers " (j.defers) ")" } }
            tr { th { "Replays" } td { (j.replays) } }
            tr { th { "Run at" } td { (when(Some(j.run_at), now)) } }
            tr { th { "Deadline" } td { (when(j.deadline, now)) } }
            tr { th { "Lease" } td { (j.lease_owner.as_deref().unwrap_or("—")) " · token " (j.lease_token) " · expires " (when(j.lease_expires_at, now)) } }
            tr { th { "Created" } td { (when(Some(j.created_at), now)) } }
            tr { th { "Finished" } td { (when(j.finished_at, now)) } }
            tr { th { "Last error" } td { (j.last_error.as_deref().map_or_else(|| "—".to_owned(), redact_text)) } }
        } }
        h2 { "Payload" span.muted { " (secret headers redacted)" } }
        pre #payload { (pretty(&payload)) }
        @if let Some(r) = &j.result { h2 { "Result" } pre { (pretty(&redact_value(r))) } }
        @if !declines.is_empty() || j.quota_key.is_some() {
            h2 { "Declines (" (declines.len()) ")" }
            @if !declines.is_empty() {
                table #declines {
                    thead { tr { th { "Attempt" } th { "At" } th { "Network" } th { "Code" } th { "Category" } th { "Advice" } th { "Rule" } } }
                    tbody { @for d in &declines {
                        tr {
                            td { "#" (d.attempt) } td { (fmt_time(d.at)) } td { (d.network.as_str()) }
                            td { (d.code.as_deref().unwrap_or("—")) }
                            td { (d.category.map_or("—".into(), |c| c.to_string())) }
                            td { (d.advice_code.map_or("—".into(), |m| format!("MAC {m:02}"))) }
                            td { strong { (d.rule) } }
                        }
                    } }
                }
            }
            @if !quota.is_empty() {
                p #quota { "Reattempt quota of this card: "
                    @for (i, (network, used, max, window)) in quota.iter().enumerate() {
                        @if i > 0 { " · " }
                        (network) " " strong { (used) "/" (max) } " in " (window)
                    }
                }
            }
        }
        h2 { "Attempts (" (attempts.len()) ")" }
        @if attempts.is_empty() { p.muted { "No attempt yet." } }
        @else {
            ol.timeline #attempts {
                @for a in &attempts {
                    li style=(format!("--c:{}", class_colour(a.class.as_str()))) data-class=(a.class.as_str()) {
                        strong { "#" (a.number) } @if a.replay > 0 { span.muted { " (replay " (a.replay) ")" } }
                        " · " (fmt_time(a.started_at)) " · took " (ms(Some(a.duration_ms)))
                        " · " span style=(format!("color:{}", class_colour(a.class.as_str()))) { (a.class.as_str()) }
                        @if let Some(s) = a.http_status { " · HTTP " (s) }
                        @if let Some(m) = a.mode { " · then " strong { (m.as_str()) } " after " (ms(a.delay_ms)) }
                        @else if let Some(d) = a.delay_ms { " · delay " (ms(Some(d))) }
                        " · fencing token " (a.lease_token)
                        @if !a.counted { span.muted { " · not counted" } }
                        @if let Some(w) = &a.worker { span.muted { " · " (w) } }
                        @if let Some(e) = &a.error { br; code { (redact_text(e)) } }
                    }
                }
            }
        }
    };
    Ok(html_response(layout(&format!("Job {id}"), true, body)))
}

/// A card key's reattempts in each quota window: (network, used, max, window).
async fn quota_use(
    store: &redrive_store::Store,
    set: &redrive_policy::PolicySet,
    key: &str,
    now: chrono::DateTime<Utc>,
) -> Result<Vec<(String, u64, u32, String)>, redrive_store::StoreError> {
    let (windows, _) = store.quota_use(key, set.quotas(), now).await?;
    Ok(windows
        .into_iter()
        .map(|w| {
            (
                w.network.as_str().to_owned(),
                w.used,
                w.window.max,
                redrive_policy::format_duration(w.window.window),
            )
        })
        .collect())
}

async fn form_pairs(body: Body) -> Result<Vec<(String, String)>, ApiError> {
    let bytes = read_body(body).await?;
    Ok(form_urlencoded::parse(&bytes)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect())
}

/// The audit actor of a dashboard request.
fn actor(who: &Option<Extension<Identity>>) -> Actor {
    crate::operator::actor(who.as_ref().map(|e| &e.0), "dashboard")
}

async fn job_replay(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let id = parse_id(&id)?;
    replay_one(&state.inner.store, id, &actor(&who)).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

async fn job_cancel(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let id = parse_id(&id)?;
    crate::api::cancel_one(&state.inner.store, id, &actor(&who)).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

async fn job_run_now(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let id = parse_id(&id)?;
    crate::operator::run_now_one(&state, id, &actor(&who)).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

async fn queue_pause(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(queue): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    state
        .inner
        .store
        .pause_queue(&queue, &actor(&who), Utc::now())
        .await?;
    Ok(Redirect::to("/").into_response())
}

async fn queue_resume(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(queue): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    state
        .inner
        .store
        .resume_queue(&queue, &actor(&who), Utc::now())
        .await?;
    Ok(Redirect::to("/").into_response())
}

async fn breaker_force(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let pairs = form_pairs(body).await?;
    let mode = pairs
        .iter()
        .find(|(k, _)| k == "mode")
        .map_or("", |(_, v)| v.as_str());
    let mode = crate::operator::parse_mode(mode)?;
    crate::operator::operate(&state, &name, DependencyOp::Force(mode), &actor(&who)).await?;
    Ok(Redirect::to("/breakers").into_response())
}

async fn dependency_pause(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let pairs = form_pairs(body).await?;
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let until = crate::operator::pause_end(get("until"), get("for"), Utc::now())?;
    crate::operator::operate(&state, &name, DependencyOp::Pause { until }, &actor(&who)).await?;
    Ok(Redirect::to("/breakers").into_response())
}

async fn dependency_resume(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    crate::operator::operate(&state, &name, DependencyOp::Resume, &actor(&who)).await?;
    Ok(Redirect::to("/breakers").into_response())
}

/// The bulk form of `/jobs`: an action on every job a filter takes, with a dry run.
async fn bulk_action(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let pairs = form_pairs(body).await?;
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(n, v)| n == k && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned())
    };
    let action = crate::operator::parse_action(get("action").as_deref().unwrap_or(""))?;
    let filter = JobFilter {
        ids: None,
        queue: get("queue"),
        kind: get("kind"),
        dependency: get("dependency"),
        dead_reason: get("dead_reason"),
        signature: get("signature"),
    };
    let dry_run = get("dry_run").is_some_and(|v| v == "1");
    if filter.is_empty() && get("all").is_none_or(|v| v != "1") {
        return Err(ApiError::bad_field(
            "queue",
            "",
            "give at least one filter, or tick \"every job\"",
        )
        .into());
    }
    let out = state
        .inner
        .store
        .bulk(action, &filter, &actor(&who), dry_run, Utc::now())
        .await?;
    let verb = action.as_str().replace('_', " ");
    let body = html! {
        p #bulk-result data-count=(out.count) data-dry-run=(out.dry_run) {
            @if out.dry_run { "Dry run: " (verb) " would change " strong { (out.count) } " job" @if out.count != 1 { "s" } "; nothing changed." }
            @else { (verb) ": " strong { (out.count) } " job" @if out.count != 1 { "s" } " changed." }
        }
        p.muted { "Filter: " code { (serde_json::to_string(&filter).unwrap_or_default()) } }
        @if !out.ids.is_empty() {
            ul #bulk-ids { @for id in out.ids.iter().take(500) { li { a href=(format!("/jobs/{id}")) { (id) } } } }
            @if out.ids.len() > 500 { p.muted { "… and " (out.ids.len() - 500) " more" } }
        }
        @if out.dry_run {
            form method="post" action="/bulk" {
                @for (k, v) in pairs.iter().filter(|(k, _)| k != "dry_run") { input type="hidden" name=(k) value=(v); }
                button.danger #bulk-confirm type="submit" { "Do it: " (verb) " " (out.count) " job" @if out.count != 1 { "s" } }
            }
        }
        p { a href="/jobs" { "Back to the jobs" } " · " a href="/audit" { "Audit trail" } }
    };
    Ok(html_response(layout("Bulk action", false, body)))
}

async fn audit_page(
    State(state): State<AppState>,
    RawQuery(q): RawQuery,
) -> Result<Response, Page> {
    let (limit, before) = crate::operator::parse_audit_query(q.as_deref())?;
    let rows = state.inner.store.audit(before, limit).await?;
    let now = Utc::now();
    let next = (rows.len() == limit as usize)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    let body = html! {
        @if rows.is_empty() { p.muted { "No operator action yet." } }
        @else {
            table #audit {
                thead { tr { th { "Id" } th { "When" } th { "Who" } th { "Via" } th { "Action" } th { "Target" } th { "Rows" } } }
                tbody {
                    @for r in &rows {
                        tr data-id=(r.id) data-action=(r.action) {
                            td.n { (r.id) }
                            td { (when(Some(r.at), now)) }
                            td.actor { (r.actor) }
                            td { (r.via) }
                            td.action { (r.action) }
                            td { code { (redact_text(&r.target.to_string())) } }
                            td.n.rows { (r.rows) }
                        }
                    }
                }
            }
        }
        @if let Some(n) = next { p { a.button #next-page href=(format!("/audit?before={n}&limit={limit}")) { "Older →" } } }
    };
    Ok(html_response(layout("Audit", true, body)))
}

async fn dead(State(state): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, Page> {
    let queue = form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes())
        .find(|(k, v)| k == "queue" && !v.is_empty())
        .map(|(_, v)| v.into_owned());
    let groups = state
        .inner
        .store
        .dead_groups(queue.as_deref(), IDS_PER_GROUP)
        .await?;
    let total: u64 = groups.iter().map(|g| g.count).sum();
    let body = html! {
        p { strong #dead-total { (total) } " dead job" @if total != 1 { "s" } @if let Some(q) = &queue { " in queue " code { (q) } } ", in " (groups.len()) " group" @if groups.len() != 1 { "s" } " (same reason and error signature; digits and ids normalised)." }
        @if total > 0 {
            form method="post" action="/dead/replay" style="display:inline" {
                input type="hidden" name="all" value="1";
                @if let Some(q) = &queue { input type="hidden" name="queue" value=(q); }
                button.primary #replay-all type="submit" { "Replay all " (total) "…" }
            }
            " "
            form method="post" action="/dead/purge" style="display:inline" {
                input type="hidden" name="all" value="1";
                @if let Some(q) = &queue { input type="hidden" name="queue" value=(q); }
                button.danger #purge-all type="submit" { "Purge all " (total) "…" }
            }
            form #selection method="post" action="/dead/replay" {
                @for (gi, g) in groups.iter().enumerate() {
                    div.group data-reason=(g.reason) data-count=(g.count) {
                        h3 { (state_badge("dead")) " " (g.reason) " — " (g.count) " job" @if g.count != 1 { "s" } }
                        p { "Error: " code.signature { (if g.signature.is_empty() { "(none)".to_owned() } else { redact_text(&g.signature) }) } }
                        @if let Some(e) = g.example.as_ref().filter(|e| **e != g.signature) { p.muted { "e.g. " (redact_text(e)) } }
                        p.muted { "Queues: " (g.queues.join(", ")) }
                        p {
                            label { input type="checkbox" data-group=(gi) onclick="var c=this.checked;var g=this.dataset.group;document.querySelectorAll('input[data-in=\"'+g+'\"]').forEach(function(x){x.checked=c;});"; " select group" }
                            " · "
                            @for id in &g.ids {
                                label style="margin-right:8px" {
                                    input type="checkbox" name="ids" value=(id) data-in=(gi);
                                    a href=(format!("/jobs/{id}")) { (id) }
                                }
                                " "
                                button type="submit" formaction=(format!("/jobs/{id}/replay")) title=(format!("replay job {id}")) class="replay-one" { "replay" }
                                " "
                            }
                            @if g.count > g.ids.len() as u64 { span.muted { "… and " (g.count - g.ids.len() as u64) " more" } }
                        }
                    }
                }
                button.primary #replay-selected type="submit" { "Replay selected" }
                " "
                button.danger #purge-selected type="submit" formaction="/dead/purge" { "Purge selected…" }
            }
        }
    };
    Ok(html_response(layout("Dead letters", true, body)))
}

struct BulkForm {
    ids: Vec<JobId>,
    all: bool,
    queue: Option<String>,
    confirmed: bool,
}

fn bulk_form(pairs: &[(String, String)]) -> Result<BulkForm, ApiError> {
    let mut f = BulkForm {
        ids: Vec::new(),
        all: false,
        queue: None,
        confirmed: false,
    };
    for (k, v) in pairs {
        match k.as_str() {
            "ids" => f.ids.push(parse_id(v)?),
            "all" => f.all = v == "1",
            "queue" if !v.is_empty() => f.queue = Some(v.clone()),
            "confirm" => f.confirmed = v == "yes",
            _ => {}
        }
    }
    if !f.all && f.ids.is_empty() {
        return Err(ApiError::bad_field(
            "ids",
            "",
            "tick at least one job, or choose all",
        ));
    }
    Ok(f)
}

fn confirm_page(verb: &str, action: &str, f: &BulkForm, count: u64) -> Response {
    let what = if f.all {
        format!(
            "all {count} dead job{}{}",
            if count == 1 { "" } else { "s" },
            f.queue
                .as_ref()
                .map(|q| format!(" of queue {q}"))
                .unwrap_or_default()
        )
    } else {
        format!(
            "{} selected dead job{}",
            f.ids.len(),
            if f.ids.len() == 1 { "" } else { "s" }
        )
    };
    let body = html! {
        div.problem #confirm {
            p { strong { (verb) " " (what) "?" } }
            @if verb == "Purge" { p { "Purged jobs and their attempts are deleted for good." } }
            form method="post" action=(action) {
                input type="hidden" name="confirm" value="yes";
                @if f.all { input type="hidden" name="all" value="1"; }
                @if let Some(q) = &f.queue { input type="hidden" name="queue" value=(q); }
                @for id in &f.ids { input type="hidden" name="ids" value=(id); }
                button #confirm-yes class=(if verb == "Purge" { "danger" } else { "primary" }) type="submit" { "Yes, " (verb.to_lowercase()) " " (what) }
                " "
                a.button href="/dead" { "No, go back" }
            }
        }
    };
    html_response(layout(&format!("{verb} dead jobs"), false, body))
}

fn done_page(verb: &str, n: u64) -> Response {
    let body = html! {
        p #done { (verb) " " (n) " dead job" @if n != 1 { "s" } "." }
        p { a href="/dead" { "Back to the dead letters" } " · " a href="/" { "Overview" } }
    };
    html_response(layout(&format!("{verb} done"), false, body))
}

async fn dead_count(state: &AppState, queue: Option<&str>) -> Result<u64, Page> {
    Ok(state
        .inner
        .store
        .dead_groups(queue, 1)
        .await?
        .iter()
        .map(|g| g.count)
        .sum())
}

fn filter_of(f: &BulkForm) -> JobFilter {
    JobFilter {
        ids: (!f.all).then(|| f.ids.clone()),
        queue: f.queue.clone(),
        ..JobFilter::default()
    }
}

async fn dead_replay(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let f = bulk_form(&form_pairs(body).await?)?;
    if f.all && !f.confirmed {
        let n = dead_count(&state, f.queue.as_deref()).await?;
        return Ok(confirm_page("Replay", "/dead/replay", &f, n));
    }
    let n = state
        .inner
        .store
        .bulk(
            BulkAction::Replay,
            &filter_of(&f),
            &actor(&who),
            false,
            Utc::now(),
        )
        .await?
        .count;
    Ok(done_page("Replayed", n))
}

async fn dead_purge(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let f = bulk_form(&form_pairs(body).await?)?;
    if !f.confirmed {
        let n = if f.all {
            dead_count(&state, f.queue.as_deref()).await?
        } else {
            f.ids.len() as u64
        };
        return Ok(confirm_page("Purge", "/dead/purge", &f, n));
    }
    let n = state
        .inner
        .store
        .bulk(
            BulkAction::Purge,
            &filter_of(&f),
            &actor(&who),
            false,
            Utc::now(),
        )
        .await?
        .count;
    Ok(done_page("Purged", n))
}

async fn breakers(State(state): State<AppState>) -> Result<Response, Page> {
    let list = breaker_views(&state.inner.store).await?;
    let now = Utc::now();
    let body = html! {
        @if list.is_empty() { p.muted { "No dependency has a breaker or a pause yet." } }
        @else {
            table #breakers {
                thead { tr { th { "Dependency" } th { "State" } th { "Override" } th { "Next probe" } th { "Probe permits" } th { "Rate limit" } th { "Paused until" } th { "Updated" } th { "Operator" } } }
                tbody {
                    @for b in &list {
                        tr data-name=(b.name) {
                            td { (b.name) }
                            td { (state_badge(&b.state)) }
                            td.override {
                                @match b.mode.as_str() {
                                    "forced_open" => { strong.state-open { "forced open" } }
                                    "forced_closed" => { strong.state-closed { "forced closed" } }
                                    _ => { span.muted { "auto" } }
                                }
                                @if b.paused_until_resumed { br; strong.state-open { "paused until resumed" } }
                            }
                            td { @match b.next_probe_at { Some(t) => { (relative(t, now)) }, None => { span.muted { "—" } } } }
                            td.n { (b.probe_permits) }
                            td.n.rate { @match b.rate_limit { Some(r) => { (format!("{r:.1}/s")) }, None => { span.muted { "none" } } } @if b.mode != "normal" { br; span.muted { (b.mode) } } }
                            td { (when(b.paused_until, now)) @if let Some(r) = &b.pause_reason { br; span.muted { (redact_text(r)) } } }
                            td { (when(Some(b.updated_at), now)) }
                            td.controls {
                                @let path = form_urlencoded::byte_serialize(b.name.as_bytes()).collect::<String>();
                                @for (mode, label) in [("open", "Force open"), ("closed", "Force closed"), ("auto", "Auto")] {
                                    form method="post" action=(format!("/breakers/{path}/force")) style="display:inline" {
                                        input type="hidden" name="mode" value=(mode);
                                        button class=(format!("force-{mode}")) type="submit" { (label) }
                                    }
                                    " "
                                }
                                br;
                                @if b.paused_until.is_some() {
                                    form method="post" action=(format!("/dependencies/{path}/resume")) style="display:inline" {
                                        button.primary.resume-dependency type="submit" { "Resume" }
                                    }
                                } @else {
                                    form method="post" action=(format!("/dependencies/{path}/pause")) style="display:inline" {
                                        input name="for" placeholder="for (e.g. 30m; empty: until resumed)" size="28";
                                        " " button.pause-dependency type="submit" { "Pause" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Recent transitions" }
            @for b in &list {
                @if !b.recent_transitions.is_empty() {
                    h3 { (b.name) }
                    ul {
                        @for t in &b.recent_transitions {
                            li { (fmt_time(t.at)) " (" (relative(t.at, now)) "): " (state_badge(&t.from)) " → " (state_badge(&t.to)) " — " (redact_text(&t.reason)) }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(layout("Breakers", true, body)))
}

async fn workers(State(state): State<AppState>) -> Result<Response, Page> {
    let store = &state.inner.store;
    let now = Utc::now();
    let list = store.workers(now).await?;
    let unhandled = store.unhandled(now).await?;
    let stale = redrive_store::WORKER_STALE_AFTER.as_secs();
    let body = html! {
        (unhandled_warning(&unhandled))
        @if list.is_empty() { p.muted #no-workers { "No live workers. Start some with " code { "redrive work" } ", " code { "redrive serve --workers N" } " or your own worker built on redrive-runtime." } }
        @else {
            table #workers {
                thead { tr { th { "Name" } th { "Host" } th { "Pid" } th { "Queues" } th { "Kinds" } th { "Concurrency" } th { "Started" } th { "Last seen" } } }
                tbody {
                    @for w in &list {
                        tr data-name=(w.name) {
                            td { (w.name) }
                            td { (w.host) }
                            td.n { (w.pid) }
                            td { @if w.queues.is_empty() { span.muted { "all" } } @else { (w.queues.join(", ")) } }
                            td.kinds { @match w.kinds.as_list() { None => { span.muted { "any" } }, Some(k) => { (k.join(", ")) } } }
                            td.n { (w.concurrency) }
                            td { (when(Some(w.started_at), now)) }
                            td { (relative(w.last_seen, now)) }
                        }
                    }
                }
            }
        }
        p.muted { "Each worker refreshes its row every few seconds; one not seen for " (stale) " s counts as gone." }
    };
    Ok(html_response(layout("Workers", true, body)))
}

/// The search box: a job id, an idempotency key or a dependency. One job found (and no
/// dependency) goes straight to that job; otherwise a page lists what matched.
async fn search(State(state): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, Page> {
    let term = form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "q")
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    if term.is_empty() {
        return Err(ApiError::bad_field(
            "q",
            "",
            "type a job id, an idempotency key or a dependency",
        )
        .into());
    }
    let store = &state.inner.store;
    let by_id = match term.parse::<JobId>() {
        Ok(id) => store.get(id).await?,
        Err(_) => None,
    };
    let by_key = store
        .list(&redrive_store::ListParams {
            key: Some(term.clone()),
            limit: Some(100),
            ..Default::default()
        })
        .await?
        .jobs;
    let dependency = store.dependency(&term).await?;
    let jobs: Vec<&Job> = by_id.iter().chain(by_key.iter()).collect();
    if jobs.len() == 1 && dependency.is_none() {
        return Ok(Redirect::to(&format!("/jobs/{}", jobs[0].id)).into_response());
    }
    let now = Utc::now();
    let body = html! {
        p { "Results for " code #search-term { (term) } }
        @if jobs.is_empty() && dependency.is_none() {
            p.muted #no-results { "No job has this id or idempotency key, and no dependency has this name." }
        }
        @if !jobs.is_empty() {
            h2 { "Jobs" }
            table #jobs {
                thead { tr { th { "Id" } th { "Queue" } th { "Kind" } th { "State" } th { "Attempts" } th { "Run at" } th { "Reason / last error" } } }
                tbody { @for j in &jobs { (job_row(j, now)) } }
            }
        }
        @if let Some(d) = &dependency {
            h2 { "Dependency" }
            p #dependency-result { a href="/breakers" { (d.name) } ": breaker " (state_badge(d.flow.state.as_str()))
                @if let Some(t) = d.flow.paused_until { @if t > now { " · paused " (relative(t, now)) } } }
        }
    };
    Ok(html_response(layout("Search", false, body)))
}

/// Where to go after signing in: a path of this site, else `/`. It must start with one `/`
/// (not `//`, which a browser reads as another host) and hold only visible ASCII, no
/// backslash: browsers drop tabs and newlines and read `\` as `/`, so `/<TAB>/evil.com` and
/// `/\evil.com` would leave the site, and CR/LF would split the `Location` header.
pub(crate) fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

fn login_page(next: &str, error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        false,
        html! {
            @if let Some(e) = error { div.problem { (e) } }
            form method="post" action="/login" {
                input type="hidden" name="next" value=(next);
                label { "API token " input type="password" name="token" autocomplete="current-password" autofocus; }
                " " button.primary type="submit" { "Sign in" }
            }
            p.muted { "The token is the one given to " code { "redrive serve" } " (REDRIVE_API_TOKEN, --token-file or --token)." }
        },
    )
}

async fn login_form(State(state): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let next = form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "next")
        .map(|(_, v)| v.into_owned());
    let next = safe_next(next.as_deref());
    if state.inner.token.is_none() {
        return Redirect::to(&next).into_response();
    }
    html_response(login_page(&next, None))
}

/// 429 problem+json for a client over its failed logins.
fn too_many_logins(retry_after: Duration) -> Response {
    let secs = retry_after.as_secs().max(1);
    let mut res = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-logins",
        "Too many failed logins",
        format!(
            "more than {} failed logins in a minute from this address; try again in {secs} s",
            crate::session::LOGIN_FAILURES_PER_MINUTE
        ),
    )
    .into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    res
}

/// The session cookie's attributes (`Secure` with `--cookie-secure`).
fn cookie_attributes(state: &AppState) -> &'static str {
    if state.inner.cookie_secure {
        "Path=/; HttpOnly; SameSite=Strict; Secure"
    } else {
        "Path=/; HttpOnly; SameSite=Strict"
    }
}

async fn login(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let Some(token) = &state.inner.token else {
        let pairs = form_pairs(body).await?;
        let next = pairs
            .iter()
            .find(|(n, _)| n == "next")
            .map(|(_, v)| v.as_str());
        return Ok(Redirect::to(&safe_next(next)).into_response());
    };
    let ip = peer.map(|Extension(ConnectInfo(a))| a.ip());
    if let Err(wait) = state.inner.logins.check(ip) {
        return Ok(too_many_logins(wait));
    }
    let pairs = form_pairs(body).await?;
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let next = safe_next(get("next"));
    let Some(identity) = get("token").and_then(|t| token.find(t)).cloned() else {
        state.inner.logins.failed(ip);
        tracing::warn!(client = ?ip, "failed dashboard login");
        let mut res = html_response(login_page(&next, Some("That token is not valid.")));
        *res.status_mut() = StatusCode::UNAUTHORIZED;
        return Ok(res);
    };
    let id = state.inner.sessions.create(identity);
    let mut res = Redirect::to(&next).into_response();
    let cookie = format!(
        "{SESSION_COOKIE}={id}; {}; Max-Age={}",
        cookie_attributes(&state),
        state.inner.sessions.ttl().as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(res)
}

async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    if let Some(id) = auth::cookie(&headers, SESSION_COOKIE) {
        state.inner.sessions.revoke(id);
    }
    let mut res = Redirect::to("/login").into_response();
    let clear = format!(
        "{SESSION_COOKIE}=; {}; Max-Age=0",
        cookie_attributes(&state)
    );
    if let Ok(v) = HeaderValue::from_str(&clear) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(res)
}
