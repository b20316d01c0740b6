//! Every row of the decision table in docs/design.md, run through the real executor against a real
//! SQLite store, with tokio's paused clock (the worker's clock follows it), so that every
//! delay is exact and no test waits in real time.
//!
//! The store lives on its own runtime and is called from blocking threads
//! (`WorkerBuilder::store_runtime`), which keeps the paused clock from jumping while SQLite
//! answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use redrive_policy::{
    BreakerConfig, BreakerState, Jitter, Outcome, PolicySet, RetryPolicy, Window,
};
use redrive_runtime::{Attempted, Handler, JobContext, StatusAnswer, TokioClock, Worker};
use redrive_store::{Clock, JobId, JobState, NewJob, Store};
use serde_json::json;

static DB_RT: std::sync::LazyLock<tokio::runtime::Runtime> = std::sync::LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
});

/// Runs a store call on the store's runtime.
async fn on_db<T, Fut>(f: impl FnOnce() -> Fut + Send + 'static) -> T
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    tokio::task::spawn_blocking(move || DB_RT.block_on(f()))
        .await
        .unwrap()
}

struct Env {
    store: Store,
    clock: Arc<TokioClock>,
    _dir: tempfile::TempDir,
}

async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let store = on_db(move || async move { Store::connect(&url).await.unwrap() }).await;
    Env {
        store,
        clock: Arc::new(TokioClock::new()),
        _dir: dir,
    }
}

impl Env {
    /// A store call on the store's runtime.
    async fn db<T, Fut>(&self, f: impl FnOnce(Store) -> Fut + Send + 'static) -> T
    where
        T: Send + 'static,
        Fut: std::future::Future<Output = T> + Send + 'static,
    {
        let s = self.store.clone();
        on_db(move || f(s)).await
    }
    async fn enqueue(&self, job: NewJob) -> JobId {
        let now = self.clock.now();
        self.db(move |s| async move { s.enqueue(&job, now).await.unwrap().job.id })
            .await
    }
    async fn get(&self, id: JobId) -> redrive_store::Job {
        self.db(move |s| async move { s.get(id).await.unwrap().unwrap() })
            .await
    }
    async fn attempts(&self, id: JobId) -> Vec<redrive_store::Attempt> {
        self.db(move |s| async move { s.attempts(id).await.unwrap() })
            .await
    }
    async fn dependency(&self, name: &'static str) -> redrive_store::Dependency {
        self.db(move |s| async move { s.dependency(name).await.unwrap().unwrap() })
            .await
    }
    async fn events(&self) -> Vec<redrive_store::DependencyEvent> {
        self.db(|s| async move { s.dependency_events(Some("psp"), 10).await.unwrap() })
            .await
    }
    async fn count(&self, state: JobState) -> u64 {
        self.db(move |s| async move {
            s.counts()
                .await
                .unwrap()
                .into_iter()
                .filter(|c| c.state == state)
                .map(|c| c.count)
                .sum()
        })
        .await
    }
    /// Opens the `psp` breaker by hand, its cool-down already over.
    async fn open_cooled_down(&self) {
        let u = redrive_store::BreakerUpdate {
            dependency: "psp".into(),
            expect: None,
            state: BreakerState::Open,
            open_until: Some(self.clock.now()),
            probe_permits: 0,
            reason: "test".into(),
            now: self.clock.now(),
        };
        self.db(move |s| async move { s.set_breaker(&u).await.unwrap() })
            .await;
    }
    fn worker(&self, kind: &str, h: Arc<dyn Handler>) -> redrive_runtime::WorkerBuilder {
        Worker::builder(self.store.clone(), vec!["q".into()])
            .handler(kind, h)
            .clock(self.clock.clone())
            .gauge_interval(None)
            .store_runtime(DB_RT.handle().clone())
            .seed(11)
    }
}

/// Answers each call with the next outcome of a script (the last one repeats); counts calls.
#[derive(Debug)]
struct Script {
    steps: Vec<Attempted>,
    calls: AtomicU32,
    refreshes: AtomicU32,
    status: Option<StatusAnswer>,
}

fn script(steps: Vec<Attempted>) -> Arc<Script> {
    Arc::new(Script {
        steps,
        calls: AtomicU32::new(0),
        refreshes: AtomicU32::new(0),
        status: None,
    })
}

impl Handler for Script {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) as usize;
        let a = self.steps[n.min(self.steps.len() - 1)].clone();
        Box::pin(async move {
            if a.error.as_deref() == Some("panic") {
                panic!("handler bug");
            }
            a
        })
    }
    fn refresh_credentials(&self) -> BoxFuture<'static, Result<(), String>> {
        self.refreshes.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
    fn query_status(&self, _ctx: JobContext) -> Option<BoxFuture<'static, StatusAnswer>> {
        let s = self.status.clone()?;
        Some(Box::pin(async move { s }))
    }
}

