//! Moving packets between a packet device and squarepeg connections: the client (one
//! connection) and the server (one per client, routed by destination address). The device is
//! any [`PacketIo`]: a TUN device in `peg tunnel`, channels in the tests.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use squarepeg::{Connection, ConnectionError, MessageProps, Priority, SendError};
use thiserror::Error;

use crate::control::{
    Assigned, CONTROL_SUBSTREAM, Control, ControlError, MAX_TOKEN, PACKET_SUBSTREAM, VERSION,
};
use crate::packet::{Class, DEFAULT_SMALL_PACKET, PacketError, PacketInfo, clamp_mss, inspect};
use crate::pool::AddressPool;

/// Where tunneled packets enter and leave the host: one whole IP packet per call.
pub trait PacketIo: Send + Sync + 'static {
    /// Waits for the next packet and reads it into `buf`; returns its length.
    fn recv(&self, buf: &mut [u8]) -> impl Future<Output = io::Result<usize>> + Send;
    /// Writes one packet.
    fn send(&self, packet: &[u8]) -> impl Future<Output = io::Result<()>> + Send;
}

impl PacketIo for squarepeg_io::PacketDevice {
    fn recv(&self, buf: &mut [u8]) -> impl Future<Output = io::Result<usize>> + Send {
        squarepeg_io::PacketDevice::recv(self, buf)
    }
    fn send(&self, packet: &[u8]) -> impl Future<Output = io::Result<()>> + Send {
        squarepeg_io::PacketDevice::send(self, packet)
    }
}

/// How packets cross the tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TunnelConfig {
    /// The largest IP packet carried (the TUN devices' MTU). The server's is the tunnel's:
    /// it tells the client. Default 1380: a packet, its frame and a TLS record fit one
    /// 1448-byte TCP segment of the outer connection, so a lost outer segment costs one
    /// tunneled packet, not two.
    pub mtu: u16,
    /// How long a packet may wait to be sent before it is dropped as stale (a router's queue
    /// that never holds a packet longer than this); `None` keeps every packet.
    pub lifetime: Option<Duration>,
    /// Send [`Class::Urgent`] packets (pure ACKs, DNS, ICMP, small packets) ahead of bulk
    /// ones. Off: one class for all.
    pub prioritize: bool,
    /// Packets up to this many bytes are urgent.
    pub small_packet: usize,
    /// Lower the MSS option of tunneled TCP SYNs to fit [`mtu`](Self::mtu).
    pub clamp_mss: bool,
    /// How long the server waits for a new client's hello.
    pub hello_timeout: Duration,
}

impl Default for TunnelConfig {
    fn default() -> Self {
        TunnelConfig {
            mtu: 1380,
            lifetime: Some(Duration::from_millis(250)),
            prioritize: true,
            small_packet: DEFAULT_SMALL_PACKET,
            clamp_mss: true,
            hello_timeout: Duration::from_secs(10),
        }
    }
}

impl TunnelConfig {
    fn props(&self, class: Class) -> MessageProps {
        let priority = match (self.prioritize, class) {
            (true, Class::Urgent) => Priority::HIGHEST,
            _ => BULK,
        };
        MessageProps {
            substream: PACKET_SUBSTREAM,
            priority,
            lifetime: self.lifetime,
            ..MessageProps::default()
        }
    }
}

/// The priority of bulk packets (and of all packets without prioritisation).
const BULK: Priority = match Priority::new(4) {
    Some(p) => p,
    None => Priority::HIGHEST,
};

/// Why a tunnel stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TunnelError {
    /// The connection ended.
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    /// The server refused this client.
    #[error("the server refused the tunnel: {0}")]
    Refused(String),
    /// The peer broke the tunnel protocol.
    #[error("tunnel protocol: {0}")]
    Protocol(String),
    /// A control message did not decode.
    #[error("tunnel control message: {0}")]
    Control(#[from] ControlError),
    /// The packet device failed.
    #[error("packet device: {0}")]
    Device(#[from] io::Error),
}

/// The tunnel's counters (shared by its tasks; [`TunnelStats::snapshot`] reads them).
#[derive(Debug, Default)]
pub struct TunnelStats {
    counters: [AtomicU64; COUNTERS],
}

/// A copy of [`TunnelStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Packets from the device handed to a connection.
    pub packets_sent: u64,
    /// Their bytes.
    pub bytes_sent: u64,
    /// Of them, sent as urgent.
    pub urgent_sent: u64,
    /// Packets from a peer written to the device.
    pub packets_received: u64,
    /// Their bytes.
    pub bytes_received: u64,
    /// Device packets dropped: not a well-formed IP packet.
    pub malformed_from_device: u64,
    /// Device packets dropped: longer than the MTU.
    pub oversize_from_device: u64,
    /// Peer packets dropped: not a well-formed IP packet.
    pub malformed_from_peer: u64,
    /// Peer packets dropped: longer than the MTU.
    pub oversize_from_peer: u64,
    /// Peer packets dropped: a source (server) or destination (client) address that is not
    /// the client's.
    pub misaddressed_from_peer: u64,
    /// Device packets dropped at the server: no client has their destination.
    pub no_route: u64,
    /// Device packets dropped: the connection's send queue was full.
    pub queue_full: u64,
    /// TCP SYNs whose MSS was lowered.
    pub mss_clamped: u64,
    /// Clients refused (server: pool exhausted, bad hello).
    pub clients_refused: u64,
}

