//! A TCP proxy that can cut every connection, to make a real dependency
//! (such as PostgreSQL) unreachable in the middle of a test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections from a loopback port to a target address.
pub struct TcpProxy {
    /// Address clients connect to.
    pub addr: SocketAddr,
    open: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
}

impl TcpProxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let open = Arc::new(AtomicBool::new(true));
        let (cut, _) = watch::channel(0u64);
        let (accept_open, accept_cut) = (open.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accept_open.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let mut cut_rx = accept_cut.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.changed() => {}
                    }
                });
            }
        });
        Ok(Self { addr, open, cut })
    }

    /// Closes every open connection and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Accepts new connections again.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}
