//! One session over several TCP connections (TCPLS; docs/wire.md §7): a client opens
//! a connection per path ([`Connection::connect_multipath`]) and a server takes them as
//! sessions and joins ([`MultipathEndpoint`]). The application gets the same [`Connection`]
//! as over one TCP connection; each path has a driver task of its own (the same driver as a
//! single connection's, on its path of the core), and a supervisor re-opens the paths that
//! die (joins with the session's tickets).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use squarepeg_connection::{
    MultipathConfig, MultipathConnection, Path, PathEvent, PathId, Role, TlsSetup,
};
use squarepeg_session::ConfigError;
use squarepeg_tls::{
    JoinConfig, JoinProbe, JoinRegistry, JoinStats, JoinTickets, JoinVerdict, SessionId, Tls,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

use crate::config::ConnectionConfig;
use crate::connection::{Connection, Handle, Shared};
use crate::core::Port;
use crate::driver;
use crate::endpoint::{ConnectError, connect_error};
use crate::fast_open::KernelStream;
use crate::kernel::{KernelWire, prepare_socket};

/// Settings of a multipath session beyond a connection's.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MultipathOptions {
    /// The sans-IO core's: acknowledgement delay, `path_timeout` (blackhole detection),
    /// probe interval, unacknowledged-bytes limit, linger. Its `session` and `read_buffer`
    /// are taken from the [`ConnectionConfig`].
    pub core: MultipathConfig,
    /// Client: how often a path without a connection is tried again.
    pub rejoin_interval: Duration,
    /// Client: how long a connection attempt may take.
    pub connect_timeout: Duration,
    /// Server: join tickets per connection, their lifetime, how many are kept.
    pub join: JoinConfig,
    /// How long a new connection's TLS handshake may take: a server's, before the
    /// connection starts or joins a session; a client's first connection and each of its
    /// joins (the core's `handshake_timeout`, which this overrides), after which the
    /// connect fails or the join's path is tried again.
    pub handshake_timeout: Duration,
    /// Server: most connections a session may have at once (a join beyond is closed).
    pub max_paths: usize,
}

impl Default for MultipathOptions {
    fn default() -> Self {
        Self {
            core: MultipathConfig::default(),
            rejoin_interval: Duration::from_millis(200),
            connect_timeout: Duration::from_secs(3),
            join: JoinConfig::default(),
            handshake_timeout: Duration::from_secs(10),
            max_paths: 8,
        }
    }
}

impl MultipathOptions {
    fn core_config(&self, config: &ConnectionConfig) -> MultipathConfig {
        let mut core = self.core.clone();
        core.session = config.session.clone();
        core.read_buffer = config.read_buffer;
        core.handshake_timeout = self.handshake_timeout;
        // A stream spread over paths of different RTTs arrives out of order by their
        // difference, which the receiver must hold: the single-connection default (1 MiB)
        // held an asymmetric pair of paths (10 ms / 40 Mbit/s, 30 ms / 20 Mbit/s) to half
        // their rate (docs/results.md, "Failover and multipath").
        let s = &mut core.session;
        s.stream_receive_window = s.stream_receive_window.max(MULTIPATH_STREAM_WINDOW);
        s.connection_receive_window = s.connection_receive_window.max(2 * MULTIPATH_STREAM_WINDOW);
        core
    }
}

/// The least stream receive window of a multipath session's streams.
pub const MULTIPATH_STREAM_WINDOW: u64 = 8 << 20;

/// The TCP a path runs over: a client's ([`PathAddress`]) or a listener's ([`ListenAddress`]).
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum PathTcp {
    /// The kernel's.
    #[default]
    Kernel,
    /// squarepeg's userspace TCP on this stack, read and written as a plain byte stream.
    #[cfg(feature = "utcp")]
    Userspace(Arc<squarepeg_io::Stack>),
}

impl std::fmt::Debug for PathTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathTcp::Kernel => f.write_str("Kernel"),
            #[cfg(feature = "utcp")]
            PathTcp::Userspace(_) => f.write_str("Userspace"),
        }
    }
}

impl PartialEq for PathTcp {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PathTcp::Kernel, PathTcp::Kernel) => true,
            #[cfg(feature = "utcp")]
            (PathTcp::Userspace(a), PathTcp::Userspace(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "utcp")]
            _ => false,
        }
    }
}

