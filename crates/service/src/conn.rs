//! The listening loop: HTTP/1.1 and HTTP/2 (prior knowledge) through hyper, with the
//! connection limits `axum::serve` does not have.
//!
//! - **Cap**: at most [`ConnLimits::max_connections`] connections are served at once. Beyond
//!   the cap the loop stops accepting, so new connections wait in the kernel's backlog (and
//!   use no descriptor of the process) until a served one closes.
//! - **Header timeout**: a request's header must arrive within
//!   [`ConnLimits::header_timeout`], counted from the accept for the first request and from
//!   its first byte for later ones; a client that sends half a header is disconnected.
//! - **Idle timeout**: a keep-alive connection that moves no byte for
//!   [`ConnLimits::idle_timeout`] between requests (or while a response is stuck on a client
//!   that does not read it) is closed.
//!
//! A request being handled is never cut by these timeouts. Each request carries the peer's
//! address as [`axum::extract::ConnectInfo`]. On shutdown the loop stops accepting, asks
//! every connection to finish (idle ones close at once) and waits for them.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::guard::MAX_HEADER_COUNT;

/// Default of [`ConnLimits::header_timeout`] (`--header-timeout`): 10 s.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ConnLimits::idle_timeout`] (`--idle-timeout`): 60 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default of [`ConnLimits::max_connections`] (`--max-connections`): 1024.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Limits on the connections of `redrive serve`.
///
/// # Default
/// [`DEFAULT_HEADER_TIMEOUT`], [`DEFAULT_IDLE_TIMEOUT`], [`DEFAULT_MAX_CONNECTIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// How long a request's header may take to arrive (from the accept for the first request
    /// of a connection, from the first byte for later ones).
    pub header_timeout: Duration,
    /// How long a connection may move no byte between requests.
    pub idle_timeout: Duration,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// "Not set" for the millisecond marks of [`Activity`].
const UNSET: u64 = u64::MAX;

/// What one connection is doing, shared by its IO, its requests and its watchdog.
struct Activity {
    accepted: Instant,
    /// Last byte read or written (ms since the accept).
    last_io: AtomicU64,
    /// First byte of a request head read while no request was in flight (ms), or [`UNSET`].
    head_started: AtomicU64,
    in_flight: AtomicUsize,
    served: AtomicU64,
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            accepted: Instant::now(),
            last_io: AtomicU64::new(0),
            head_started: AtomicU64::new(UNSET),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.accepted.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.accepted + Duration::from_millis(ms)
    }

    fn read(&self) {
        let now = self.now_ms();
        self.last_io.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Acquire) == 0
            && self
                .head_started
                .compare_exchange(UNSET, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            // The header deadline may be earlier than the idle one being waited for.
            self.changed.notify_one();
        }
    }

    fn wrote(&self) {
        self.last_io.store(self.now_ms(), Ordering::Relaxed);
    }

    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.fetch_add(1, Ordering::Relaxed);
        self.head_started.store(UNSET, Ordering::Release);
        self.changed.notify_one();
    }

    fn end(&self) {
        self.wrote();
        self.head_started.store(UNSET, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.changed.notify_one();
    }

    /// When the connection is to be closed if nothing changes; `None` while handling.
    fn deadline(&self, limits: &ConnLimits) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let head = self.head_started.load(Ordering::Acquire);
        Some(if head != UNSET {
            self.at(head) + limits.header_timeout
        } else if self.served.load(Ordering::Relaxed) == 0 {
            self.accepted + limits.header_timeout
        } else {
            self.at(self.last_io.load(Ordering::Relaxed)) + limits.idle_timeout
        })
    }
}

/// Ends a request's in-flight mark even when hyper drops its future.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A stream that reports its reads and writes to [`Activity`].
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.wrote();
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.wrote();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Accept errors that concern one connection only (the next accept may well succeed).
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// Serves `app` on `listener` under `limits`, taking a slot of `slots` per connection, until
/// `shutdown` completes; then lets the open connections finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    slots: Arc<Semaphore>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = watch::channel(());
    'accept: loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break 'accept,
            },
            () = &mut shutdown => break 'accept,
        };
        let (stream, peer) = loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => break c,
                    Err(e) if per_connection(&e) => continue,
                    Err(e) => {
                        // Out of descriptors, typically: wait a little rather than spin.
                        tracing::warn!(error = %e, "accepting a connection failed; retrying");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                () = &mut shutdown => break 'accept,
            }
        };
        tokio::spawn(connection(
            stream,
            peer,
            app.clone(),
            limits,
            permit,
            stop_rx.clone(),
            done_rx.clone(),
        ));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(done_rx);
    done_tx.closed().await;
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: ConnLimits,
    permit: OwnedSemaphorePermit,
    mut stop: watch::Receiver<bool>,
    done: watch::Receiver<()>,
) {
    metrics::gauge!("redrive_http_connections").increment(1.0);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let act = activity.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        act.begin();
        let in_flight = InFlight(act.clone());
        let app = app.clone();
        async move {
            let res = app.oneshot(req.map(Body::new)).await;
            drop(in_flight);
            res.map_err(|e: Infallible| match e {})
        }
    });
    let mut builder = Builder::new(TokioExecutor::new());
    // Our own limit on the count is 100 (a problem+json 431); hyper's is set well beyond so
    // that ours answers first.
    builder.http1().max_headers(MAX_HEADER_COUNT * 4);
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        let deadline = activity.deadline(&limits);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                break;
            }
            changed = stop.changed(), if !stopping => {
                if changed.is_err() || *stop.borrow() {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            () = activity.changed.notified() => {}
            () = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => {
                if activity.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!(%peer, "closing a connection: header or idle timeout");
                    break;
                }
            }
        }
    }
    metrics::gauge!("redrive_http_connections").decrement(1.0);
    drop(permit);
    drop(done);
}
