//! An in-memory store for tests and simulations (one process; nothing survives it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use super::{
    Acquired, ClaimOutcome, ClaimRequest, IdempotencyClock, IdempotencyStore, ListFilter,
    ListRequest, ListedRecord, LockToken, RECOVERY_POINT_FINISHED, RECOVERY_POINT_STARTED,
    ReapReport, RecordId, RecordInfo, RecordState, Recovery, StoreFuture, StoredResponse,
    SystemIdempotencyClock,
};

#[derive(Debug, Clone)]
struct Record {
    id: i64,
    method: String,
    path: String,
    fingerprint: [u8; 32],
    recovery_point: String,
    token: Option<LockToken>,
    locked_until: Option<SystemTime>,
    attempts: u32,
    response: Option<StoredResponse>,
    expires_at: SystemTime,
    created_at: SystemTime,
    last_run_at: SystemTime,
}

impl Record {
    fn info(&self, now: SystemTime) -> RecordInfo {
        RecordInfo {
            id: RecordId(self.id),
            state: if self.response.is_some() {
                RecordState::Completed
            } else {
                RecordState::InProgress
            },
            method: self.method.clone(),
            path: self.path.clone(),
            recovery_point: self.recovery_point.clone(),
            attempts: self.attempts,
            locked: self.locked_until.is_some_and(|u| u > now),
            held: self.token.is_some(),
            response_status: self.response.as_ref().map(|s| s.status),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    next_id: i64,
    records: HashMap<(String, String), Record>,
}

/// Records in a `HashMap` behind a mutex; time from an injected [`IdempotencyClock`].
#[derive(Debug, Clone)]
pub struct MemoryIdempotencyStore {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn IdempotencyClock>,
}

impl Default for MemoryIdempotencyStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryIdempotencyStore {
    /// An empty store on the system clock.
    #[must_use]
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemIdempotencyClock))
    }

    /// An empty store on `clock`.
    #[must_use]
    pub fn with_clock(clock: Arc<dyn IdempotencyClock>) -> Self {
        Self {
            inner: Arc::default(),
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> SystemTime {
        self.clock.now()
    }

    fn claim_now(&self, req: &ClaimRequest) -> ClaimOutcome {
        let now = self.now();
        let mut inner = self.lock();
        let k = (req.scope.clone(), req.key.clone());
        if let Some(rec) = inner.records.get(&k)
            && rec.response.is_some()
            && rec.expires_at <= now
        {
            inner.records.remove(&k);
        }
        if !inner.records.contains_key(&k) {
            inner.next_id += 1;
            let id = inner.next_id;
            inner.records.insert(
                k,
                Record {
                    id,
                    method: req.method.clone(),
                    path: req.path.clone(),
                    fingerprint: req.fingerprint,
                    recovery_point: RECOVERY_POINT_STARTED.to_owned(),
                    token: Some(req.token),
                    locked_until: Some(now + req.lease),
                    attempts: 1,
                    response: None,
                    expires_at: now + req.retention,
                    created_at: now,
                    last_run_at: now,
                },
            );
            return ClaimOutcome::Acquired(Acquired {
                id: RecordId(id),
                recovery_point: RECOVERY_POINT_STARTED.to_owned(),
                attempts: 1,
                resumed: false,
            });
        }
        let Some(rec) = inner.records.get_mut(&k) else {
            return ClaimOutcome::InProgress;
        };
        if rec.fingerprint != req.fingerprint {
            return ClaimOutcome::Mismatch;
        }
        if let Some(response) = &rec.response {
            return ClaimOutcome::Completed(response.clone());
        }
        if rec.locked_until.is_some_and(|until| until > now) {
            return ClaimOutcome::InProgress;
        }
        if rec.token.is_some() && !req.take_over_abandoned {
            return ClaimOutcome::Abandoned;
        }
        rec.token = Some(req.token);
        rec.locked_until = Some(now + req.lease);
        rec.last_run_at = now;
        rec.attempts += 1;
        ClaimOutcome::Acquired(Acquired {
            id: RecordId(rec.id),
            recovery_point: rec.recovery_point.clone(),
            attempts: rec.attempts,
            resumed: true,
        })
    }

    fn with_held<T>(
        &self,
        id: RecordId,
        token: LockToken,
        f: impl FnOnce(&mut Record, SystemTime) -> T,
    ) -> Option<T> {
        let now = self.now();
        let mut inner = self.lock();
        inner
            .records
            .values_mut()
            .find(|r| r.id == id.0 && r.token == Some(token) && r.response.is_none())
            .map(|r| f(r, now))
    }
}

fn ready<'a, T: Send + 'a>(value: T) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl IdempotencyStore for MemoryIdempotencyStore {
    fn ensure_schema(&self) -> StoreFuture<'_, ()> {
        ready(())
    }

    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        ready(self.claim_now(request))
    }

    fn heartbeat(&self, id: RecordId, token: LockToken, lease: Duration) -> StoreFuture<'_, bool> {
        ready(
            self.with_held(id, token, |r, now| r.locked_until = Some(now + lease))
                .is_some(),
        )
    }

    fn advance<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        recovery_point: &'a str,
    ) -> StoreFuture<'a, bool> {
        ready(
            self.with_held(id, token, |r, _| {
                recovery_point.clone_into(&mut r.recovery_point)
            })
            .is_some(),
        )
    }

    fn finalise<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        response: &'a StoredResponse,
    ) -> StoreFuture<'a, bool> {
        ready(
            self.with_held(id, token, |r, _| {
                r.response = Some(response.clone());
                RECOVERY_POINT_FINISHED.clone_into(&mut r.recovery_point);
                r.token = None;
                r.locked_until = None;
            })
            .is_some(),
        )
    }

    fn release(&self, id: RecordId, token: LockToken) -> StoreFuture<'_, bool> {
        ready(
            self.with_held(id, token, |r, _| {
                r.token = None;
                r.locked_until = None;
            })
            .is_some(),
        )
    }

    fn forget(&self, id: RecordId, token: LockToken) -> StoreFuture<'_, bool> {
        let mut inner = self.lock();
        let before = inner.records.len();
        inner
            .records
            .retain(|_, r| !(r.id == id.0 && r.token == Some(token) && r.response.is_none()));
        let forgot = inner.records.len() < before;
        ready(forgot)
    }

    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> StoreFuture<'a, Option<RecordInfo>> {
        let now = self.now();
        let inner = self.lock();
        let info = inner
            .records
            .get(&(scope.to_owned(), key.to_owned()))
            .map(|r| r.info(now));
        ready(info)
    }

    fn recover<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        action: &'a Recovery,
    ) -> StoreFuture<'a, bool> {
        let now = self.now();
        let mut inner = self.lock();
        let k = (scope.to_owned(), key.to_owned());
        let eligible = inner
            .records
            .get(&k)
            .is_some_and(|r| r.response.is_none() && r.locked_until.is_none_or(|u| u <= now));
        if !eligible {
            return ready(false);
        }
        match action {
            Recovery::Delete => {
                inner.records.remove(&k);
            }
            Recovery::Release => {
                if let Some(r) = inner.records.get_mut(&k) {
                    r.token = None;
                    r.locked_until = None;
                }
            }
            Recovery::Complete(response) => {
                if let Some(r) = inner.records.get_mut(&k) {
                    r.response = Some(response.clone());
                    RECOVERY_POINT_FINISHED.clone_into(&mut r.recovery_point);
                    r.token = None;
                    r.locked_until = None;
                }
            }
        }
        ready(true)
    }

    fn reap(&self, batch: u32) -> StoreFuture<'_, ReapReport> {
        let now = self.now();
        let mut inner = self.lock();
        let mut report = ReapReport::default();
        let mut doomed = Vec::new();
        for (k, r) in &inner.records {
            let expired = r.expires_at <= now;
            if r.response.is_some() {
                if expired && doomed.len() < batch as usize {
                    doomed.push(k.clone());
                }
            } else {
                report.expired_in_progress += u64::from(expired);
                report.abandoned +=
                    u64::from(r.token.is_some() && r.locked_until.is_none_or(|u| u <= now));
            }
        }
        for k in doomed {
            inner.records.remove(&k);
            report.deleted += 1;
        }
        ready(report)
    }

    fn list<'a>(&'a self, request: &'a ListRequest) -> StoreFuture<'a, Vec<ListedRecord>> {
        let now = self.now();
        let inner = self.lock();
        let after = request.after.map_or(0, |a| a.0);
        let mut out: Vec<ListedRecord> = inner
            .records
            .iter()
            .filter(|((scope, _), r)| {
                r.id > after && request.scope.as_ref().is_none_or(|s| s == scope)
            })
            .map(|((scope, key), r)| ListedRecord {
                scope: scope.clone(),
                key: key.clone(),
                info: r.info(now),
                created_at: r.created_at,
                last_run_at: r.last_run_at,
            })
            .filter(|l| match request.filter {
                ListFilter::All => true,
                ListFilter::InProgress => l.info.state == RecordState::InProgress,
                ListFilter::Completed => l.info.state == RecordState::Completed,
                ListFilter::Stuck => l.info.is_abandoned(),
            })
            .collect();
        out.sort_by_key(|l| l.info.id);
        out.truncate(request.effective_limit() as usize);
        ready(out)
    }
}