/// One path of a client: where its connections go, from which local address (an
/// interface) if given, over which TCP.
#[derive(Clone, Debug, PartialEq)]
pub struct PathAddress {
    pub local: Option<SocketAddr>,
    pub remote: SocketAddr,
    pub tcp: PathTcp,
}

impl PathAddress {
    /// A path to `remote` from whatever address the host picks.
    pub fn to(remote: SocketAddr) -> Self {
        Self {
            local: None,
            remote,
            tcp: PathTcp::Kernel,
        }
    }

    /// A path to `remote` from the local address `local` (its interface).
    pub fn from_local(local: SocketAddr, remote: SocketAddr) -> Self {
        Self {
            local: Some(local),
            ..Self::to(remote)
        }
    }

    /// A path to `remote` over squarepeg's userspace TCP on `stack` (from the stack's
    /// address).
    #[cfg(feature = "utcp")]
    pub fn over_stack(stack: Arc<squarepeg_io::Stack>, remote: SocketAddr) -> Self {
        Self {
            tcp: PathTcp::Userspace(stack),
            ..Self::to(remote)
        }
    }
}

/// An address a [`MultipathEndpoint`] listens on, over which TCP.
#[derive(Clone, Debug, PartialEq)]
pub struct ListenAddress {
    pub addr: SocketAddr,
    pub tcp: PathTcp,
}

impl ListenAddress {
    /// `addr` on the kernel's TCP.
    pub fn kernel(addr: SocketAddr) -> Self {
        Self {
            addr,
            tcp: PathTcp::Kernel,
        }
    }

    /// `addr` (one of the stack's addresses, or unspecified for all of them) on
    /// squarepeg's userspace TCP on `stack`, read and written as a plain byte stream.
    #[cfg(feature = "utcp")]
    pub fn over_stack(stack: Arc<squarepeg_io::Stack>, addr: SocketAddr) -> Self {
        Self {
            addr,
            tcp: PathTcp::Userspace(stack),
        }
    }
}

impl From<SocketAddr> for ListenAddress {
    fn from(addr: SocketAddr) -> Self {
        Self::kernel(addr)
    }
}

/// A path's connected socket.
enum PathSocket {
    Kernel(TcpStream),
    #[cfg(feature = "utcp")]
    Userspace(squarepeg_io::TcpStream),
}

impl PathSocket {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            PathSocket::Kernel(s) => s.local_addr(),
            #[cfg(feature = "utcp")]
            PathSocket::Userspace(s) => Ok(s.local_addr()),
        }
    }

    fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            PathSocket::Kernel(s) => s.peer_addr(),
            #[cfg(feature = "utcp")]
            PathSocket::Userspace(s) => Ok(s.peer_addr()),
        }
    }

    /// The kernel's socket options where it is a kernel socket.
    fn prepare(&self, config: &ConnectionConfig) -> io::Result<()> {
        match self {
            PathSocket::Kernel(s) => prepare_socket(s, config),
            #[cfg(feature = "utcp")]
            PathSocket::Userspace(_) => Ok(()),
        }
    }

    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            PathSocket::Kernel(s) => s.write_all(data).await,
            #[cfg(feature = "utcp")]
            PathSocket::Userspace(s) => s.write_all(data).await,
        }
    }

    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            PathSocket::Kernel(s) => s.read(buf).await,
            #[cfg(feature = "utcp")]
            PathSocket::Userspace(s) => s.read(buf).await,
        }
    }
}

/// A listening socket of a [`MultipathEndpoint`].
enum PathListener {
    Kernel(TcpListener),
    #[cfg(feature = "utcp")]
    Userspace(squarepeg_io::TcpListener),
}

impl PathListener {
    async fn bind(address: &ListenAddress) -> io::Result<(Self, Vec<SocketAddr>)> {
        match &address.tcp {
            PathTcp::Kernel => {
                let listener = TcpListener::bind(address.addr).await?;
                let local = listener.local_addr()?;
                Ok((PathListener::Kernel(listener), vec![local]))
            }
            #[cfg(feature = "utcp")]
            PathTcp::Userspace(stack) => {
                let listener = stack.listen(address.addr)?;
                let local = listener.local_addrs().to_vec();
                Ok((PathListener::Userspace(listener), local))
            }
        }
    }