fn ok() -> Attempted {
    Attempted::success(json!({"charge": "ch_1"}))
}
fn fail(o: Outcome, status: u16) -> Attempted {
    Attempted::failure(o, format!("status {status}")).with_status(status)
}
fn rate_limited(secs: u64) -> Attempted {
    fail(
        Outcome::RateLimited {
            retry_after: Some(Duration::from_secs(secs)),
        },
        429,
    )
}
fn infra() -> Attempted {
    fail(Outcome::Infrastructure { retry_after: None }, 503)
}

#[tokio::test(start_paused = true)]
async fn success_stores_the_result() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let h = script(vec![ok()]);
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts), (1, 1));
    let j = e.get(id).await;
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(j.result, Some(json!({"charge": "ch_1"})));
}

#[tokio::test(start_paused = true)]
async fn permanent_is_dead_at_once() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let h = script(vec![fail(Outcome::Permanent, 422)]);
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.dead, s.attempts), (1, 1));
    let j = e.get(id).await;
    assert_eq!(
        (j.state, j.dead_reason.map(|r| r.as_str())),
        (JobState::Dead, Some("permanent"))
    );
    let a = e.attempts(id).await;
    assert_eq!((a.len(), a[0].http_status), (1, Some(422)));
}

#[tokio::test(start_paused = true)]
async fn a_first_401_refreshes_and_calls_again_without_using_an_attempt() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let h = script(vec![fail(Outcome::Auth, 401), ok()]);
    let t0 = e.clock.now();
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts), (1, 2));
    assert_eq!(h.refreshes.load(Ordering::SeqCst), 1);
    assert_eq!(e.clock.now(), t0, "called again at once");
    let j = e.get(id).await;
    assert_eq!(j.attempts, 1, "the 401 did not count");
    let a = e.attempts(id).await;
    assert_eq!(
        a.iter().map(|a| a.counted).collect::<Vec<_>>(),
        [false, true]
    );
}

#[tokio::test(start_paused = true)]
async fn the_second_401_in_a_row_is_final() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let h = script(vec![fail(Outcome::Auth, 401)]);
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.dead, s.attempts), (1, 2));
    assert_eq!(h.refreshes.load(Ordering::SeqCst), 1);
    let j = e.get(id).await;
    assert_eq!(j.dead_reason.map(|r| r.as_str()), Some("auth"));
}

/// 401 until the credentials were refreshed; each call takes 10 ms, so all jobs are in flight
/// with the old credentials at once.
#[derive(Debug, Default)]
struct Creds {
    version: AtomicU32,
    refreshes: AtomicU32,
}
impl Handler for Creds {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        let seen = self.version.load(Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if seen == 0 {
                fail(Outcome::Auth, 401)
            } else {
                ok()
            }
        })
    }
    fn refresh_credentials(&self) -> BoxFuture<'static, Result<(), String>> {
        self.refreshes.fetch_add(1, Ordering::SeqCst);
        self.version.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn one_refresh_is_shared_by_every_job_that_hit_the_same_401() {
    let e = env().await;
    for i in 0..10 {
        e.enqueue(NewJob::new("q", "k", json!({})).key(format!("k{i}")))
            .await;
    }
    let h = Arc::new(Creds::default());
    let s = e
        .worker("k", h.clone())
        .concurrency(10)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts), (10, 20));
    assert_eq!(h.refreshes.load(Ordering::SeqCst), 1, "one refresh for all");
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_with_retry_after_45s_defers_instead_of_sleeping_and_pauses_the_dependency() {
    let e = env().await;
    let id = e
        .enqueue(NewJob::new("q", "k", json!({})).dependency("psp"))
        .await;
    let h = script(vec![rate_limited(45)]);
    let t0 = e.clock.now();
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.deferred, s.attempts), (1, 1));
    assert!(
        e.clock.now() - t0 < chrono::Duration::seconds(1),
        "no sleep"
    );
    let j = e.get(id).await;
    assert_eq!(
        (j.state, j.defer_reason.map(|r| r.as_str())),
        (JobState::Deferred, Some("rate_limited"))
    );
    let ms = (j.run_at - t0).num_milliseconds();
    assert!((44_999..=45_050).contains(&ms), "{ms}");
    let a = e.attempts(id).await;
    assert_eq!(
        (a[0].delay, a[0].mode.map(|m| m.as_str())),
        (Some(Duration::from_secs(45)), Some("defer"))
    );
    let dep = e.dependency("psp").await;
    let ms = (dep.flow.paused_until.unwrap() - t0).num_milliseconds();
    assert!((44_999..=45_050).contains(&ms), "{ms}");
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_of_2s_retries_in_process_after_exactly_that() {
    let e = env().await;
    let id = e
        .enqueue(NewJob::new("q", "k", json!({})).dependency("psp"))
        .await;
    let h = script(vec![rate_limited(2), ok()]);
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts), (1, 2));
    let a = e.attempts(id).await;
    assert_eq!(
        (a[0].delay, a[0].mode.map(|m| m.as_str())),
        (Some(Duration::from_secs(2)), Some("retry"))
    );
    let gap = a[1].started_at - a[0].started_at;
    assert!(gap >= chrono::Duration::seconds(2), "{gap}");
    assert!(gap < chrono::Duration::milliseconds(2_100), "{gap}");
}

