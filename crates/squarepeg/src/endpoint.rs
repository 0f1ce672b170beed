//! Listening for and opening connections over kernel TCP, or over the userspace TCP of a
//! `squarepeg-io` [`Stack`](squarepeg_io::Stack).

use std::io;
use std::net::SocketAddr;

use bytes::Bytes;
use squarepeg_connection::{NewConnectionError, Role};
use squarepeg_session::{
    ConfigError, ConnectionError, MessageNumber, MessageProps, TransportError,
};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};

use crate::config::ConnectionConfig;
use crate::connection::Connection;
use crate::kernel;

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// Opening the connection failed: refused, unreachable, timed out, reset, or the TLS
    /// handshake failed (`TransportError::Tls`: a refused certificate, an alert).
    #[error("connecting: {0}")]
    Transport(TransportError),
    /// The connection ended during its set-up for another reason (the peer closed it, or
    /// broke the protocol).
    #[error("connecting: {0}")]
    Closed(ConnectionError),
    /// The TLS configuration cannot be used (no TLS 1.3, secret extraction off, a server
    /// name that is not one).
    #[error(transparent)]
    Tls(squarepeg_tls::TlsError),
    /// A local I/O error (binding, accepting, socket options, the stack).
    #[error("local I/O: {0}")]
    Io(#[from] io::Error),
    /// The configuration is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A message given to [`Connection::connect_with_messages`] could not be queued (too
    /// large, more than the send queue holds, an unknown dependency).
    #[error("first messages: {0}")]
    Message(squarepeg_session::SendError),
}

/// A failed connect: a transport outcome the application can act on, or a local error.
pub(crate) fn connect_error(e: io::Error) -> ConnectError {
    match TransportError::from_io(&e) {
        TransportError::Io(_) => ConnectError::Io(e),
        t => ConnectError::Transport(t),
    }
}

impl From<NewConnectionError> for ConnectError {
    fn from(e: NewConnectionError) -> Self {
        match e {
            NewConnectionError::Config(c) => ConnectError::Config(c),
            NewConnectionError::Tls(t) => ConnectError::Tls(t),
            other => ConnectError::Io(io::Error::new(io::ErrorKind::InvalidInput, other)),
        }
    }
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
    #[cfg(feature = "utcp")]
    Utcp {
        listener: squarepeg_io::TcpListener,
        /// The TCP receive buffer, which sizes the core's reassembler.
        window: usize,
    },
}

impl Endpoint {
    /// Listens on `addr` (IPv4 or IPv6).
    pub async fn bind(
        addr: impl ToSocketAddrs,
        config: ConnectionConfig,
    ) -> Result<Self, ConnectError> {
        config.check(Role::Server)?;
        let listener = TcpListener::bind(addr).await?;
        if config.fast_open {
            crate::fast_open::listen(&listener, crate::config::FAST_OPEN_QUEUE)?;
        }
        let listener = Listener::Kernel(listener);
        Ok(Self { listener, config })
    }

    /// Listens on `addr` over the userspace TCP of `stack` (an unspecified address listens on
    /// its port at every address of the stack). Connections use the stack's default TCP
    /// configuration ([`squarepeg_io::StackConfig::connection`]) with the uTCP options on
    /// and [`ConnectionConfig::dead_peer_timeout`] as its user timeout and keepalive; see
    /// the crate docs, "Over the userspace TCP".
    #[cfg(feature = "utcp")]
    pub fn listen_utcp(
        stack: &squarepeg_io::Stack,
        addr: SocketAddr,
        config: ConnectionConfig,
    ) -> Result<Self, ConnectError> {
        config.check(Role::Server)?;
        let (listener, window) = crate::utcp::listen(stack, addr, &config)?;
        Ok(Self {
            listener: Listener::Utcp { listener, window },
            config,
        })
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.listener {
            Listener::Kernel(l) => l.local_addr(),
            #[cfg(feature = "utcp")]
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
                kernel::start(socket, Role::Server, self.config.clone())
            }
            #[cfg(feature = "utcp")]
            Listener::Utcp { listener, window } => {
                let (stream, _) = listener.accept().await?;
                crate::utcp::start(stream, Role::Server, self.config.clone(), *window)
            }
        }
    }
}

