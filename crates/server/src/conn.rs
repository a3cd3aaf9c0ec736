//! Serving a port's connections, each held to limits: how many may be open
//! at once, how long one may stay silent, how long a request's head may
//! take to arrive, how many streams one HTTP/2 connection may carry. A
//! connection over the count is closed at once (and logged), never left
//! waiting in the accept queue; a silent one is closed; a live HTTP/2
//! connection is pinged, so that a quiet long-lived stream (a catalog
//! watch, an SSE follower) is not mistaken for an idle one. With TLS, each
//! connection's handshake must end within 10 s.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

/// Limits on the connections of one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed as soon as accepted.
    pub max_connections: usize,
    /// A connection on which nothing is read or written for this long is
    /// closed (HTTP/2 connections are pinged at half this interval).
    pub idle_timeout: Duration,
    /// Concurrent streams (calls) on one HTTP/2 connection.
    pub max_streams_per_connection: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self { max_connections: 10_000, idle_timeout: Duration::from_secs(120), max_streams_per_connection: 1_000 }
    }
}

/// Longest wait for the head of an HTTP/1 request once a connection has
/// started sending it (a client dribbling its headers is cut off).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest wait for the answer to an HTTP/2 ping before the connection is
/// taken for dead.
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Longest a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` within `limits` (over TLS when `tls` is
/// given) until `shutdown` resolves, then stops accepting and lets open
/// connections finish their requests.
pub async fn serve(
    name: &str,
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ConnectionLimits,
    tls: Option<crate::tls::ServerTls>,
) -> anyhow::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams_per_connection)
        .keep_alive_interval((limits.idle_timeout / 2).max(Duration::from_secs(1)))
        .keep_alive_timeout(PING_TIMEOUT);
    let builder = Arc::new(builder);
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut refusals = Refusals::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(name, &e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refusals.refused(name, limits.max_connections, peer);
            drop(stream);
            continue;
        };
        // Small answers go out at once instead of waiting on Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        let io = Idle::new(stream, limits.idle_timeout);
        let (app, builder, watcher, tls) = (app.clone(), builder.clone(), graceful.watcher(), tls.clone());
        tokio::spawn(async move {
            match tls {
                None => serve_connection(&builder, io, app, watcher, peer).await,
                Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor().accept(io)).await {
                    Ok(Ok(io)) => {
                        // A client certificate names the caller of every request on the connection.
                        let certificate = io
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|chain| chain.first())
                            .map(|der| crate::auth::PeerCertificate::of(der));
                        let app = match certificate {
                            Some(certificate) => app.layer(axum::Extension(certificate)),
                            None => app,
                        };
                        serve_connection(&builder, io, app, watcher, peer).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                },
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Serves one connection's requests until it ends.
async fn serve_connection<IO>(
    builder: &Builder<TokioExecutor>,
    io: IO,
    app: Router,
    watcher: hyper_util::server::graceful::Watcher,
    peer: std::net::SocketAddr,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    if let Err(e) = watcher.watch(connection).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// After an `accept` error: a client that gave up is nothing; anything else
/// (out of file descriptors) is logged and waited out a little.
async fn accept_failed(name: &str, e: &io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(service = name, error = %e, "cannot accept connections; retrying in 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Connections closed for being over the count, logged at most once a
/// second with how many since the last line.
#[derive(Default)]
struct Refusals {
    since_logged: u64,
    logged_at: Option<Instant>,
}

impl Refusals {
    fn refused(&mut self, name: &str, max: usize, peer: std::net::SocketAddr) {
        self.since_logged += 1;
        if self.logged_at.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        tracing::warn!(
            service = name,
            %peer,
            refused = self.since_logged,
            "{max} connections are open (max_connections): new connections are closed until some end"
        );
        self.since_logged = 0;
        self.logged_at = Some(Instant::now());
    }
}

pin_project_lite::pin_project! {
    /// A connection closed when nothing has been read or written for
    /// `timeout`.
    struct Idle<T> {
        #[pin]
        inner: T,
        timeout: Duration,
        deadline: Pin<Box<Sleep>>,
    }
}

impl<T> Idle<T> {
    fn new(inner: T, timeout: Duration) -> Self {
        Self { inner, timeout, deadline: Box::pin(tokio::time::sleep(timeout)) }
    }
}

fn idle_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the connection was idle for longer than idle_timeout_secs")
}

impl<T: AsyncRead> AsyncRead for Idle<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        match this.inner.poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.deadline.as_mut().reset(Instant::now() + *this.timeout);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.deadline.as_mut().poll(cx).is_ready() => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }
}

impl<T: AsyncWrite> Idle<T> {
    /// A write, which counts as activity when it wrote something.
    fn written(
        self: Pin<&mut Self>,
        write: impl FnOnce(Pin<&mut T>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let result = write(this.inner);
        if let Poll::Ready(Ok(written)) = &result
            && *written > 0
        {
            this.deadline.as_mut().reset(Instant::now() + *this.timeout);
        }
        result
    }
}

impl<T: AsyncWrite> AsyncWrite for Idle<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.written(|inner| inner.poll_write(cx, data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.written(|inner| inner.poll_write_vectored(cx, data))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}