#[tokio::test(start_paused = true)]
async fn infrastructure_failures_back_off_then_exhaust_the_attempts() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let policy = RetryPolicy::builder("t")
        .with_max_attempts(3)
        .with_jitter(Jitter::None)
        .build()
        .unwrap();
    let h = script(vec![infra()]);
    let s = e
        .worker("k", h.clone())
        .kind_policy("k", policy)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.dead, s.attempts), (1, 3));
    let j = e.get(id).await;
    assert_eq!(
        j.dead_reason.map(|r| r.as_str()),
        Some("attempts_exhausted")
    );
    let delays: Vec<_> = e.attempts(id).await.iter().map(|a| a.delay).collect();
    let base = redrive_policy::DEFAULT_BASE;
    assert_eq!(
        delays,
        [Some(base), Some(2 * base), None],
        "base, doubling, no jitter"
    );
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_timeout_with_a_key_is_repeated_with_the_same_key() {
    let e = env().await;
    let id = e
        .enqueue(NewJob::new("q", "k", json!({})).key("order-9"))
        .await;
    let h = script(vec![fail(Outcome::Timeout { idempotent: true }, 0), ok()]);
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts), (1, 2));
    assert_eq!(
        e.attempts(id).await[0].class.as_str(),
        "timeout".to_string()
    );
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_timeout_without_a_key_or_hook_is_dead_ambiguous() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let h = script(vec![fail(Outcome::Timeout { idempotent: false }, 0), ok()]);
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.dead, s.attempts), (1, 1));
    let j = e.get(id).await;
    assert_eq!(j.dead_reason.map(|r| r.as_str()), Some("ambiguous"));
}

#[tokio::test(start_paused = true)]
async fn the_status_query_settles_an_ambiguous_timeout() {
    // The PSP says the charge went through: success, no second call.
    let e = env().await;
    let a = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let mut h = script(vec![fail(Outcome::Timeout { idempotent: false }, 0), ok()]);
    Arc::get_mut(&mut h).unwrap().status = Some(StatusAnswer::Succeeded(json!({"found": true})));
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts), (1, 1));
    assert_eq!(h.calls.load(Ordering::SeqCst), 1);
    let j = e.get(a).await;
    assert_eq!(j.result, Some(json!({"found": true})));

    // The PSP never saw it: calling again is safe.
    let e = env().await;
    e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let mut h = script(vec![fail(Outcome::Timeout { idempotent: false }, 0), ok()]);
    Arc::get_mut(&mut h).unwrap().status = Some(StatusAnswer::NotFound);
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts), (1, 2));

    // The PSP cannot tell: dead, ambiguous.
    let e = env().await;
    let c = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let mut h = script(vec![fail(Outcome::Timeout { idempotent: false }, 0), ok()]);
    Arc::get_mut(&mut h).unwrap().status = Some(StatusAnswer::Unknown("psp 500".into()));
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.dead, s.attempts), (1, 1));
    let j = e.get(c).await;
    assert_eq!(j.dead_reason.map(|r| r.as_str()), Some("ambiguous"));
    assert!(j.last_error.unwrap().contains("psp 500"));
}