const COUNTERS: usize = 14;

#[derive(Clone, Copy)]
enum Counter {
    PacketsSent,
    BytesSent,
    UrgentSent,
    PacketsReceived,
    BytesReceived,
    MalformedFromDevice,
    OversizeFromDevice,
    MalformedFromPeer,
    OversizeFromPeer,
    MisaddressedFromPeer,
    NoRoute,
    QueueFull,
    MssClamped,
    ClientsRefused,
}

impl TunnelStats {
    fn add(&self, c: Counter, n: u64) {
        self.counters[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn bad(&self, e: &PacketError, from_peer: bool) {
        let c = match (e, from_peer) {
            (PacketError::Oversize { .. }, false) => Counter::OversizeFromDevice,
            (PacketError::Oversize { .. }, true) => Counter::OversizeFromPeer,
            (_, false) => Counter::MalformedFromDevice,
            (_, true) => Counter::MalformedFromPeer,
        };
        self.add(c, 1);
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let c = |c: Counter| self.counters[c as usize].load(Ordering::Relaxed);
        StatsSnapshot {
            packets_sent: c(Counter::PacketsSent),
            bytes_sent: c(Counter::BytesSent),
            urgent_sent: c(Counter::UrgentSent),
            packets_received: c(Counter::PacketsReceived),
            bytes_received: c(Counter::BytesReceived),
            malformed_from_device: c(Counter::MalformedFromDevice),
            oversize_from_device: c(Counter::OversizeFromDevice),
            malformed_from_peer: c(Counter::MalformedFromPeer),
            oversize_from_peer: c(Counter::OversizeFromPeer),
            misaddressed_from_peer: c(Counter::MisaddressedFromPeer),
            no_route: c(Counter::NoRoute),
            queue_full: c(Counter::QueueFull),
            mss_clamped: c(Counter::MssClamped),
            clients_refused: c(Counter::ClientsRefused),
        }
    }
}

impl std::fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} packets ({} bytes, {} urgent), received {} ({} bytes); dropped: \
             malformed {}+{}, oversize {}+{} (device+peer), misaddressed {}, no route {}, \
             queue full {}; MSS clamped {}; clients refused {}",
            self.packets_sent,
            self.bytes_sent,
            self.urgent_sent,
            self.packets_received,
            self.bytes_received,
            self.malformed_from_device,
            self.malformed_from_peer,
            self.oversize_from_device,
            self.oversize_from_peer,
            self.misaddressed_from_peer,
            self.no_route,
            self.queue_full,
            self.mss_clamped,
            self.clients_refused,
        )
    }
}

/// Hands a checked packet from the device to `conn`, its MSS clamped first if it is a SYN;
/// a full send queue drops it (counted).
fn send_packet(
    conn: &Connection,
    mut packet: Vec<u8>,
    info: &PacketInfo,
    config: &TunnelConfig,
    mtu: u16,
    stats: &TunnelStats,
) -> Result<(), ConnectionError> {
    if info.tcp_syn && config.clamp_mss && clamp_mss(&mut packet, mtu) {
        stats.add(Counter::MssClamped, 1);
    }
    let len = packet.len() as u64;
    let class = info.class;
    match conn.try_send_message(packet, config.props(class)) {
        Ok(_) => {
            stats.add(Counter::PacketsSent, 1);
            stats.add(Counter::BytesSent, len);
            if config.prioritize && class == Class::Urgent {
                stats.add(Counter::UrgentSent, 1);
            }
            Ok(())
        }
        // A full queue drops the packet, as a router's would: the tunneled flows react.
        Err(SendError::QueueFull { .. }) | Err(SendError::TooLarge { .. }) => {
            stats.add(Counter::QueueFull, 1);
            Ok(())
        }
        Err(SendError::Connection(e)) => Err(e),
        Err(SendError::Closing) => Err(ConnectionError::LocallyClosed),
        Err(SendError::UnknownDependency { .. }) => Ok(()),
    }
}

