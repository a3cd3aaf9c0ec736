//! Listening sockets for the services.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// Connections the kernel may queue per listener before the service accepts
/// them (capped by `net.core.somaxconn`). Tokio's default of 1,024 overflowed
/// when a thousand clients connected at once; the kernel then dropped
/// handshakes, and clients saw their first request fail on a closed
/// connection.
pub const BACKLOG: u32 = 4096;

/// Binds `addr` with a deep accept queue.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}