#[tokio::test(start_paused = true)]
async fn a_panic_counts_as_an_exception_and_max_exceptions_ends_the_job() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let policy = RetryPolicy::builder("t")
        .with_max_attempts(10)
        .with_max_exceptions(2)
        .build()
        .unwrap();
    let h = script(vec![Attempted::failure(Outcome::Exception, "panic")]);
    let s = e
        .worker("k", h.clone())
        .kind_policy("k", policy)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.dead, s.attempts), (1, 2));
    let j = e.get(id).await;
    assert_eq!(
        j.dead_reason.map(|r| r.as_str()),
        Some("exceptions_exhausted")
    );
    assert_eq!(j.exceptions, 2);
    let a = e.attempts(id).await;
    assert!(a[0].error.as_deref().unwrap().contains("handler bug"));
    assert_eq!(a[0].class.as_str(), "exception");
}

fn breaker_policies(min_calls: u32) -> PolicySet {
    let mut set = PolicySet::builtin();
    set.insert_breaker(
        "psp",
        BreakerConfig::builder()
            .with_window(Window::Count { size: 10 })
            .with_minimum_calls(min_calls)
            .with_failure_rate(0.5)
            .with_open_cooldown(Duration::from_secs(30))
            .with_half_open_probes(1)
            .build()
            .unwrap(),
    );
    set
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_defers_without_an_attempt_and_its_jobs_are_not_claimed() {
    let e = env().await;
    let first = e
        .enqueue(NewJob::new("q", "k", json!({})).dependency("psp"))
        .await;
    for _ in 0..4 {
        e.enqueue(NewJob::new("q", "k", json!({})).dependency("psp"))
            .await;
    }
    let h = script(vec![infra()]);
    let t0 = e.clock.now();
    let s = e
        .worker("k", h.clone())
        .policies(breaker_policies(2))
        .concurrency(1)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    // Two failures open the breaker; the first job's next try is blocked (not an attempt),
    // and the other four are not even claimed.
    assert_eq!(s.attempts, 2, "{s:?}");
    assert_eq!(s.deferred, 1, "{s:?}");
    let dep = e.dependency("psp").await;
    assert_eq!(dep.flow.state, BreakerState::Open);
    let until = dep.flow.open_until.unwrap();
    let j = e.get(first).await;
    assert_eq!(
        (j.state, j.defer_reason.map(|r| r.as_str()), j.attempts),
        (JobState::Deferred, Some("breaker_open"), 2)
    );
    assert!(j.run_at >= until, "deferred to the probe time");
    let available = e.count(JobState::Available).await;
    assert_eq!(available, 4);
    let events = e.events().await;
    assert_eq!(
        (events[0].from.as_str(), events[0].to.as_str()),
        ("closed", "open")
    );
    assert!(until > t0);
}

#[tokio::test(start_paused = true)]
async fn after_the_cool_down_one_probe_closes_the_breaker_for_everyone() {
    let e = env().await;
    for _ in 0..3 {
        e.enqueue(NewJob::new("q", "k", json!({})).dependency("psp"))
            .await;
    }
    e.open_cooled_down().await;
    let h = script(vec![ok()]);
    let s = e
        .worker("k", h.clone())
        .policies(breaker_policies(2))
        .concurrency(1)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts), (3, 3));
    let dep = e.dependency("psp").await;
    assert_eq!(dep.flow.state, BreakerState::Closed);
    let ev: Vec<_> = e
        .events()
        .await
        .into_iter()
        .map(|e| format!("{}>{}", e.from, e.to))
        .collect();
    assert_eq!(ev, ["half_open>closed", "open>half_open", "closed>open"]);
}

/// Waits until its lease is taken away, then for ever.
#[derive(Debug, Default)]
struct Forever(AtomicU32);

impl Handler for Forever {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            ctx.cancel.cancelled().await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            ok()
        })
    }
}

/// Watches its token from a task of its own (which outlives the call), then waits for ever;
/// or, with `own`, cancels its token itself and succeeds.
#[derive(Debug, Default)]
struct Watches {
    own: bool,
    calls: AtomicU32,
    seen: Arc<AtomicBool>,
}

impl Handler for Watches {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.own {
            ctx.cancel.cancel();
            return Box::pin(async { ok() });
        }
        let (cancel, seen) = (ctx.cancel.clone(), self.seen.clone());
        tokio::spawn(async move {
            cancel.cancelled().await;
            seen.store(true, Ordering::SeqCst);
        });
        Box::pin(std::future::pending())
    }
}