/// Checks a packet from the peer (one whole IP packet within the MTU, addressed as
/// `addressed` requires), clamps its MSS if it is a SYN and writes it to `device`; anything
/// else is dropped and counted.
async fn packet_from_peer(
    payload: squarepeg::Bytes,
    mtu: u16,
    config: &TunnelConfig,
    stats: &TunnelStats,
    device: &impl PacketIo,
    addressed: impl Fn(&PacketInfo) -> bool,
) -> io::Result<()> {
    let mut packet = Vec::from(payload);
    match inspect(&packet, mtu, usize::MAX) {
        Ok(info) if !addressed(&info) => stats.add(Counter::MisaddressedFromPeer, 1),
        Ok(info) => {
            if info.tcp_syn && config.clamp_mss && clamp_mss(&mut packet, mtu) {
                stats.add(Counter::MssClamped, 1);
            }
            device.send(&packet).await?;
            stats.add(Counter::PacketsReceived, 1);
            stats.add(Counter::BytesReceived, packet.len() as u64);
        }
        Err(e) => stats.bad(&e, true),
    }
    Ok(())
}

/// What the server gave this client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The tunnel MTU.
    pub mtu: u16,
    /// The client's addresses, one per family.
    pub addresses: Vec<Assigned>,
}

/// The client's side of the hello: says hello (with the server's shared secret, if it has
/// one) and waits for the server's addresses.
pub async fn client_handshake(conn: &Connection, token: &[u8]) -> Result<Assignment, TunnelError> {
    if token.len() > MAX_TOKEN {
        return Err(TunnelError::Protocol(format!(
            "a token of {} bytes is longer than {MAX_TOKEN}",
            token.len()
        )));
    }
    let hello = Control::Hello {
        version: VERSION,
        token: token.to_vec(),
    }
    .encode();
    conn.send_message(
        hello,
        MessageProps {
            substream: CONTROL_SUBSTREAM,
            priority: Priority::HIGHEST,
            ..MessageProps::default()
        },
    )
    .await
    .map_err(|e| match e {
        SendError::Connection(c) => TunnelError::Connection(c),
        other => TunnelError::Protocol(other.to_string()),
    })?;
    let m = conn.recv_message().await?;
    if m.substream != CONTROL_SUBSTREAM {
        // Packets cannot come before an address: the server sends none.
        return Err(TunnelError::Protocol(
            "a packet before the address assignment".into(),
        ));
    }
    match Control::decode(&m.payload)? {
        Control::Assign {
            version,
            mtu,
            addresses,
        } => {
            if version != VERSION {
                return Err(TunnelError::Protocol(format!(
                    "the server speaks version {version}, this client {VERSION}"
                )));
            }
            if addresses.is_empty() {
                return Err(TunnelError::Protocol(
                    "an assignment without addresses".into(),
                ));
            }
            for a in &addresses {
                check_assigned(a)?;
            }
            if mtu < squarepeg_io::MIN_MTU {
                return Err(TunnelError::Protocol(format!(
                    "tunnel MTU {mtu} is too small"
                )));
            }
            Ok(Assignment { mtu, addresses })
        }
        Control::Refuse { reason } => Err(TunnelError::Refused(reason)),
        Control::Hello { .. } => Err(TunnelError::Protocol("a hello from the server".into())),
    }
}

/// The shortest prefixes a client accepts for its tunnel subnet: a shorter one would route
/// much of the address space into the tunnel without `--default-route` being asked for.
pub const MIN_PREFIX_V4: u8 = 8;
/// See [`MIN_PREFIX_V4`].
pub const MIN_PREFIX_V6: u8 = 32;

