//! Calls to one service over as many HTTP/2 connections as they need. One
//! connection carries at most the peer's `max_streams_per_connection`
//! calls at once, and a call beyond it waits, with nothing said, for a
//! stream to free: a gateway with a thousand orchestrations open would
//! stall its next one. The pool sends a call over the first connection
//! carrying fewer than [`OPEN_AT`] calls, opening the next (up to
//! [`MAX_CONNECTIONS`]) once every open one does, and says so in the logs
//! when calls start to wait anyway.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::transport::Channel;
use tower::{Service, ServiceExt as _};

/// Calls one connection carries before the next is opened.
pub const OPEN_AT: usize = 100;

/// Connections one pool opens at most.
pub const MAX_CONNECTIONS: usize = 16;

/// Calls per connection at which a peer with the default settings makes
/// further calls wait (`max_streams_per_connection`).
const PEER_STREAMS: usize = 1_000;

/// Lazily connected channels to one service and the calls each carries.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    name: String,
    /// Calls a connection carries before the next is opened.
    open_at: usize,
    channels: Vec<Channel>,
    open_calls: Vec<AtomicUsize>,
    /// When calls were last reported to wait (ms since the epoch).
    warned_at_ms: AtomicI64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("service", &self.shared.name).field("open_calls", &self.open_calls()).finish()
    }
}

impl Pool {
    /// A pool to the service `name` whose connections `connect()` makes
    /// (each connected on first use).
    pub fn new(name: &str, connect: impl Fn() -> Channel) -> Self {
        Self::with_limits(name, OPEN_AT, MAX_CONNECTIONS, connect)
    }

    /// A pool opening the next connection once each carries `open_at`
    /// calls, up to `connections` (at least one).
    pub fn with_limits(name: &str, open_at: usize, connections: usize, connect: impl Fn() -> Channel) -> Self {
        let connections = connections.max(1);
        Self::of(name, open_at.max(1), (0..connections).map(|_| connect()).collect())
    }

    /// A pool of one connection made already (a command-line client's).
    pub fn single(name: &str, channel: Channel) -> Self {
        Self::of(name, usize::MAX, vec![channel])
    }

    fn of(name: &str, open_at: usize, channels: Vec<Channel>) -> Self {
        let open_calls = channels.iter().map(|_| AtomicUsize::new(0)).collect();
        let shared = Shared { name: name.to_owned(), open_at, channels, open_calls, warned_at_ms: AtomicI64::new(0) };
        Self { shared: Arc::new(shared) }
    }

    /// Calls open over each connection.
    pub fn open_calls(&self) -> Vec<usize> {
        self.shared.open_calls.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// The connection the next call goes over, its count taken.
    fn pick(&self) -> OpenCall {
        let shared = &self.shared;
        let loads: Vec<usize> = shared.open_calls.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let index = loads.iter().position(|&n| n < shared.open_at).unwrap_or_else(|| {
            let (least, load) = loads.iter().enumerate().min_by_key(|(_, n)| **n).unwrap_or((0, &0));
            if *load >= PEER_STREAMS {
                self.report_waiting(loads.iter().sum());
            }
            least
        });
        shared.open_calls[index].fetch_add(1, Ordering::Relaxed);
        OpenCall { shared: self.shared.clone(), index }
    }

    fn report_waiting(&self, open: usize) {
        let now = chrono::Utc::now().timestamp_millis();
        let last = self.shared.warned_at_ms.load(Ordering::Relaxed);
        if now - last >= 30_000
            && self.shared.warned_at_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::warn!(
                service = %self.shared.name,
                open_calls = open,
                connections = self.shared.channels.len(),
                "{open} calls to {} are open over {} connections: further calls may wait for a stream; \
                 raise the peer's max_streams_per_connection or run more replicas",
                self.shared.name,
                self.shared.channels.len()
            );
        }
    }
}

/// One call's place on its connection, given back when its response body
/// ends or is dropped (a stream counts for as long as it is open).
struct OpenCall {
    shared: Arc<Shared>,
    index: usize,
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        self.shared.open_calls[self.index].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Service<http::Request<tonic::body::Body>> for Pool {
    type Response = http::Response<PooledBody>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call waits for its own connection's readiness.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let open = self.pick();
        let channel = self.shared.channels[open.index].clone();
        Box::pin(async move {
            let response = channel.oneshot(request).await?;
            Ok(response.map(|inner| PooledBody { inner, _open: open }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that frees its call's place when done.
    pub struct PooledBody {
        #[pin]
        inner: tonic::body::Body,
        _open: OpenCall,
    }
}

impl Body for PooledBody {
    type Data = <tonic::body::Body as Body>::Data;
    type Error = <tonic::body::Body as Body>::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_fill_one_connection_before_the_next_is_opened() {
        let endpoint = tonic::transport::Endpoint::from_static("http://127.0.0.1:9");
        let pool = Pool::new("executor", || endpoint.connect_lazy());
        let open: Vec<OpenCall> = (0..2 * OPEN_AT + 50).map(|_| pool.pick()).collect();
        let loads = pool.open_calls();
        assert_eq!(&loads[..4], [OPEN_AT, OPEN_AT, 50, 0]);
        assert_eq!(loads.iter().sum::<usize>(), 2 * OPEN_AT + 50);
        drop(open);
        assert!(pool.open_calls().iter().all(|&n| n == 0), "every call gives its place back");
        // Beyond OPEN_AT on every connection, calls go to the least loaded.
        let full: Vec<OpenCall> = (0..MAX_CONNECTIONS * OPEN_AT + 3).map(|_| pool.pick()).collect();
        let loads = pool.open_calls();
        assert_eq!((loads.iter().max(), loads.iter().min()), (Some(&(OPEN_AT + 1)), Some(&OPEN_AT)));
        drop(full);
    }
}