/// A handler cancelling its own token is not a lost lease: the token is the handler's, not
/// the claim's (the heartbeat cancels both when the lease is lost).
#[tokio::test(start_paused = true)]
async fn a_handler_cancelling_its_own_token_is_not_a_lost_lease() {
    let e = env().await;
    e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let own = Arc::new(Watches {
        own: true,
        ..Watches::default()
    });
    let s = e
        .worker("k", own)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.lease_lost), (1, 0), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_probe_abandoned_by_a_lost_lease_gives_its_permit_back_to_the_round() {
    let e = env().await;
    let id = e
        .enqueue(NewJob::new("q", "k", json!({})).dependency("psp"))
        .await;
    // The job's call is the round's one probe.
    e.open_cooled_down().await;
    let h = Arc::new(Forever::default());
    let w = e
        .worker("k", h.clone())
        .policies(breaker_policies(2))
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let run = tokio::spawn(async move { w.run_until_idle().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let probing = e.dependency("psp").await.flow;
    assert_eq!(
        (probing.state, probing.probe_permits),
        (BreakerState::HalfOpen, 0)
    );
    // An operator cancels the job mid-call: the probe is abandoned without an answer.
    let now = e.clock.now();
    e.db(move |s| async move { s.cancel(id, now).await.unwrap() })
        .await;
    let s = run.await.unwrap().unwrap();
    assert_eq!((s.lease_lost, s.attempts), (1, 0), "{s:?}");
    assert_eq!(h.0.load(Ordering::SeqCst), 1);
    // Its permit is back: the next job probes now, not after `half_open_timeout`.
    let after = e.dependency("psp").await.flow;
    assert_eq!(
        (after.state, after.probe_permits),
        (BreakerState::HalfOpen, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_pause_seen_by_one_job_blocks_the_others_and_a_blocked_job_past_its_deadline_dies() {
    let e = env().await;
    // "b" fails once (503) and would retry in process after 100 ms; meanwhile "a" gets a 429
    // with Retry-After 300 s, which pauses the dependency for everyone. b's deadline (10 s)
    // comes before the pause ends: b dies with reason deadline, without another attempt.
    let a = e
        .enqueue(NewJob::new("q", "a", json!({})).dependency("psp"))
        .await;
    let b = e
        .enqueue(
            NewJob::new("q", "b", json!({}))
                .dependency("psp")
                .ttl(Duration::from_secs(10)),
        )
        .await;
    #[derive(Debug)]
    struct Slow429;
    impl Handler for Slow429 {
        fn run(&self, _: JobContext) -> BoxFuture<'static, Attempted> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                rate_limited(300)
            })
        }
    }
    let fixed = RetryPolicy::builder("fixed")
        .with_jitter(Jitter::None)
        .build()
        .unwrap();
    let hb = script(vec![infra(), ok()]);
    let s = e
        .worker("a", Arc::new(Slow429))
        .handler("b", hb.clone())
        .kind_policy("b", fixed)
        .concurrency(2)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(
        hb.calls.load(Ordering::SeqCst),
        1,
        "b was not called while paused"
    );
    assert_eq!((s.attempts, s.deferred, s.dead), (2, 1, 1), "{s:?}");
    let ja = e.get(a).await;
    assert_eq!(ja.defer_reason.map(|r| r.as_str()), Some("rate_limited"));
    let jb = e.get(b).await;
    assert_eq!(
        (jb.state, jb.dead_reason.map(|r| r.as_str()), jb.attempts),
        (JobState::Dead, Some("deadline"), 1)
    );
    // While paused, nothing of that dependency is claimed.
    e.enqueue(NewJob::new("q", "b", json!({})).dependency("psp"))
        .await;
    let s = e
        .worker("b", hb.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(s.finished(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_cancels_the_handler_and_writes_nothing() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    let h = Arc::new(Watches::default());
    let w = e
        .worker("k", h.clone())
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let run = tokio::spawn(async move { w.run_until_idle().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // An operator cancels the running job: its lease is revoked.
    let now = e.clock.now();
    e.db(move |s| async move { s.cancel(id, now).await.unwrap() })
        .await;
    let s = run.await.unwrap().unwrap();
    assert_eq!((s.lease_lost, s.succeeded, s.attempts), (1, 0, 0), "{s:?}");
    assert_eq!(h.calls.load(Ordering::SeqCst), 1);
    // The handler's token is cancelled too (it may have work of its own to stop).
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        h.seen.load(Ordering::SeqCst),
        "the handler's token was not cancelled"
    );
    assert_eq!(e.get(id).await.state, JobState::Cancelled);
    assert!(e.attempts(id).await.is_empty(), "nothing written");
}

/// Times of the handler's calls (tokio time, paused).
#[derive(Debug, Default)]
struct Stamps(std::sync::Mutex<Vec<tokio::time::Instant>>);

impl Handler for Stamps {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        self.0.lock().unwrap().push(tokio::time::Instant::now());
        Box::pin(async { ok() })
    }
}

#[tokio::test(start_paused = true)]
async fn a_send_slot_beyond_the_reservation_horizon_is_waited_for_in_process() {
    // 2 calls per second, 8 jobs at once: the last slot is 3.5 s away, beyond the one second
    // a process reserves ahead but within the 10 s wait in process. Every job waits for its
    // slot holding its lease: none is deferred, and the calls keep to the rate.
    let e = env().await;
    for _ in 0..8 {
        e.enqueue(NewJob::new("q", "k", json!({})).dependency("psp"))
            .await;
    }
    let mut set = PolicySet::builtin();
    set.insert_flow(
        "psp",
        redrive_policy::FlowConfig::default()
            .with_rate(
                redrive_policy::RateConfig::fixed(2.0)
                    .unwrap()
                    .with_burst(0),
            )
            .unwrap(),
    );
    let h = Arc::new(Stamps::default());
    let s = e
        .worker("k", h.clone())
        .policies(set)
        .concurrency(8)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.succeeded, s.attempts, s.deferred), (8, 8, 0), "{s:?}");
    let mut at = h.0.lock().unwrap().clone();
    at.sort();
    for w in at.windows(2) {
        assert!(
            w[1] - w[0] >= Duration::from_millis(499),
            "calls {:?} apart",
            w[1] - w[0]
        );
    }
    assert!(at[7] - at[0] >= Duration::from_millis(3_490));
}

#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_its_send_slot_is_not_made_once_the_breaker_opened() {
    // 2 calls per second and four jobs at once: the first calls now and fails 200 ms later,
    // which opens the breaker (one failure is enough here); the others hold send slots
    // 0.5 s, 1 s and 1.5 s ahead by then. Waking at its slot, each looks at the breaker again: none calls the
    // dependency while it is open, all are deferred.
    let e = env().await;
    for _ in 0..4 {
        e.enqueue(NewJob::new("q", "k", json!({})).dependency("psp"))
            .await;
    }
    let mut set = PolicySet::builtin();
    let breaker = BreakerConfig::builder()
        .with_window(Window::Count { size: 10 })
        .with_minimum_calls(1)
        .with_failure_rate(0.5)
        .with_open_cooldown(Duration::from_secs(30))
        .with_half_open_probes(1)
        .build()
        .unwrap();
    set.insert_flow(
        "psp",
        redrive_policy::FlowConfig::default()
            .with_breaker(breaker)
            .with_rate(
                redrive_policy::RateConfig::fixed(2.0)
                    .unwrap()
                    .with_burst(0),
            )
            .unwrap(),
    );
    let h = Arc::new(SlowFirstFails::default());
    let s = e
        .worker("k", h.clone())
        .policies(set)
        .concurrency(4)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(e.dependency("psp").await.flow.state, BreakerState::Open);
    assert_eq!(h.0.load(Ordering::SeqCst), 1, "{s:?}");
    assert_eq!((s.attempts, s.deferred), (1, 4), "{s:?}");
}

/// The first call fails after 200 ms (the others have taken their send slots by then); every
/// later call succeeds at once. Counts calls.
#[derive(Debug, Default)]
struct SlowFirstFails(AtomicU32);

impl Handler for SlowFirstFails {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                infra()
            } else {
                ok()
            }
        })
    }
}