/// Checks an address the server gave: a subnet no wider than the minimum prefixes, holding
/// both ends, which differ.
fn check_assigned(a: &Assigned) -> Result<(), TunnelError> {
    let min = if a.client.is_ipv4() {
        MIN_PREFIX_V4
    } else {
        MIN_PREFIX_V6
    };
    let bad = |why: &str| {
        Err(TunnelError::Protocol(format!(
            "the server assigned {}/{} with server {}: {why}",
            a.client, a.prefix_len, a.server
        )))
    };
    if a.prefix_len < min {
        return bad(&format!("prefixes shorter than /{min} are refused"));
    }
    if a.client == a.server {
        return bad("the same address at both ends");
    }
    let subnet = crate::pool::Subnet::containing(a.client, a.prefix_len);
    if !subnet.contains(a.server) || a.client == subnet.network() {
        return bad("not a host pair of one subnet");
    }
    Ok(())
}

/// Forwards packets between `device` and the server on `conn` until the connection ends
/// (`Ok` when it was closed normally).
pub async fn run_client(
    conn: Connection,
    device: Arc<impl PacketIo>,
    assignment: &Assignment,
    config: &TunnelConfig,
    stats: Arc<TunnelStats>,
) -> Result<(), TunnelError> {
    let mtu = assignment.mtu;
    let ours: Vec<IpAddr> = assignment.addresses.iter().map(|a| a.client).collect();
    let outbound = async {
        let mut buf = vec![0u8; usize::from(mtu) + 1];
        loop {
            let n = device.recv(&mut buf).await?;
            let packet = &buf[..n];
            match inspect(packet, mtu, config.small_packet) {
                Ok(info) => send_packet(&conn, packet.to_vec(), &info, config, mtu, &stats)?,
                Err(e) => stats.bad(&e, false),
            }
        }
    };
    let inbound = async {
        loop {
            let m = conn.recv_message().await?;
            if m.substream != PACKET_SUBSTREAM {
                // Nothing after the assignment is defined yet; a later version's control
                // messages are ignored rather than fatal.
                continue;
            }
            // The server sends only to this client's addresses.
            packet_from_peer(m.payload, mtu, config, &stats, &*device, |info| {
                ours.contains(&info.destination)
            })
            .await?;
        }
    };
    let r: Result<(), TunnelError> = tokio::select! {
        r = outbound => r,
        r = inbound => r,
    };
    match r {
        Err(TunnelError::Connection(e)) if normal_close(&e) => Ok(()),
        other => other,
    }
}

/// Whether a connection ended as a tunnel normally ends: closed by either side's
/// application.
pub fn normal_close(e: &ConnectionError) -> bool {
    matches!(
        e,
        ConnectionError::LocallyClosed | ConnectionError::ApplicationClosed { code: 0, .. }
    )
}

/// The server: one device, an address pool, and a route per client address.
pub struct Server<D> {
    device: Arc<D>,
    config: TunnelConfig,
    pool: Mutex<AddressPool>,
    routes: Mutex<HashMap<IpAddr, Connection>>,
    stats: Arc<TunnelStats>,
    token: Option<Vec<u8>>,
}

impl<D: PacketIo> Server<D> {
    /// A server forwarding between `device` and its clients, with addresses from `pool`;
    /// with a `token`, only clients whose hello carries it are served.
    pub fn new(
        device: Arc<D>,
        pool: AddressPool,
        config: TunnelConfig,
        token: Option<Vec<u8>>,
    ) -> Arc<Server<D>> {
        Arc::new(Server {
            device,
            config,
            pool: Mutex::new(pool),
            routes: Mutex::new(HashMap::new()),
            stats: Arc::new(TunnelStats::default()),
            token,
        })
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<TunnelStats> {
        &self.stats
    }

    /// Closes every client's connection gracefully (each client is told the tunnel ended,
    /// rather than seeing its connection reset); waits at most `limit` for the closes.
    pub async fn close_all(&self, limit: Duration) {
        let mut conns: Vec<Connection> = Vec::new();
        for conn in self
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            // One entry per address: a client with two families is there twice.
            if !conns
                .iter()
                .any(|c| c.remote_address() == conn.remote_address())
            {
                conns.push(conn.clone());
            }
        }
        let mut closes = tokio::task::JoinSet::new();
        for c in conns {
            closes.spawn(async move { c.close().await });
        }
        let _ = tokio::time::timeout(limit, closes.join_all()).await;
    }

    /// How many clients are connected.
    pub fn clients(&self) -> usize {
        self.pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clients()
    }

