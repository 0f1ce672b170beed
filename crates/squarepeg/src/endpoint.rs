//! Listening for and opening connections over kernel TCP.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use squarepeg_session::{ConfigError, Role, Session};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};

use crate::config::ConnectionConfig;
use crate::connection::{Connection, Handle, Shared};
use crate::driver;

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("TCP: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A listening socket that accepts squarepeg connections.
#[derive(Debug)]
pub struct Endpoint {
    listener: TcpListener,
    config: ConnectionConfig,
}

impl Endpoint {
    /// Listens on `addr` (IPv4 or IPv6).
    pub async fn bind(
        addr: impl ToSocketAddrs,
        config: ConnectionConfig,
    ) -> Result<Self, ConnectError> {
        config.session.validate()?;
        let listener = TcpListener::bind(addr).await?;
        Ok(Self { listener, config })
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts the next connection.
    pub async fn accept(&self) -> Result<Connection, ConnectError> {
        let (socket, _) = self.listener.accept().await?;
        start(socket, Role::Server, self.config.clone())
    }
}

impl Connection {
    /// Opens a connection to `addr` (IPv4 or IPv6).
    pub async fn connect(
        addr: impl ToSocketAddrs,
        config: ConnectionConfig,
    ) -> Result<Connection, ConnectError> {
        config.session.validate()?;
        let socket = TcpStream::connect(addr).await?;
        start(socket, Role::Client, config)
    }
}

/// Sets the socket options, builds the session and spawns the driver.
fn start(
    socket: TcpStream,
    role: Role,
    config: ConnectionConfig,
) -> Result<Connection, ConnectError> {
    // Messages must not wait for Nagle (Hollywood §4.2).
    socket.set_nodelay(true)?;
    if let Some(lowat) = config.notsent_lowat {
        set_notsent_lowat(&socket, lowat)?;
    }
    let local = socket.local_addr()?;
    let remote = socket.peer_addr()?;
    let session = Session::new(role, config.session.clone())?;
    let shared = Arc::new(Shared::new(session, config.status_queue, local, remote));
    tokio::spawn(driver::run(shared.clone(), socket, config));
    Ok(Connection {
        handle: Arc::new(Handle(shared)),
    })
}

#[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
fn set_notsent_lowat(socket: &TcpStream, lowat: u32) -> io::Result<()> {
    socket2::SockRef::from(socket).set_tcp_notsent_lowat(lowat)
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
fn set_notsent_lowat(_socket: &TcpStream, _lowat: u32) -> io::Result<()> {
    // Not available: the kernel queue is bounded by the send buffer only.
    Ok(())
}