// ===== card declines (issue 18) =====

fn declined(advice: redrive_policy::DeclineAdvice) -> Attempted {
    fail(Outcome::Declined(advice), 402)
}
fn visa(cat: u8) -> Attempted {
    declined(redrive_policy::DeclineAdvice::visa("05", Some(cat)).unwrap())
}
fn mac(m: u8) -> Attempted {
    declined(redrive_policy::DeclineAdvice::mastercard("05", Some(m)).unwrap())
}
fn card_job() -> NewJob {
    NewJob::new("q", "k", json!({}))
        .quota_key("fp_card")
        .dependency("psp")
}

#[tokio::test(start_paused = true)]
async fn a_visa_category_1_decline_is_dead_after_one_attempt_never_a_second_call() {
    let e = env().await;
    let id = e.enqueue(card_job()).await;
    let h = script(vec![visa(1), ok()]);
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.dead, s.attempts), (1, 1));
    let j = e.get(id).await;
    assert_eq!(
        (j.state, j.dead_reason.map(|r| r.as_str())),
        (JobState::Dead, Some("do_not_retry"))
    );
    // An operator's replay does not make the second call either: the rule is the card's.
    let now = e.clock.now();
    let n = e
        .db(move |s| async move {
            s.replay(&redrive_store::Selection::Ids(vec![id]), now)
                .await
                .unwrap()
        })
        .await;
    assert_eq!(n, 1);
    e.worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(h.calls.load(Ordering::SeqCst), 1, "never a second call");
    let j = e.get(id).await;
    assert_eq!(j.dead_reason.map(|r| r.as_str()), Some("do_not_retry"));
    let d = e
        .db(move |s| async move { s.declines(id).await.unwrap() })
        .await;
    assert_eq!(
        (d.len(), d[0].category, d[0].rule.as_str()),
        (1, Some(1), "never_retry")
    );
}