    /// Forwards packets from the device to the client that has their destination, until
    /// the device fails.
    pub async fn run_device(self: Arc<Self>) -> Result<(), TunnelError> {
        let mtu = self.config.mtu;
        let mut buf = vec![0u8; usize::from(mtu) + 1];
        loop {
            let n = self.device.recv(&mut buf).await?;
            let packet = &buf[..n];
            let info = match inspect(packet, mtu, self.config.small_packet) {
                Ok(info) => info,
                Err(e) => {
                    self.stats.bad(&e, false);
                    continue;
                }
            };
            let conn = self
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&info.destination)
                .cloned();
            let Some(conn) = conn else {
                self.stats.add(Counter::NoRoute, 1);
                continue;
            };
            // A connection that just ended is removed by its own task.
            let _ = send_packet(
                &conn,
                packet.to_vec(),
                &info,
                &self.config,
                mtu,
                &self.stats,
            );
        }
    }

    /// Serves one client: waits for its hello, gives it addresses (and tells `assigned`),
    /// and forwards its packets to the device until the connection ends (`Ok` with its
    /// addresses when it was closed normally).
    pub async fn serve(
        self: Arc<Self>,
        conn: Connection,
        assigned: impl FnOnce(&[Assigned]),
    ) -> Result<Vec<Assigned>, TunnelError> {
        let refuse = |reason: String| {
            let conn = conn.clone();
            let stats = self.stats.clone();
            async move {
                stats.add(Counter::ClientsRefused, 1);
                let _ = conn
                    .send_message(
                        Control::Refuse {
                            reason: reason.clone(),
                        }
                        .encode(),
                        control_props(),
                    )
                    .await;
                conn.close().await;
                TunnelError::Refused(reason)
            }
        };
        let hello = match tokio::time::timeout(self.config.hello_timeout, conn.recv_message()).await
        {
            Err(_) => return Err(refuse("no hello in time".into()).await),
            Ok(m) => m?,
        };
        match (hello.substream, Control::decode(&hello.payload)) {
            (
                CONTROL_SUBSTREAM,
                Ok(Control::Hello {
                    version: VERSION,
                    token,
                }),
            ) => {
                if let Some(want) = &self.token
                    && !constant_time_eq(want, &token)
                {
                    return Err(refuse("wrong or missing token".into()).await);
                }
            }
            (CONTROL_SUBSTREAM, Ok(Control::Hello { version, .. })) => {
                return Err(refuse(format!(
                    "this server speaks tunnel version {VERSION}, not {version}"
                ))
                .await);
            }
            _ => return Err(refuse("the first message must be a hello".into()).await),
        }
        let addresses = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .allocate();
        let Some(addresses) = addresses else {
            return Err(refuse("no free tunnel address".into()).await);
        };
        // The addresses go back to the pool and the routes away however this ends.
        let _lease = Lease {
            server: &self,
            addresses: addresses.clone(),
        };
        {
            let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            for a in &addresses {
                routes.insert(a.client, conn.clone());
            }
        }
        let assign = Control::Assign {
            version: VERSION,
            mtu: self.config.mtu,
            addresses: addresses.clone(),
        };
        conn.send_message(assign.encode(), control_props())
            .await
            .map_err(|e| match e {
                SendError::Connection(c) => TunnelError::Connection(c),
                other => TunnelError::Protocol(other.to_string()),
            })?;
        assigned(&addresses);
        let theirs: Vec<IpAddr> = addresses.iter().map(|a| a.client).collect();
        let mtu = self.config.mtu;
        let result: Result<(), TunnelError> = async {
            loop {
                let m = conn.recv_message().await?;
                if m.substream != PACKET_SUBSTREAM {
                    continue;
                }
                // A client sends only from its own addresses (no spoofing through the server).
                packet_from_peer(
                    m.payload,
                    mtu,
                    &self.config,
                    &self.stats,
                    &*self.device,
                    |info| theirs.contains(&info.source),
                )
                .await?;
            }
        }
        .await;
        match result {
            Err(TunnelError::Connection(e)) if normal_close(&e) => Ok(addresses),
            Err(e) => Err(e),
            Ok(()) => Ok(addresses),
        }
    }
}

/// Compares secrets without an early exit on the first difference (the length is not
/// secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn control_props() -> MessageProps {
    MessageProps {
        substream: CONTROL_SUBSTREAM,
        priority: Priority::HIGHEST,
        ..MessageProps::default()
    }
}

/// A client's addresses and routes, returned when it leaves.
struct Lease<'a, D> {
    server: &'a Server<D>,
    addresses: Vec<Assigned>,
}

impl<D> Drop for Lease<'_, D> {
    fn drop(&mut self) {
        let mut routes = self
            .server
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for a in &self.addresses {
            routes.remove(&a.client);
        }
        drop(routes);
        self.server
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .release(&self.addresses);
    }
}
