//! Listening for and opening connections over kernel TCP, or over the userspace TCP of a
//! `squarepeg-io` [`Stack`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use squarepeg_session::{ConfigError, Role, Session};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};

use crate::config::ConnectionConfig;
use crate::connection::{Connection, Handle, Shared};
use crate::driver;
use crate::utcp::{Glue, UtcpConnection};
use crate::utcp_driver;
use squarepeg_io::Stack;

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("TCP: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A listening socket that accepts squarepeg connections: a kernel TCP socket
/// ([`Endpoint::bind`]) or a listener of squarepeg's userspace TCP
/// ([`Endpoint::listen_utcp`]). The connections it accepts are the same [`Connection`] type
/// either way.
#[derive(Debug)]
pub struct Endpoint {
    listener: Listener,
    config: ConnectionConfig,
}

#[derive(Debug)]
enum Listener {
    Kernel(TcpListener),
    Utcp {
        listener: squarepeg_io::TcpListener,
        /// The TCP receive buffer, which sizes the glue's reassembler.
        recv_buffer: usize,
    },
}

/// The TCP configuration of a squarepeg connection over `stack`: the stack's defaults with
/// the uTCP options (unordered receive, consistent segmentation, the uCOBS padder) and
/// message writes (the driver writes tagged message records).
fn utcp_tcp_config(stack: &Stack) -> squarepeg_tcp::ConnectionConfig {
    squarepeg_tcp::ConnectionConfig {
        message_writes: true,
        ..UtcpConnection::tcp_config(stack.connection_config())
    }
}

impl Endpoint {
    /// Listens on `addr` (IPv4 or IPv6).
    pub async fn bind(
        addr: impl ToSocketAddrs,
        config: ConnectionConfig,
    ) -> Result<Self, ConnectError> {
        config.session.validate()?;
        let listener = Listener::Kernel(TcpListener::bind(addr).await?);
        Ok(Self { listener, config })
    }

    /// Listens on `addr` over the userspace TCP of `stack` (an unspecified address listens on
    /// every stack address of its family). Connections use the stack's default TCP
    /// configuration ([`squarepeg_io::StackConfig::connection`]) with the uTCP options on;
    /// see the crate docs, "Over the userspace TCP".
    pub fn listen_utcp(
        stack: &Stack,
        addr: SocketAddr,
        config: ConnectionConfig,
    ) -> Result<Self, ConnectError> {
        config.session.validate()?;
        let tcp = utcp_tcp_config(stack);
        let recv_buffer = tcp.recv_buffer;
        let listener = stack.listen_with(&[addr], tcp)?;
        Ok(Self {
            listener: Listener::Utcp {
                listener,
                recv_buffer,
            },
            config,
        })
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.listener {
            Listener::Kernel(l) => l.local_addr(),
            Listener::Utcp { listener, .. } => {
                listener.local_addrs().first().copied().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotConnected, "listening on no address")
                })
            }
        }
    }

    /// Accepts the next connection.
    pub async fn accept(&self) -> Result<Connection, ConnectError> {
        match &self.listener {
            Listener::Kernel(l) => {
                let (socket, _) = l.accept().await?;
                start(socket, Role::Server, self.config.clone())
            }
            Listener::Utcp {
                listener,
                recv_buffer,
            } => {
                let (stream, _) = listener.accept().await?;
                start_utcp(stream, Role::Server, self.config.clone(), *recv_buffer)
            }
        }
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

    /// Opens a connection to `addr` over the userspace TCP of `stack` (with the stack's
    /// default TCP configuration and the uTCP options on; see the crate docs, "Over the
    /// userspace TCP"). The peer may be any squarepeg endpoint, over kernel or userspace TCP.
    pub async fn connect_utcp(
        stack: &Stack,
        addr: SocketAddr,
        config: ConnectionConfig,
    ) -> Result<Connection, ConnectError> {
        config.session.validate()?;
        let tcp = utcp_tcp_config(stack);
        let recv_buffer = tcp.recv_buffer;
        let stream = stack.connect_with(addr, tcp).await?;
        start_utcp(stream, Role::Client, config, recv_buffer)
    }
}

/// Builds the session and the uTCP glue and spawns the uTCP driver.
fn start_utcp(
    stream: squarepeg_io::TcpStream,
    role: Role,
    config: ConnectionConfig,
    recv_buffer: usize,
) -> Result<Connection, ConnectError> {
    let glue = Glue::new(recv_buffer)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let session = Session::new(role, config.session.clone())?;
    let shared = Arc::new(Shared::new(
        session,
        config.status_queue,
        stream.local_addr(),
        stream.peer_addr(),
    ));
    shared.lock().utcp = Some(Box::new(glue));
    tokio::spawn(utcp_driver::run(shared.clone(), stream, config));
    Ok(Connection {
        handle: Arc::new(Handle(shared)),
    })
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
pub(crate) fn set_notsent_lowat(socket: &TcpStream, lowat: u32) -> io::Result<()> {
    socket2::SockRef::from(socket).set_tcp_notsent_lowat(lowat)
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
pub(crate) fn set_notsent_lowat(_socket: &TcpStream, _lowat: u32) -> io::Result<()> {
    // Not available: the kernel queue is bounded by the send buffer only.
    Ok(())
}