#[tokio::test(start_paused = true)]
async fn a_mac_25_decline_defers_exactly_24h_then_one_attempt() {
    let e = env().await;
    let id = e.enqueue(card_job()).await;
    let h = script(vec![mac(25), ok()]);
    let t0 = e.clock.now();
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.deferred, s.attempts), (1, 1));
    let j = e.get(id).await;
    assert_eq!(
        (j.state, j.defer_reason.map(|r| r.as_str())),
        (JobState::Deferred, Some("decline_advice"))
    );
    let a = e.attempts(id).await;
    assert_eq!(j.run_at, a[0].started_at + chrono::Duration::hours(24));
    assert!(j.run_at + chrono::Duration::milliseconds(1) >= t0 + chrono::Duration::hours(24));
    // Nothing is called before the wait is over.
    tokio::time::advance(Duration::from_secs(24 * 3600 - 60)).await;
    e.worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(h.calls.load(Ordering::SeqCst), 1);
    tokio::time::advance(Duration::from_secs(120)).await;
    let s = e
        .worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(
        (s.succeeded, s.attempts),
        (1, 1),
        "then exactly one attempt"
    );
    assert_eq!(h.calls.load(Ordering::SeqCst), 2);
    let r = e
        .db(|s| async move {
            s.reattempts("fp_card", redrive_store::from_millis(0))
                .await
                .unwrap()
        })
        .await;
    assert_eq!(
        r.len(),
        1,
        "the call after the decline counted as a reattempt"
    );
}