/// Over TLS: waits for the end of the handshake, whose outcome is the connect's.
async fn established(conn: &Connection) -> Result<(), ConnectError> {
    conn.established().await.map_err(|e| match e {
        ConnectionError::Transport(t) => ConnectError::Transport(t),
        other => ConnectError::Closed(other),
    })
}

impl Connection {
    /// Opens a connection to `addr` (IPv4 or IPv6).
    pub async fn connect(
        addr: impl ToSocketAddrs,
        config: ConnectionConfig,
    ) -> Result<Connection, ConnectError> {
        let (conn, _) = Self::connect_with_messages(addr, config, Vec::new()).await?;
        established(&conn).await?;
        Ok(conn)
    }

    /// Opens a connection to `addr` with `first` queued before anything is sent, and returns
    /// at once, with their message numbers, without waiting for the handshake (a failed
    /// connect or handshake ends the connection: see [`Connection::closed`]).
    ///
    /// This is the start of a transaction (NGTCP): over TLS, to a server this configuration
    /// holds a ticket from (its client configuration from
    /// [`crate::tls::config::client_offering_early_data`], reused), the messages marked
    /// [`MessageProps::safely_replayable`] go as TLS 1.3 early data right behind the
    /// ClientHello; with [`ConnectionConfig::fast_open`], in the SYN itself once the kernel
    /// holds the server's cookie. The rest wait for the handshake. So a returning client's
    /// request reaches the server in the first packet and the answer comes back after one
    /// round trip (see [`crate::transaction`]).
    pub async fn connect_with_messages(
        addr: impl ToSocketAddrs,
        config: ConnectionConfig,
        first: Vec<(Bytes, MessageProps)>,
    ) -> Result<(Connection, Vec<MessageNumber>), ConnectError> {
        config.check(Role::Client)?;
        let (socket, remote) = if config.fast_open {
            let remote = tokio::net::lookup_host(addr).await?.next().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the address resolves to nothing",
                )
            })?;
            (
                crate::fast_open::connect(remote).map_err(connect_error)?,
                remote,
            )
        } else {
            let socket = TcpStream::connect(addr).await.map_err(connect_error)?;
            let remote = socket.peer_addr()?;
            (socket, remote)
        };
        kernel::start_with(socket, remote, Role::Client, config, first)
    }

    /// [`Connection::connect_with_messages`] over the userspace TCP of `stack`: with
    /// [`ConnectionConfig::fast_open`], the ClientHello and the early data ride on the
    /// stack's Fast Open SYN once it holds a cookie from the server. Returns once the TCP
    /// connection is established, without waiting for the TLS handshake.
    #[cfg(feature = "utcp")]
    pub async fn connect_utcp_with_messages(
        stack: &squarepeg_io::Stack,
        addr: SocketAddr,
        config: ConnectionConfig,
        first: Vec<(Bytes, MessageProps)>,
    ) -> Result<(Connection, Vec<MessageNumber>), ConnectError> {
        config.check(Role::Client)?;
        if config.fast_open {
            crate::utcp::connect_fast_open(stack, addr, config, first).await
        } else {
            crate::utcp::connect_with_messages(stack, addr, config, first).await
        }
    }

    /// Opens a connection to `addr` over the userspace TCP of `stack` (with the stack's
    /// default TCP configuration and the uTCP options on; see the crate docs, "Over the
    /// userspace TCP"). The peer may be any squarepeg endpoint, over kernel or userspace TCP.
    /// Over TLS it returns once the handshake is done, as [`Connection::connect`] does.
    #[cfg(feature = "utcp")]
    pub async fn connect_utcp(
        stack: &squarepeg_io::Stack,
        addr: SocketAddr,
        config: ConnectionConfig,
    ) -> Result<Connection, ConnectError> {
        let (conn, _) = Self::connect_utcp_with_messages(stack, addr, config, Vec::new()).await?;
        established(&conn).await?;
        Ok(conn)
    }
}