    async fn accept(&self) -> io::Result<PathSocket> {
        match self {
            PathListener::Kernel(l) => l.accept().await.map(|(s, _)| PathSocket::Kernel(s)),
            #[cfg(feature = "utcp")]
            PathListener::Userspace(l) => l.accept().await.map(|(s, _)| PathSocket::Userspace(s)),
        }
    }
}

async fn open_socket(
    path: &PathAddress,
    timeout: Duration,
    config: &ConnectionConfig,
) -> Result<PathSocket, ConnectError> {
    let timed_out = || ConnectError::Transport(squarepeg_session::TransportError::TimedOut);
    match &path.tcp {
        PathTcp::Kernel => {}
        #[cfg(feature = "utcp")]
        PathTcp::Userspace(stack) => {
            let stream = tokio::time::timeout(timeout, stack.connect(path.remote))
                .await
                .map_err(|_| timed_out())?
                .map_err(connect_error)?;
            return Ok(PathSocket::Userspace(stream));
        }
    }
    let socket = match path.remote {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(local) = path.local {
        socket.bind(local)?;
    }
    let stream = tokio::time::timeout(timeout, socket.connect(path.remote))
        .await
        .map_err(|_| timed_out())?
        .map_err(connect_error)?;
    prepare_socket(&stream, config)?;
    Ok(PathSocket::Kernel(stream))
}

/// Spawns the driver of path `id` of the session in `shared` on `socket`.
fn spawn_path_driver(
    shared: &Arc<Shared>,
    id: PathId,
    socket: PathSocket,
    config: &ConnectionConfig,
) {
    let port = Port::Path(id);
    match socket {
        PathSocket::Kernel(socket) => {
            let wire: KernelWire = KernelWire::new(port, config, true, shared.clone());
            tokio::spawn(driver::run(
                shared.clone(),
                port,
                KernelStream(Arc::new(socket)),
                wire,
                config.write_batch,
            ));
        }
        #[cfg(feature = "utcp")]
        PathSocket::Userspace(stream) => {
            let wire =
                KernelWire::<squarepeg_io::TcpStream>::new(port, config, true, shared.clone());
            tokio::spawn(driver::run(
                shared.clone(),
                port,
                stream,
                wire,
                config.write_batch,
            ));
        }
    }
}

impl Connection {
    /// Opens one session over several kernel-TCP connections, one per path in `paths`
    /// (TLS required: a client set-up in `config`). The first path's connection makes the
    /// full handshake and returns once it is done; the others join with tickets the server
    /// issues inside the session (ordinary TLS 1.3 resumptions) as soon as there are some,
    /// and a path whose connection dies is joined again every
    /// [`MultipathOptions::rejoin_interval`]. What a dead connection had not delivered goes
    /// on the others; which connection carries what is each message's and stream's
    /// [`squarepeg_session::PathPolicy`]. Addresses the server announces become paths too.
    pub async fn connect_multipath(
        paths: &[PathAddress],
        config: ConnectionConfig,
        options: MultipathOptions,
    ) -> Result<Connection, ConnectError> {
        config.check(Role::Client)?;
        let Some(TlsSetup::Client {
            config: tls_config,
            server_name,
        }) = config.tls.clone()
        else {
            return Err(ConfigError("a multipath session needs TLS (a client set-up)").into());
        };
        let Some(first) = paths.first() else {
            return Err(ConfigError("a multipath session needs at least one path").into());
        };
        let tickets = JoinTickets::new(64);
        let tls = Tls::client(tickets.collecting_config(&tls_config), &server_name)
            .map_err(ConnectError::Tls)?;
        let mut core = MultipathConnection::new(Role::Client, options.core_config(&config))?;
        let socket = open_socket(first, options.connect_timeout, &config).await?;
        let local = socket.local_addr()?;
        let id = core.add_path(Instant::now(), Path::new(tls, config.read_buffer));
        let shared = Arc::new(Shared::new(core, config.status_queue, local, first.remote));
        spawn_path_driver(&shared, id, socket, &config);
        let supervisor = Supervisor {
            shared: Arc::downgrade(&shared),
            slots: paths
                .iter()
                .enumerate()
                .map(|(i, address)| {
                    Slot::new(address.clone(), (i == 0).then_some(id), Instant::now())
                })
                .collect(),
            tickets,
            tls_config,
            server_name,
            config: config.clone(),
            options,
            attempts: Arc::new(Mutex::new(Vec::new())),
        };
        tokio::spawn(supervisor.run());
        tokio::spawn(keep_timers(Arc::downgrade(&shared), false, None));
        let conn = Connection {
            handle: Arc::new(Handle(shared)),
        };
        conn.established().await.map_err(|e| match e {
            squarepeg_session::ConnectionError::Transport(t) => ConnectError::Transport(t),
            other => ConnectError::Closed(other),
        })?;
        Ok(conn)
    }

    /// Of a multipath session: its connections (id, usable, smoothed RTT, bytes in flight).
    pub fn paths(&self) -> Vec<squarepeg_connection::PathInfo> {
        self.shared()
            .lock()
            .conn
            .multi()
            .map(MultipathConnection::paths)
            .unwrap_or_default()
    }

    /// Of a multipath session: the connections that closed (the latest sixteen), with when
    /// this side learnt it and why.
    pub fn closed_paths(&self) -> Vec<squarepeg_connection::ClosedPath> {
        self.shared()
            .lock()
            .conn
            .multi()
            .map(|m| m.closed_paths().copied().collect())
            .unwrap_or_default()
    }

    /// Of a multipath session: its counters (paths added, closed, timed out; frames re-sent).
    pub fn multipath_stats(&self) -> Option<squarepeg_connection::MultipathStats> {
        self.shared().lock().conn.multi().map(|m| m.stats())
    }

    /// Of a multipath session: tells the peer this side can also be reached at `addr`;
    /// returns the id that withdraws it.
    pub fn announce_address(&self, addr: SocketAddr) -> Option<u64> {
        let sh = self.shared();
        let id = sh.lock().conn.multi_mut()?.announce_address(addr);
        sh.wake_driver();
        Some(id)
    }

    /// Of a multipath session: withdraws an announced address.
    pub fn withdraw_address(&self, id: u64) {
        let sh = self.shared();
        if let Some(m) = sh.lock().conn.multi_mut() {
            m.withdraw_address(id);
        }
        sh.wake_driver();
    }
}

struct Slot {
    address: PathAddress,
    /// Its connection, while it has one.
    path: Option<PathId>,
    connecting: bool,
    /// Not before then (backoff after failures).
    next_try: Instant,
    failures: u32,
    /// The peer announced it with this id.
    announced: Option<u64>,
    /// The peer withdrew it.
    withdrawn: bool,
}

impl Slot {
    fn new(address: PathAddress, path: Option<PathId>, now: Instant) -> Self {
        Self {
            address,
            path,
            connecting: false,
            next_try: now,
            failures: 0,
            announced: None,
            withdrawn: false,
        }
    }

    fn announced(id: u64, addr: SocketAddr, now: Instant) -> Self {
        Self {
            announced: Some(id),
            ..Self::new(PathAddress::to(addr), None, now)
        }
    }
}

/// A finished connection attempt: the slot, and the path made (or why not).
type Attempt = (usize, Result<PathId, ConnectError>);

/// The client's keeper of paths: joins a connection for every path that has none.
struct Supervisor {
    shared: Weak<Shared>,
    slots: Vec<Slot>,
    tickets: Arc<JoinTickets>,
    tls_config: Arc<squarepeg_tls::rustls::ClientConfig>,
    server_name: String,
    config: ConnectionConfig,
    options: MultipathOptions,
    attempts: Arc<Mutex<Vec<Attempt>>>,
}

impl Supervisor {
    async fn run(mut self) {
        loop {
            let Some(shared) = self.shared.upgrade() else {
                return;
            };
            let changed = shared.paths_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            {
                let mut st = shared.lock();
                if st.driver_done || st.conn.session().error().is_some() {
                    return;
                }
                let Some(m) = st.conn.multi_mut() else {
                    return;
                };
                // Finished attempts first: a path they made may already be reported closed
                // below.
                let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
                for (i, result) in attempts.drain(..) {
                    let slot = &mut self.slots[i];
                    slot.connecting = false;
                    match result {
                        Ok(id) if !m.path_is_finished(id) => {
                            slot.path = Some(id);
                            slot.failures = 0;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!("path {i}: join failed: {e}");
                            // Exponential backoff: a path that refuses is not hammered.
                            slot.failures = slot.failures.saturating_add(1);
                            let backoff = self.options.rejoin_interval
                                * 2u32.saturating_pow(slot.failures.min(5));
                            slot.next_try = now + backoff.min(MAX_BACKOFF);
                        }
                    }
                }
                drop(attempts);
                while let Some(event) = m.poll_path_event() {
                    match event {
                        PathEvent::Closed { path, .. } => {
                            for s in self.slots.iter_mut().filter(|s| s.path == Some(path)) {
                                s.path = None;
                                s.next_try = now + self.options.rejoin_interval;
                            }
                        }
                        PathEvent::PeerAddress { id, addr } => {
                            match self.slots.iter_mut().find(|s| s.address.remote == addr) {
                                Some(s) => s.withdrawn = false,
                                None => self.slots.push(Slot::announced(id, addr, now)),
                            }
                        }
                        PathEvent::PeerAddressRemoved { id } => {
                            for s in self.slots.iter_mut().filter(|s| s.announced == Some(id)) {
                                s.withdrawn = true;
                            }
                        }
                        _ => {}
                    }
                }
            }
            let closing = shared.lock().conn.session().is_closing();
            if !closing {
                for i in 0..self.slots.len() {
                    let slot = &self.slots[i];
                    if slot.path.is_some()
                        || slot.connecting
                        || slot.withdrawn
                        || slot.next_try > now
                        || self.tickets.is_empty(&self.server_name)
                    {
                        continue;
                    }
                    self.slots[i].connecting = true;
                    tokio::spawn(join(
                        Arc::downgrade(&shared),
                        i,
                        self.slots[i].address.clone(),
                        JoinTls {
                            tickets: self.tickets.clone(),
                            config: self.tls_config.clone(),
                            server_name: self.server_name.clone(),
                        },
                        self.config.clone(),
                        self.options.connect_timeout,
                        self.attempts.clone(),
                    ));
                }
            }
            // Woken by path events and finished attempts; tickets arrive with the session's
            // data, and backoffs end, so look again after a while too.
            let _ = tokio::time::timeout(self.options.rejoin_interval, changed).await;
        }
    }
}

/// The longest wait before a path that keeps failing is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a join's TLS is made from.
struct JoinTls {
    tickets: Arc<JoinTickets>,
    config: Arc<squarepeg_tls::rustls::ClientConfig>,
    server_name: String,
}

/// Opens a join over `address` and adds it to the session. The ticket is taken only once
/// the TCP connection is up (a path that does not answer burns none).
async fn join(
    shared: Weak<Shared>,
    slot: usize,
    address: PathAddress,
    join_tls: JoinTls,
    config: ConnectionConfig,
    timeout: Duration,
    attempts: Arc<Mutex<Vec<Attempt>>>,
) {
    let socket = open_socket(&address, timeout, &config).await;
    let tls = socket.and_then(|socket| {
        Tls::client_join(&join_tls.config, &join_tls.tickets, &join_tls.server_name)
            .map(|tls| (socket, tls))
            .map_err(ConnectError::Tls)
    });
    let result = match tls {
        Ok((socket, tls)) => match shared.upgrade() {
            Some(shared) => {
                let id = shared
                    .lock()
                    .conn
                    .multi_mut()
                    .map(|m| m.add_path(Instant::now(), Path::join(tls, config.read_buffer)));
                match id {
                    Some(id) => {
                        spawn_path_driver(&shared, id, socket, &config);
                        Ok(id)
                    }
                    None => return,
                }
            }
            None => return,
        },
        Err(e) => Err(e),
    };
    attempts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((slot, result));
    if let Some(shared) = shared.upgrade() {
        shared.paths_changed.notify_waiters();
    }
}

/// Runs a multipath session's timers while it has no path driver (they run them
/// otherwise): the linger for a join, the drain. Ends the session's handles' waits once it
/// is over with no driver left, then runs `on_end`. A server's keeper also takes the path
/// events, which nobody else reads there.
async fn keep_timers(
    shared: Weak<Shared>,
    take_events: bool,
    on_end: Option<Box<dyn FnOnce() + Send>>,
) {
    loop {
        let Some(sh) = shared.upgrade() else {
            break;
        };
        let changed = sh.paths_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let timeout = {
            let mut st = sh.lock();
            if st.driver_done {
                break;
            }
            let now = Instant::now();
            if st.conn.poll_timeout().is_some_and(|t| t <= now) {
                st.conn.handle_timeout(now);
            }
            if take_events && let Some(m) = st.conn.multi_mut() {
                while m.poll_path_event().is_some() {}
            }
            if st.conn.session().error().is_some() && !sh.has_path_drivers() {
                st.driver_done = true;
                sh.dispatch(&mut st);
                sh.wake_all(&mut st);
                break;
            }
            sh.dispatch(&mut st);
            st.conn.poll_timeout()
        };
        // Path drivers come and go: look again at least every second.
        let limit = Instant::now() + Duration::from_secs(1);
        let until = timeout.map_or(limit, |t| t.min(limit));
        let _ = tokio::time::timeout_at(until.into(), changed).await;
    }
    if let Some(f) = on_end {
        f();
    }
}

/// A server of multipath sessions: listens on one or more addresses, runs each new
/// connection's TLS handshake, and makes it the first of a new session (a full handshake)
/// or adds it to the session whose join ticket it resumed with (`squarepeg_tls::join`);
/// replayed, expired or unknown tickets are refused and counted ([`Self::join_stats`]).
#[derive(Debug)]
pub struct MultipathEndpoint {
    incoming: mpsc::Receiver<Connection>,
    local: Vec<SocketAddr>,
    registry: JoinRegistry,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for MultipathEndpoint {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct Acceptor {
    registry: JoinRegistry,
    /// The addresses listened on, announced to every session's client (those it did not
    /// connect to; not unspecified ones).
    announce: Vec<SocketAddr>,
    sessions: Mutex<HashMap<SessionId, Weak<Shared>>>,
    config: ConnectionConfig,
    options: MultipathOptions,
    incoming: mpsc::Sender<Connection>,
}

impl MultipathEndpoint {
    /// Listens on every address of `addrs` on the kernel's TCP (TLS required: a server
    /// set-up in `config`). Each session's client is told the addresses it did not connect
    /// to (ADD_ADDRESS, docs/wire.md §7; unspecified ones are not announced) and opens paths
    /// to them.
    pub async fn bind(
        addrs: &[SocketAddr],
        config: ConnectionConfig,
        options: MultipathOptions,
    ) -> Result<Self, ConnectError> {
        let addrs: Vec<ListenAddress> = addrs.iter().copied().map(ListenAddress::kernel).collect();
        Self::bind_on(&addrs, config, options).await
    }

    /// [`Self::bind`] on any mix of substrates: each address on the kernel's TCP or on a
    /// userspace stack ([`ListenAddress::over_stack`]); a session's connections may come
    /// over any of them.
    pub async fn bind_on(
        addrs: &[ListenAddress],
        config: ConnectionConfig,
        options: MultipathOptions,
    ) -> Result<Self, ConnectError> {
        config.check(Role::Server)?;
        let Some(TlsSetup::Server { config: tls_config }) = config.tls.clone() else {
            return Err(ConfigError("a multipath session needs TLS (a server set-up)").into());
        };
        options.core_config(&config).validate()?;
        let registry = JoinRegistry::new(tls_config, options.join).map_err(ConnectError::Tls)?;
        let (tx, incoming) = mpsc::channel(64);
        let mut listeners = Vec::new();
        let mut local = Vec::new();
        for addr in addrs {
            let (listener, addrs) = PathListener::bind(addr).await?;
            local.extend(addrs);
            listeners.push(listener);
        }
        let acceptor = Arc::new(Acceptor {
            registry: registry.clone(),
            announce: local
                .iter()
                .copied()
                .filter(|a| !a.ip().is_unspecified())
                .collect(),
            sessions: Mutex::new(HashMap::new()),
            config,
            options,
            incoming: tx,
        });
        let mut tasks = Vec::new();
        for listener in listeners {
            let acceptor = acceptor.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    match listener.accept().await {
                        Ok(socket) => {
                            tokio::spawn(acceptor.clone().handshake(socket));
                        }
                        Err(e) => {
                            tracing::debug!("multipath accept: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }));
        }
        Ok(Self {
            incoming,
            local,
            registry,
            tasks,
        })
    }

    /// The addresses listened on.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local
    }

    /// The next new session (joins go to their sessions without showing here).
    pub async fn accept(&mut self) -> Result<Connection, ConnectError> {
        self.incoming.recv().await.ok_or_else(|| {
            ConnectError::Io(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the listeners stopped",
            ))
        })
    }

    /// Joins accepted and refused (replayed, unknown session, expired, not resumed).
    pub fn join_stats(&self) -> JoinStats {
        self.registry.stats()
    }
}

impl Acceptor {
    /// Runs a new connection's handshake, then starts a session with it or joins it to one.
    async fn handshake(self: Arc<Self>, mut socket: PathSocket) {
        let (server_config, probe) = self.registry.connection();
        let mut path = match Tls::server(server_config) {
            Ok(tls) => Path::new(tls, self.config.read_buffer),
            Err(e) => {
                tracing::debug!("multipath: {e}");
                return;
            }
        };
        let run = async {
            let mut buf = vec![0; 16 * 1024];
            loop {
                if path.is_established() {
                    // What the server sends now (its join tickets) waits for the path's
                    // driver: a join with them may come at once, and the session must be
                    // known to take it.
                    return Ok::<_, io::Error>(());
                }
                let mut out = Vec::new();
                path.poll_transmit(&mut out);
                socket.write_all(&out).await?;
                if path.failure().is_some() {
                    return Ok(());
                }
                let n = socket.read(&mut buf).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                path.handle_bytes(&buf[..n]);
            }
        };
        match tokio::time::timeout(self.options.handshake_timeout, run).await {
            Ok(Ok(())) if path.failure().is_none() => {}
            _ => return,
        }
        if let Err(e) = socket.prepare(&self.config) {
            tracing::debug!("multipath: {e}");
            return;
        }
        let now = self.registry_now();
        // Tickets past their lifetime go (the store stays bounded by its capacity anyway).
        self.registry.expire(now);
        if !probe.offered_ticket() {
            // A full handshake with no ticket: a new session.
            self.start(now, &probe, path, socket).await;
            return;
        }
        match self.registry.admit(now, &probe, path.tls()) {
            JoinVerdict::Accepted(session) => self.join(session, path, socket),
            // Refused and counted; dropping the socket closes it.
            verdict => tracing::debug!("multipath: join refused: {verdict:?}"),
        }
    }

    /// The registry's clock: time since the process's first use of it.
    fn registry_now(&self) -> Duration {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed()
    }

    async fn start(&self, now: Duration, probe: &JoinProbe, path: Path, socket: PathSocket) {
        let session = self.registry.start_session(now, probe);
        let core =
            match MultipathConnection::new(Role::Server, self.options.core_config(&self.config)) {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!("multipath: {e}");
                    return;
                }
            };
        let (Ok(local), Ok(remote)) = (socket.local_addr(), socket.peer_addr()) else {
            return;
        };
        let mut core = core;
        let id = core.add_path(Instant::now(), path);
        // The client learns the server's other addresses and opens paths to them
        // (docs/wire.md §7).
        for &addr in self.announce.iter().filter(|a| **a != local) {
            core.announce_address(addr);
        }
        let shared = Arc::new(Shared::new(core, self.config.status_queue, local, remote));
        {
            // Known before its driver sends the tickets: a join may follow them at once.
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.retain(|_, s| s.strong_count() > 0);
            sessions.insert(session, Arc::downgrade(&shared));
        }
        spawn_path_driver(&shared, id, socket, &self.config);
        let registry = self.registry.clone();
        let on_end: Box<dyn FnOnce() + Send> = Box::new(move || registry.end_session(session));
        tokio::spawn(keep_timers(Arc::downgrade(&shared), true, Some(on_end)));
        let conn = Connection {
            handle: Arc::new(Handle(shared)),
        };
        if self.incoming.send(conn).await.is_err() {
            self.registry.end_session(session);
        }
    }

    fn join(&self, session: SessionId, path: Path, socket: PathSocket) {
        let shared = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.retain(|_, s| s.strong_count() > 0);
            sessions.get(&session).and_then(Weak::upgrade)
        };
        let Some(shared) = shared else {
            self.registry.end_session(session);
            return;
        };
        let id = {
            let mut st = shared.lock();
            let full = st
                .conn
                .multi()
                .is_some_and(|m| m.paths().len() >= self.options.max_paths);
            if st.conn.session().error().is_some() || full {
                None
            } else {
                st.conn
                    .multi_mut()
                    .map(|m| m.add_path(Instant::now(), path))
            }
        };
        match id {
            Some(id) => spawn_path_driver(&shared, id, socket, &self.config),
            // Dropping the socket closes it.
            None if shared.lock().conn.session().error().is_none() => {
                tracing::debug!("multipath: a session at its path limit refused a join");
            }
            None => self.registry.end_session(session),
        }
    }
}