#[tokio::test(start_paused = true)]
async fn a_mac_21_decline_is_dead_recurring_stopped() {
    let e = env().await;
    let id = e.enqueue(card_job()).await;
    let h = script(vec![mac(21), ok()]);
    e.worker("k", h.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    let j = e.get(id).await;
    assert_eq!(j.dead_reason.map(|r| r.as_str()), Some("recurring_stopped"));
    assert_eq!(h.calls.load(Ordering::SeqCst), 1);
}

fn quota_policies(retry_later: Duration, deadline: Option<Duration>) -> PolicySet {
    let mut set = PolicySet::builtin();
    let mut b = RetryPolicy::builder("payment")
        .with_decline_retry_later(retry_later)
        .with_jitter(Jitter::None);
    if let Some(d) = deadline {
        b = b.with_deadline(d);
    }
    set.insert(b.build().unwrap());
    set.set_quotas(redrive_policy::QuotaRules::none().with(
        redrive_policy::Network::Visa,
        vec![redrive_policy::QuotaWindow::new(2, Duration::from_secs(3600)).unwrap()],
    ));
    set
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_card_quota_defers_to_the_window_edge_without_a_call() {
    let e = env().await;
    let id = e.enqueue(card_job()).await;
    let h = script(vec![visa(2)]);
    let set = quota_policies(Duration::from_secs(600), None);
    let mut reattempt_times = Vec::new();
    for round in 0..3 {
        e.worker("k", h.clone())
            .policies(set.clone())
            .build()
            .unwrap()
            .run_until_idle()
            .await
            .unwrap();
        if round > 0 {
            reattempt_times.push(e.attempts(id).await.last().unwrap().started_at);
        }
        tokio::time::advance(Duration::from_secs(600)).await;
    }
    // The first call and two reattempts: the quota of 2 per hour is used up.
    assert_eq!(h.calls.load(Ordering::SeqCst), 3);
    let s = e
        .worker("k", h.clone())
        .policies(set.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((s.attempts, s.deferred), (0, 1), "no call: {s:?}");
    let j = e.get(id).await;
    assert_eq!(
        (j.state, j.defer_reason.map(|r| r.as_str())),
        (JobState::Deferred, Some("reattempt_quota"))
    );
    assert_eq!(
        j.run_at,
        reattempt_times[0] + chrono::Duration::hours(1),
        "the window's edge"
    );
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_card_quota_past_the_deadline_is_dead_reattempt_quota() {
    let e = env().await;
    let set = quota_policies(Duration::from_secs(600), Some(Duration::from_secs(2400)));
    let policy = set.get("payment").unwrap().clone();
    let id = e.enqueue(card_job().with_policy(&policy)).await;
    let h = script(vec![visa(2)]);
    for _ in 0..3 {
        e.worker("k", h.clone())
            .policies(set.clone())
            .build()
            .unwrap()
            .run_until_idle()
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(600)).await;
    }
    assert_eq!(h.calls.load(Ordering::SeqCst), 3);
    e.worker("k", h.clone())
        .policies(set.clone())
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    let j = e.get(id).await;
    assert_eq!(
        (j.state, j.dead_reason.map(|r| r.as_str())),
        (JobState::Dead, Some("reattempt_quota"))
    );
    assert_eq!(h.calls.load(Ordering::SeqCst), 3, "no call");
}

#[tokio::test(start_paused = true)]
async fn declines_never_open_the_breaker() {
    let e = env().await;
    for _ in 0..6 {
        e.enqueue(card_job()).await;
    }
    let h = script(vec![visa(2)]);
    let s = e
        .worker("k", h.clone())
        .policies(breaker_policies(2))
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(s.attempts, 6);
    // Six declines in a row with a breaker that opens after two failures: still closed (no
    // row was ever written for it, or a closed one).
    let dep = e
        .db(|s| async move { s.dependency("psp").await.unwrap() })
        .await;
    assert!(
        dep.as_ref()
            .is_none_or(|d| d.flow.state == BreakerState::Closed),
        "{dep:?}"
    );
    let events = e
        .db(|s| async move { s.dependency_events(Some("psp"), 10).await.unwrap() })
        .await;
    assert!(events.is_empty(), "{events:?}");
    // The same with 503s opens it: the test can fail.
    let e2 = env().await;
    for _ in 0..6 {
        e2.enqueue(card_job()).await;
    }
    e2.worker("k", script(vec![infra()]))
        .policies(breaker_policies(2))
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(e2.dependency("psp").await.flow.state, BreakerState::Open);
}

/// A call longer than the heartbeat interval has its lease extended at every interval from
/// the claim on (the heartbeat task starts only once the first extension is due, so a claim
/// that ends sooner needs none), and the job ends as a success, its lease never lost.
#[tokio::test(start_paused = true)]
async fn a_long_call_has_its_lease_extended_at_every_heartbeat_interval() {
    let e = env().await;
    let id = e.enqueue(NewJob::new("q", "k", json!({}))).await;
    #[derive(Debug)]
    struct Slow;
    impl Handler for Slow {
        fn run(&self, _: JobContext) -> BoxFuture<'static, Attempted> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                ok()
            })
        }
    }
    // A 3 s lease is extended every second, each time to 3 s after the extension.
    let w = e
        .worker("k", Arc::new(Slow))
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let start = e.clock.now();
    let run = tokio::spawn(async move { w.run_until_idle().await });
    let ms = chrono::Duration::milliseconds;
    let mut seen = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        seen.push(e.get(id).await.lease_expires_at.unwrap() - start);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // At 0.5 s the claim's own lease; at 1.5 s and 2.5 s the first and second extensions
    // (stored to the millisecond, so a hair under).
    for (got, want) in seen.iter().zip([3000, 4000, 5000]) {
        assert!(
            *got > ms(want - 10) && *got < ms(want + 400),
            "lease ends {got:?} after the claim, expected about {want} ms: {seen:?}"
        );
    }
    let s = run.await.unwrap().unwrap();
    assert_eq!((s.succeeded, s.lease_lost), (1, 0), "{s:?}");
}
