//! The stack: a driver thread that owns the TUN device and runs the endpoint, and the state it
//! shares with the application's handles.
//!
//! The endpoint lives behind one mutex. Handles ([`TcpStream`], [`TcpListener`]) call it
//! directly (a read or write is a copy into or out of the endpoint's buffers) and poke the
//! driver; the driver, on every wake-up, drains the device (up to `batch` packets or
//! [`TURN_BYTES`] per turn, turn after turn until nothing is left), feeds the packets to the
//! endpoint, runs its timers, drains everything it has to send (again in turns of `batch`
//! packets or `TURN_BYTES`), and wakes the tasks whose
//! connections have news. Device reads and writes happen outside the lock.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use squarepeg_tcp::{
    CloseReason, ConnectionConfig, ConnectionHandle, DropReason, Endpoint, EndpointConfig,
    EndpointStats, Event, FastOpenEntry, ListenerHandle,
};
use tokio::io::Interest;
use tokio::sync::Notify;

use crate::device::{DeviceFd, TunDevice, read_packet, write_packet};
use crate::error::{Error, stopped_error, tcp_to_io};
use crate::offload::{self, RxPacket};
use crate::setup::check_unicast;
use crate::shim::{Impairment, Shim, ShimStats};
use crate::stream::{TcpListener, TcpStream};

/// Default number of packets read, or sent, per driver turn.
pub const DEFAULT_BATCH: usize = 64;
/// Bytes read, or sent, per driver turn, whatever the batch: with a large MTU a batch of
/// 64 KB packets would send (or read) megabytes before the turn's other half runs, so ACKs
/// wait and the pipe drains (`peg bench tcp` at MTU 65535: 10–12 Gbit/s with 64 packets per
/// turn, 23–30 with 4–8). At MTU 1500 a batch of 64 stays below it.
pub const TURN_BYTES: usize = 512 * 1024;
/// Default listen backlog.
pub const DEFAULT_BACKLOG: usize = 128;

/// Sees every packet that crosses the TUN device, as the kernel sees them: inbound packets
/// before the impairment shim, outbound ones after it (with offloads, the segments as the
/// endpoint made them, before they are coalesced). The lab's pcap writer is one
/// (`squarepeg_lab::stack::pcap_capture`).
pub trait PacketTap: Send {
    /// Takes one packet. An error stops the tap: the driver drops it and reports the error in
    /// [`StackStats::capture_error`].
    fn packet(&mut self, packet: &[u8]) -> io::Result<()>;

    /// Called once when the driver stops, so buffered output is not lost.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Debug for dyn PacketTap + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PacketTap")
    }
}

/// How to run the stack.
#[derive(Debug)]
#[non_exhaustive]
pub struct StackConfig {
    /// The stack's own addresses behind the device (at most one per family). Packets to other
    /// destinations are dropped without a reply; `connect` uses the one of the peer's family.
    pub addresses: Vec<IpAddr>,
    /// Defaults for every connection. Its `mtu` is replaced by the device's MTU.
    pub connection: ConnectionConfig,
    /// Endpoint settings. Its `secret` is always replaced by 32 bytes from the operating
    /// system's random generator, and its `local_addresses` by [`addresses`](Self::addresses).
    pub endpoint: EndpointConfig,
    /// Impair the path between the device and the endpoint (tests, demonstrations).
    pub impairment: Option<Impairment>,
    /// Hand every packet crossing the device to a tap (e.g. a pcap capture).
    pub capture: Option<Box<dyn PacketTap>>,
    /// Packets read, or polled for sending, per driver turn.
    pub batch: usize,
    /// Listen backlog (half-open plus not yet accepted connections, each).
    pub backlog: usize,
}

impl StackConfig {
    /// Defaults (Linux-like TCP, no impairment, no capture) for a stack with these addresses.
    pub fn new(addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        StackConfig {
            addresses: addresses.into_iter().collect(),
            connection: ConnectionConfig::default(),
            endpoint: EndpointConfig::default(),
            impairment: None,
            capture: None,
            batch: DEFAULT_BATCH,
            backlog: DEFAULT_BACKLOG,
        }
    }
}

/// Counters of the device side of the driver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceStats {
    /// Packets read from the device.
    pub packets_read: u64,
    /// Bytes read from the device.
    pub bytes_read: u64,
    /// Packets written to the device.
    pub packets_written: u64,
    /// Bytes written to the device.
    pub bytes_written: u64,
    /// Writes the device refused (other than "try again"), e.g. while it is down.
    pub write_errors: u64,
    /// Packets read that were longer than the MTU the driver started with (dropped).
    pub truncated: u64,
    /// Read system calls that returned a packet (with offloads, one may carry many segments;
    /// `packets_read` and `bytes_read` count the segments).
    pub reads: u64,
    /// Write system calls that moved a packet (with offloads, one may carry many segments;
    /// `packets_written` and `bytes_written` count the segments).
    pub writes: u64,
    /// Offloads: reads that carried a TCP super-packet (the kernel's TSO output).
    pub gso_reads: u64,
    /// Offloads: segments those super-packets were split into.
    pub gso_segments: u64,
    /// Offloads: writes of coalesced TCP super-packets (GRO).
    pub gro_writes: u64,
    /// Offloads: segments coalesced into those writes.
    pub gro_segments: u64,
    /// Offloads: reads dropped because their virtio-net header or super-packet was malformed.
    pub offload_errors: u64,
    /// Offloads: packets the kernel did not vouch for whose checksum the driver found wrong
    /// (dropped; without offloads the endpoint counts these).
    pub bad_checksums: u64,
    /// Driver turns (one read batch, one send batch).
    pub turns: u64,
    /// Packets handed to the capture tap.
    pub captured: u64,
    /// CPU time of the driver thread so far (user and system), sampled every 256 turns and
    /// when it stops.
    pub driver_cpu: Duration,
}

/// CPU time of the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Everything the stack counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StackStats {
    /// The TCP endpoint's counters (packets, drops by reason, resets, connections).
    pub endpoint: EndpointStats,
    /// The device side.
    pub device: DeviceStats,
    /// The impairment shim, kernel to squarepeg.
    pub inbound: Option<ShimStats>,
    /// The impairment shim, squarepeg to kernel.
    pub outbound: Option<ShimStats>,
    /// Connections held by the endpoint (any state, TIME-WAIT included).
    pub connections: usize,
    /// Why the capture stopped early, if it did.
    pub capture_error: Option<String>,
}

/// Per-connection wake-up state.
#[derive(Debug, Default)]
pub(crate) struct ConnSlot {
    pub(crate) read: Option<Waker>,
    pub(crate) write: Option<Waker>,
    pub(crate) connect: Option<Waker>,
    pub(crate) closed_waiter: Option<Waker>,
    pub(crate) established: bool,
    pub(crate) closed: Option<CloseReason>,
}

impl ConnSlot {
    fn wake_all(&mut self, wake: &mut Vec<Waker>) {
        wake.extend(
            [
                self.read.take(),
                self.write.take(),
                self.connect.take(),
                self.closed_waiter.take(),
            ]
            .into_iter()
            .flatten(),
        );
    }
}

/// Stores `cx`'s waker in `slot` unless an equivalent one is there.
pub(crate) fn register(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(w) if w.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

/// What the handles and the driver share.
pub(crate) struct State {
    pub(crate) endpoint: Endpoint,
    pub(crate) conns: HashMap<ConnectionHandle, ConnSlot>,
    pub(crate) listeners: HashMap<ListenerHandle, Option<Waker>>,
    /// Why the driver stopped; every operation fails with it from then on.
    pub(crate) stopped: Option<String>,
    stop_requested: bool,
    pub(crate) template: ConnectionConfig,
    pub(crate) backlog: usize,
    pub(crate) addresses: Vec<IpAddr>,
    stats: StackStats,
}

impl State {
    /// Turns the endpoint's events into wake-ups.
    pub(crate) fn dispatch(&mut self, wake: &mut Vec<Waker>) {
        while let Some(event) = self.endpoint.poll_event() {
            match event {
                Event::Connected(h) => {
                    if let Some(c) = self.conns.get_mut(&h) {
                        c.established = true;
                        wake.extend(c.connect.take());
                    }
                }
                Event::Incoming(l) => {
                    if let Some(w) = self.listeners.get_mut(&l).and_then(Option::take) {
                        wake.push(w);
                    }
                }
                Event::Readable(h) | Event::PeerFin(h) => {
                    if let Some(w) = self.conns.get_mut(&h).and_then(|c| c.read.take()) {
                        wake.push(w);
                    }
                }
                Event::Writable(h) => {
                    if let Some(w) = self.conns.get_mut(&h).and_then(|c| c.write.take()) {
                        wake.push(w);
                    }
                }
                Event::Closed(h, reason) => {
                    if let Some(c) = self.conns.get_mut(&h) {
                        c.closed = Some(reason);
                        c.wake_all(wake);
                    }
                }
            }
        }
    }

    /// Fails if the driver has stopped.
    pub(crate) fn check_running(&self) -> io::Result<()> {
        match &self.stopped {
            Some(why) => Err(stopped_error(why)),
            None => Ok(()),
        }
    }
}

pub(crate) struct Shared {
    state: Mutex<State>,
    /// Wakes the driver: something may have to be sent.
    pub(crate) wake_driver: Notify,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Wakes the tasks collected while the lock was held.
pub(crate) fn wake_all(wake: Vec<Waker>) {
    for w in wake {
        w.wake();
    }
}

/// A userspace TCP stack on a TUN device: squarepeg's TCP endpoint, driven by a thread that
/// owns the device. Open connections with [`connect`](Self::connect), accept them with
/// [`listen`](Self::listen); both give [`TcpStream`]s (tokio `AsyncRead + AsyncWrite`).
///
/// The handles work from any tokio runtime (or any executor): they only take the stack's lock
/// and wake its driver. Dropping the stack stops the driver; use
/// [`shutdown`](Self::shutdown) to wait for that and get the final counters.
pub struct Stack {
    shared: Arc<Shared>,
    driver: Option<JoinHandle<()>>,
    done: Option<tokio::sync::oneshot::Receiver<()>>,
    device_name: String,
    mtu: u16,
    offload: bool,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("device", &self.device_name)
            .field("mtu", &self.mtu)
            .field("offload", &self.offload)
            .finish()
    }
}

fn os_random_secret() -> Result<[u8; 32], Error> {
    use rand::TryRngCore;
    let mut secret = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut secret)
        .map_err(|e| Error::io("reading the OS random generator", io::Error::other(e)))?;
    Ok(secret)
}

impl Stack {
    /// Starts the driver thread on `device`.
    pub fn new(device: TunDevice, config: StackConfig) -> Result<Stack, Error> {
        let StackConfig {
            addresses,
            mut connection,
            mut endpoint,
            impairment,
            capture,
            batch,
            backlog,
        } = config;
        if addresses.is_empty() {
            return Err(Error::bad_address("(none)", "the stack needs an address"));
        }
        for (i, a) in addresses.iter().enumerate() {
            check_unicast(*a)?;
            if addresses[..i].iter().any(|b| b.is_ipv4() == a.is_ipv4()) {
                return Err(Error::bad_address(
                    a,
                    "more than one address of this family",
                ));
            }
        }
        let shim = impairment.map(Shim::new);
        let mtu = device.mtu();
        connection.mtu = mtu;
        // With offloads the driver hands the endpoint only packets whose checksums are known
        // good (see `offload.rs`); it verifies the others itself.
        let verify_in_driver = device.offload() && endpoint.verify_checksums;
        if device.offload() {
            endpoint.verify_checksums = false;
        }
        endpoint.secret = os_random_secret()?;
        endpoint.local_addresses = addresses.clone();
        let state = State {
            endpoint: Endpoint::new(endpoint, Instant::now()),
            conns: HashMap::new(),
            listeners: HashMap::new(),
            stopped: None,
            stop_requested: false,
            template: connection,
            backlog: backlog.max(1),
            addresses,
            stats: StackStats::default(),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake_driver: Notify::new(),
        });
        let device_name = device.name().to_string();
        let offload = device.offload();
        let batch = batch.max(1);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let driver_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("squarepeg-io {device_name}"))
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| {
                    run_driver(
                        driver_shared.clone(),
                        device,
                        shim,
                        capture,
                        batch,
                        verify_in_driver,
                    )
                });
                // Nothing here should panic; if something does, the handles must still learn
                // that the driver is gone rather than wait for it forever.
                let outcome = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(format!("the driver panicked: {what}"))
                });
                let why = match outcome {
                    Ok(()) => "shut down".to_string(),
                    Err(e) => {
                        tracing::error!("squarepeg-io driver stopped: {e}");
                        e
                    }
                };
                let mut wake = Vec::new();
                {
                    let mut st = driver_shared.lock();
                    st.stopped = Some(why);
                    for c in st.conns.values_mut() {
                        c.wake_all(&mut wake);
                    }
                    for l in st.listeners.values_mut() {
                        wake.extend(l.take());
                    }
                }
                wake_all(wake);
                let _ = done_tx.send(());
            })
            .map_err(|e| Error::io("starting the driver thread", e))?;
        Ok(Stack {
            shared,
            driver: Some(thread),
            done: Some(done_rx),
            device_name,
            mtu,
            offload,
        })
    }

    /// Whether the driver moves packets with TUN offloads (see [`TunDevice::offload`]).
    pub fn offload(&self) -> bool {
        self.offload
    }

    /// The TUN device's name.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The device's MTU.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// The configuration new connections get by default ([`StackConfig::connection`], with
    /// the device's MTU): a base for [`connect_with`](Self::connect_with) and
    /// [`listen_with`](Self::listen_with).
    pub fn connection_config(&self) -> ConnectionConfig {
        self.shared.lock().template.clone()
    }

    /// The stack's addresses.
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.shared.lock().addresses.clone()
    }

    /// The address of `family_of`'s family, if the stack has one.
    fn local_for(&self, family_of: &SocketAddr) -> io::Result<IpAddr> {
        self.shared
            .lock()
            .addresses
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == family_of.is_ipv4())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the stack has no {} address to reach {family_of} from",
                        if family_of.is_ipv4() { "IPv4" } else { "IPv6" }
                    ),
                )
            })
    }

    /// Opens a connection with the stack's default configuration.
    pub async fn connect(&self, remote: SocketAddr) -> io::Result<TcpStream> {
        let config = self.shared.lock().template.clone();
        self.connect_with(remote, config).await
    }

    /// Opens a connection with its own configuration (its `mtu` is replaced by the device's).
    /// Dropping the future before it completes abandons the connection.
    pub async fn connect_with(
        &self,
        remote: SocketAddr,
        config: ConnectionConfig,
    ) -> io::Result<TcpStream> {
        self.open(remote, config, &[]).await
    }

    /// Opens a TCP Fast Open connection (RFC 7413) whose SYN carries `first_bytes` when the
    /// stack holds a cookie for the server, else a cookie request (the bytes then follow the
    /// handshake): `config.fast_open` is switched on and the bytes are queued before the SYN
    /// is built. Returns once the connection is established, like
    /// [`connect_with`](Stack::connect_with). `first_bytes` larger than the send buffer is
    /// an `InvalidInput` error. Cookies are kept per server in the stack
    /// ([`fast_open_cache`](Stack::fast_open_cache)).
    pub async fn connect_fast_open(
        &self,
        remote: SocketAddr,
        mut config: ConnectionConfig,
        first_bytes: &[u8],
    ) -> io::Result<TcpStream> {
        if first_bytes.len() > config.send_buffer {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "first bytes larger than the send buffer",
            ));
        }
        config.fast_open = true;
        self.open(remote, config, first_bytes).await
    }

    /// Opens a connection and queues `first_bytes` before its SYN is built (they go on it
    /// with Fast Open and a cookie); returns once it is established.
    async fn open(
        &self,
        remote: SocketAddr,
        mut config: ConnectionConfig,
        first_bytes: &[u8],
    ) -> io::Result<TcpStream> {
        let local_ip = self.local_for(&remote)?;
        config.mtu = self.mtu;
        let stream = {
            let mut st = self.shared.lock();
            st.check_running()?;
            let handle = st
                .endpoint
                .connect(Instant::now(), SocketAddr::new(local_ip, 0), remote, config)
                .map_err(tcp_to_io)?;
            st.conns.insert(handle, ConnSlot::default());
            // Under the same lock as the connect: the driver builds the SYN after this.
            if !first_bytes.is_empty() {
                // The length fits the send buffer (checked by the callers), but the endpoint's
                // memory budget may admit less: then nothing is sent rather than a part.
                let written = match st.endpoint.write(handle, first_bytes) {
                    Ok(n) => n,
                    Err(squarepeg_tcp::Error::WouldBlock) => 0,
                    Err(e) => {
                        let _ = st.endpoint.abort(Instant::now(), handle);
                        st.conns.remove(&handle);
                        return Err(tcp_to_io(e));
                    }
                };
                if written < first_bytes.len() {
                    let _ = st.endpoint.abort(Instant::now(), handle);
                    st.conns.remove(&handle);
                    return Err(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        format!(
                            "the stack's memory budget admits {written} of the {} first bytes now",
                            first_bytes.len()
                        ),
                    ));
                }
            }
            let local = st
                .endpoint
                .connection(handle)
                .map(|c| c.local_addr())
                .unwrap_or(SocketAddr::new(local_ip, 0));
            TcpStream::new(self.shared.clone(), handle, local, remote)
        };
        self.shared.wake_driver.notify_one();
        stream.wait_established().await?;
        Ok(stream)
    }

    /// The stack's TCP Fast Open cookies, for keeping across runs (see
    /// [`squarepeg_tcp::Endpoint::fast_open_cache`]).
    pub fn fast_open_cache(&self) -> Vec<FastOpenEntry> {
        self.shared.lock().endpoint.fast_open_cache()
    }

    /// Adds TCP Fast Open cookies saved earlier (see
    /// [`squarepeg_tcp::Endpoint::import_fast_open_cache`]).
    pub fn import_fast_open_cache(&self, entries: impl IntoIterator<Item = FastOpenEntry>) {
        self.shared.lock().endpoint.import_fast_open_cache(entries);
    }

    /// Listens on `addr` (an unspecified address listens on every stack address of its
    /// family).
    pub fn listen(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        let config = self.shared.lock().template.clone();
        self.listen_with(&[addr], config)
    }

    /// Listens on `port` at every stack address.
    pub fn listen_port(&self, port: u16) -> io::Result<TcpListener> {
        let (addrs, config) = {
            let st = self.shared.lock();
            let addrs: Vec<SocketAddr> = st
                .addresses
                .iter()
                .map(|a| SocketAddr::new(*a, port))
                .collect();
            (addrs, st.template.clone())
        };
        self.listen_with(&addrs, config)
    }

    /// Listens on several addresses at once with a configuration of its own (its `mtu` is
    /// replaced by the device's).
    pub fn listen_with(
        &self,
        addrs: &[SocketAddr],
        mut config: ConnectionConfig,
    ) -> io::Result<TcpListener> {
        config.mtu = self.mtu;
        let mut st = self.shared.lock();
        st.check_running()?;
        let mut handles = Vec::new();
        let backlog = st.backlog;
        for addr in addrs {
            let r = st.endpoint.listen(*addr, backlog, config.clone());
            match r {
                Ok(h) => {
                    st.listeners.insert(h, None);
                    handles.push(h);
                }
                Err(e) => {
                    for h in handles {
                        st.listeners.remove(&h);
                        let _ = st.endpoint.unlisten(Instant::now(), h);
                    }
                    return Err(tcp_to_io(e));
                }
            }
        }
        Ok(TcpListener::new(
            self.shared.clone(),
            handles,
            addrs.to_vec(),
        ))
    }

    /// A snapshot of the counters (updated by the driver every turn).
    pub fn stats(&self) -> StackStats {
        let st = self.shared.lock();
        let mut s = st.stats.clone();
        s.endpoint = st.endpoint.stats().clone();
        s.connections = st.endpoint.connection_count();
        s
    }

    /// Why the driver stopped, if it has.
    pub fn stopped(&self) -> Option<String> {
        self.shared.lock().stopped.clone()
    }

    fn request_stop(&self) {
        self.shared.lock().stop_requested = true;
        self.shared.wake_driver.notify_one();
    }

    /// Stops the driver (connections still open are abandoned without a packet, as if the
    /// host vanished), waits for it, and returns the final counters, or the error that stopped
    /// the driver earlier. The device closes; one this process created disappears.
    pub async fn shutdown(mut self) -> Result<StackStats, Error> {
        self.request_stop();
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
        if let Some(t) = self.driver.take() {
            let _ = t.join();
        }
        let why = self.stopped();
        let stats = self.stats();
        match why.as_deref() {
            Some("shut down") | None => Ok(stats),
            Some(other) => Err(Error::io(
                "the driver had stopped",
                io::Error::other(other.to_string()),
            )),
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.driver.is_some() {
            self.request_stop();
        }
    }
}

/// The packets of one turn's reads, in one arena. Without offloads each read has a slot of
/// MTU bytes; with offloads a read takes what it needs (the raw super-packet, then its
/// segments), and reading stops while less than a worst-case read is left.
struct Inbound {
    arena: Vec<u8>,
    packets: Vec<RxPacket>,
    /// Segment lengths of one split (offloads).
    sizes: Vec<usize>,
}

impl Inbound {
    fn new(batch: usize, mtu: usize, offload: bool) -> Self {
        let size = if offload {
            2 * offload::READ_RESERVE
        } else {
            batch * mtu
        };
        Inbound {
            arena: vec![0u8; size],
            packets: Vec::with_capacity(batch),
            sizes: vec![0; if offload { offload::MAX_SEGMENTS } else { 0 }],
        }
    }
    fn packet(&self, i: usize) -> &[u8] {
        let p = self.packets[i];
        &self.arena[p.start..p.start + p.len]
    }
}

/// Packets to write in one turn, each after `headroom` bytes (the virtio-net header with
/// offloads). Buffers are kept between turns; GRO may grow one to a 64 KB super-packet.
struct Outbound {
    bufs: Vec<Vec<u8>>,
    count: usize,
    headroom: usize,
    mtu: usize,
    gro: Option<tun_rs::GROTable>,
}

impl Outbound {
    fn new(batch: usize, mtu: usize, offload: bool) -> Self {
        let headroom = if offload {
            tun_rs::VIRTIO_NET_HDR_LEN
        } else {
            0
        };
        Outbound {
            bufs: (0..batch)
                .map(|_| Outbound::buffer(headroom, mtu))
                .collect(),
            count: 0,
            headroom,
            mtu,
            gro: offload.then(tun_rs::GROTable::new),
        }
    }

    /// A buffer of `headroom + mtu` bytes. With offloads, GRO appends the segments it merges
    /// to the first of their flow, and only into capacity that is already there (twice the
    /// header room and a 64 KB packet, as tun-rs checks).
    fn buffer(headroom: usize, mtu: usize) -> Vec<u8> {
        let capacity = if headroom > 0 {
            2 * headroom + offload::MAX_PACKET
        } else {
            mtu
        };
        let mut buf = Vec::with_capacity(capacity);
        buf.resize(headroom + mtu, 0);
        buf
    }

    /// The next free buffer, `headroom + mtu` long.
    fn next_buf(&mut self) -> &mut Vec<u8> {
        if self.count == self.bufs.len() {
            self.bufs.push(Outbound::buffer(self.headroom, self.mtu));
        }
        let buf = &mut self.bufs[self.count];
        buf.resize(self.headroom + self.mtu, 0);
        buf
    }

    /// Keeps the packet just produced in the next free buffer (`n` bytes after the headroom).
    fn commit(&mut self, n: usize) {
        let buf = &mut self.bufs[self.count];
        buf.truncate(self.headroom + n);
        if self.headroom > 0 {
            offload::mark_unsent(buf);
        }
        self.count += 1;
    }

    fn push(&mut self, packet: &[u8]) {
        let headroom = self.headroom;
        let buf = self.next_buf();
        buf[headroom..headroom + packet.len()].copy_from_slice(packet);
        self.commit(packet.len());
    }

    fn packet(&self, i: usize) -> &[u8] {
        &self.bufs[i][self.headroom..]
    }
}

/// The length an IP packet's header claims (0 if it is not IPv4 or IPv6).
fn ip_length(packet: &[u8]) -> usize {
    match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 4 => usize::from(u16::from_be_bytes([packet[2], packet[3]])),
        Some(6) if packet.len() >= 6 => {
            40 + usize::from(u16::from_be_bytes([packet[4], packet[5]]))
        }
        _ => 0,
    }
}

/// The device and what happens around each write.
struct DeviceIo {
    fd: DeviceFd,
    /// Packets the device refused with "try again", in order.
    unsent: VecDeque<Vec<u8>>,
    capture: Option<Box<dyn PacketTap>>,
    capture_error: Option<String>,
    stats: DeviceStats,
}

impl DeviceIo {
    fn capture(&mut self, packet: &[u8]) {
        if let Some(c) = &mut self.capture {
            match c.packet(packet) {
                Ok(()) => self.stats.captured += 1,
                Err(e) => {
                    tracing::warn!("capture stopped: {e}");
                    self.capture_error = Some(e.to_string());
                    self.capture = None;
                }
            }
        }
    }

    /// Writes the packets the device refused before; false if it still refuses.
    fn flush_unsent(&mut self) -> io::Result<bool> {
        while let Some(p) = self.unsent.pop_front() {
            if !self.write_now(&p)? {
                self.unsent.push_front(p);
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Sends one packet (after any refused earlier).
    fn send(&mut self, packet: &[u8]) -> io::Result<()> {
        if !self.unsent.is_empty() || !self.write_now(packet)? {
            self.unsent.push_back(packet.to_vec());
        }
        Ok(())
    }

    /// Writes a batch with GRO (offloads): consecutive segments of a flow go out as one
    /// super-packet. The segments were captured already, as the endpoint made them.
    fn send_coalesced(&mut self, out: &mut Outbound) -> io::Result<()> {
        let Some(gro) = out.gro.as_mut() else {
            return Ok(());
        };
        let count = out.count;
        for buf in &out.bufs[..count] {
            self.stats.packets_written += 1;
            self.stats.bytes_written += (buf.len() - tun_rs::VIRTIO_NET_HDR_LEN) as u64;
        }
        let result = self.fd.get_ref().send_multiple(
            gro,
            &mut out.bufs[..count],
            tun_rs::VIRTIO_NET_HDR_LEN,
        );
        for buf in &out.bufs[..count] {
            match offload::sent_as(buf) {
                offload::Sent::Merged => {}
                offload::Sent::Plain => self.stats.writes += 1,
                offload::Sent::Coalesced(segments) => {
                    self.stats.writes += 1;
                    self.stats.gro_writes += 1;
                    self.stats.gro_segments += segments;
                }
            }
        }
        match result {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBADFD) => Err(e),
            Err(e) => {
                // A write the kernel refused (or "try again", which a TUN device does not say
                // with its unlimited send buffer): the packets are lost and TCP retransmits
                // them, as without offloads.
                if self.stats.write_errors == 0 {
                    tracing::warn!("writing to the TUN device: {e}");
                }
                self.stats.write_errors += 1;
                Ok(())
            }
        }
    }

    /// One write; `Ok(false)` when the device says "try again".
    fn write_now(&mut self, packet: &[u8]) -> io::Result<bool> {
        match write_packet(&self.fd, packet) {
            Ok(true) => {
                self.stats.writes += 1;
                self.stats.packets_written += 1;
                self.stats.bytes_written += packet.len() as u64;
                self.capture(packet);
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EBADFD) => Err(e),
            Err(e) => {
                // EIO while the device is down, EINVAL for a packet the kernel rejects: the
                // packet is lost and TCP retransmits it; count and go on.
                if self.stats.write_errors == 0 {
                    tracing::warn!("writing to the TUN device: {e}");
                }
                self.stats.write_errors += 1;
                Ok(true)
            }
        }
    }
}

struct Driver {
    shared: Arc<Shared>,
    io: DeviceIo,
    rx: Inbound,
    tx: Outbound,
    shim: Option<Shim>,
    batch: usize,
    /// The device runs with offloads (virtio-net headers).
    offload: bool,
    /// Verify the checksums of packets the kernel did not vouch for (offloads; the endpoint
    /// then verifies none).
    verify_in_driver: bool,
    wake: Vec<Waker>,
}

enum Turn {
    /// A batch filled up: go again at once.
    Busy,
    /// Everything drained: wait for the device, a handle or this time.
    Idle(Option<Instant>),
    /// The stack asked the driver to stop.
    Stop,
}

fn run_driver(
    shared: Arc<Shared>,
    device: TunDevice,
    shim: Option<Shim>,
    capture: Option<Box<dyn PacketTap>>,
    batch: usize,
    verify_in_driver: bool,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the driver's runtime: {e}"))?;
    runtime.block_on(async move {
        let mtu = usize::from(device.mtu());
        let offload = device.offload();
        device
            .device
            .set_nonblocking(true)
            .map_err(|e| format!("making the TUN device non-blocking: {e}"))?;
        // SAFETY: the device owns its descriptor, keeps it open until it is dropped (with the
        // AsyncFd) and always reports the same one.
        let fd = unsafe { tokio::io::unix::AsyncFd::register(device.device) }
            .map_err(|e| format!("registering the TUN device: {e}"))?;
        let mut driver = Driver {
            shared,
            io: DeviceIo {
                fd,
                unsent: VecDeque::new(),
                capture,
                capture_error: None,
                stats: DeviceStats::default(),
            },
            rx: Inbound::new(batch, mtu, offload),
            tx: Outbound::new(batch, mtu, offload),
            shim,
            batch,
            offload,
            verify_in_driver,
            wake: Vec::new(),
        };
        let r = driver.run().await;
        driver.publish_stats();
        if let Some(c) = driver.io.capture.as_mut()
            && let Err(e) = c.flush()
        {
            tracing::warn!("flushing the capture: {e}");
        }
        r.map_err(|e| format!("TUN device error: {e}"))
    })
}

impl Driver {
    async fn run(&mut self) -> io::Result<()> {
        let sleep = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(sleep);
        loop {
            let deadline = match self.turn()? {
                Turn::Stop => return Ok(()),
                // Reads and writes go straight to the device, so the next turn needs nothing
                // from the runtime; it is the only task here.
                Turn::Busy => continue,
                Turn::Idle(deadline) => deadline,
            };
            if let Some(d) = deadline {
                sleep.as_mut().reset(tokio::time::Instant::from_std(d));
            }
            let blocked = !self.io.unsent.is_empty();
            // The next turn reads until the device has nothing, so clearing the readiness
            // when it is reported loses nothing; a packet arriving later sets it again. A
            // device deleted under the driver reports only an error condition (EPOLLERR),
            // which the next read turns into the error that stops the driver.
            tokio::select! {
                r = self.io.fd.ready(Interest::READABLE | Interest::ERROR) => r?.clear_ready(),
                _ = self.shared.wake_driver.notified() => {}
                _ = &mut sleep, if deadline.is_some() => {}
                r = self.io.fd.writable(), if blocked => r?.clear_ready(),
            }
        }
    }

    /// Reads up to a batch of packets into `rx`; true if it stopped because the batch (or the
    /// arena) was full rather than because the device had nothing more.
    fn read_plain(&mut self) -> io::Result<bool> {
        let mtu = self.rx.arena.len() / self.batch;
        self.rx.packets.clear();
        let mut reads = 0;
        let mut bytes = 0;
        while reads < self.batch && bytes < TURN_BYTES {
            let start = self.rx.packets.len() * mtu;
            let buf = &mut self.rx.arena[start..start + mtu];
            match read_packet(&self.io.fd, buf)? {
                // A packet longer than the buffer (the MTU was raised under the driver) is cut
                // to the buffer by the read: drop it, counted, rather than hand the endpoint a
                // packet whose length field lies.
                Some(n) if n > buf.len() || (n == buf.len() && ip_length(buf) > n) => {
                    self.io.stats.truncated += 1
                }
                Some(n) => {
                    self.io.stats.reads += 1;
                    bytes += n;
                    self.rx.packets.push(RxPacket {
                        start,
                        len: n,
                        checked: false,
                    });
                }
                None => break,
            }
            reads += 1;
        }
        Ok(reads == self.batch || bytes >= TURN_BYTES)
    }

    /// Reads with offloads: each read is one packet or a super-packet split into segments,
    /// until a batch of segments is in or the arena cannot take another worst-case read.
    fn read_offload(&mut self) -> io::Result<bool> {
        use tun_rs::VIRTIO_NET_HDR_LEN;
        self.rx.packets.clear();
        let mut used = 0;
        loop {
            if self.rx.packets.len() >= self.batch
                || self.rx.arena.len() - used < offload::READ_RESERVE
            {
                return Ok(true);
            }
            let region = &mut self.rx.arena[used..];
            let limit = VIRTIO_NET_HDR_LEN + offload::MAX_PACKET + 1;
            let Some(n) = read_packet(&self.io.fd, &mut region[..limit])? else {
                return Ok(false);
            };
            self.io.stats.reads += 1;
            if n == limit {
                self.io.stats.truncated += 1;
                continue;
            }
            let first = self.rx.packets.len();
            match offload::unpack_read(region, n, used, &mut self.rx.packets, &mut self.rx.sizes) {
                Ok((taken, what)) => {
                    used += taken;
                    if let offload::Unpacked::Split(segments) = what {
                        self.io.stats.gso_reads += 1;
                        self.io.stats.gso_segments += segments as u64;
                    }
                }
                Err(offload::Malformed(why)) => {
                    if self.io.stats.offload_errors == 0 {
                        tracing::warn!("dropped a packet from the TUN device: {why}");
                    }
                    self.io.stats.offload_errors += 1;
                    continue;
                }
            }
            if self.verify_in_driver {
                // Packets the kernel did not vouch for: the core's own verification
                // (RFC 9293 §3.1, RFC 791 §3.1), here because the endpoint now skips it.
                let mut i = first;
                while i < self.rx.packets.len() {
                    let p = self.rx.packets[i];
                    let bytes = &self.rx.arena[p.start..p.start + p.len];
                    if !p.checked
                        && matches!(
                            squarepeg_tcp::wire::parse_packet(bytes, true),
                            Err(DropReason::BadIpChecksum | DropReason::BadTcpChecksum)
                        )
                    {
                        self.io.stats.bad_checksums += 1;
                        self.rx.packets.remove(i);
                    } else {
                        i += 1;
                    }
                }
            }
        }
    }

    /// One turn: read a batch, feed it to the endpoint, run due timers, send a batch.
    fn turn(&mut self) -> io::Result<Turn> {
        let io_ready = self.io.flush_unsent()?;
        let read_full = if self.offload {
            self.read_offload()?
        } else {
            self.read_plain()?
        };
        let received = self.rx.packets.len();
        for i in 0..received {
            let n = self.rx.packets[i].len;
            self.io.stats.packets_read += 1;
            self.io.stats.bytes_read += n as u64;
            if self.io.capture.is_some() {
                let (rx, io) = (&self.rx, &mut self.io);
                io.capture(rx.packet(i));
            }
        }

        let now = Instant::now();
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        if st.stop_requested {
            return Ok(Turn::Stop);
        }
        for i in 0..received {
            let packet = self.rx.packet(i);
            match &mut self.shim {
                Some(shim) => shim.inbound.offer(now, packet),
                None => {
                    let _ = st.endpoint.handle_packet(now, packet);
                }
            }
        }
        if let Some(shim) = &mut self.shim {
            while let Some(p) = shim.inbound.pop_due(now) {
                let _ = st.endpoint.handle_packet(now, &p);
                shim.inbound.recycle(p);
            }
        }
        if st.endpoint.poll_timeout().is_some_and(|t| t <= now) {
            st.endpoint.handle_timeout(now);
        }
        let mut polled = 0;
        let mut polled_bytes = 0;
        self.tx.count = 0;
        if io_ready {
            let headroom = self.tx.headroom;
            while polled < self.batch && polled_bytes < TURN_BYTES {
                let buf = self.tx.next_buf();
                let Some(n) = st.endpoint.poll_transmit(now, &mut buf[headroom..]) else {
                    break;
                };
                polled += 1;
                polled_bytes += n;
                match &mut self.shim {
                    Some(shim) => shim.outbound.offer(now, &buf[headroom..headroom + n]),
                    None => self.tx.commit(n),
                }
            }
        }
        st.dispatch(&mut self.wake);
        let timer = st.endpoint.poll_timeout();
        self.io.stats.turns += 1;
        if self.io.stats.turns.is_multiple_of(256) {
            self.io.stats.driver_cpu = thread_cpu_time();
        }
        st.stats.device = self.io.stats.clone();
        if self.io.capture_error.is_some() && st.stats.capture_error.is_none() {
            st.stats.capture_error = self.io.capture_error.clone();
        }
        if let Some(shim) = &self.shim {
            st.stats.inbound = Some(shim.inbound.stats());
            st.stats.outbound = Some(shim.outbound.stats());
        }
        drop(guard);
        for w in self.wake.drain(..) {
            w.wake();
        }

        let mut next = timer;
        if let Some(shim) = &mut self.shim {
            while let Some(p) = shim.outbound.pop_due(now) {
                self.tx.push(&p);
                shim.outbound.recycle(p);
            }
            next = match (next, shim.next_arrival()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        if self.offload {
            // The capture sees the segments as the endpoint made them, before GRO.
            for i in 0..self.tx.count {
                let (tx, io) = (&self.tx, &mut self.io);
                io.capture(tx.packet(i));
            }
            self.io.send_coalesced(&mut self.tx)?;
        } else {
            for i in 0..self.tx.count {
                let (tx, io) = (&self.tx, &mut self.io);
                io.send(tx.packet(i))?;
            }
        }
        if read_full || polled == self.batch || polled_bytes >= TURN_BYTES {
            Ok(Turn::Busy)
        } else {
            Ok(Turn::Idle(next))
        }
    }

    fn publish_stats(&mut self) {
        self.io.stats.driver_cpu = thread_cpu_time();
        let mut st = self.shared.lock();
        st.stats.device = self.io.stats.clone();
        st.stats.capture_error = self.io.capture_error.clone();
        if let Some(shim) = &self.shim {
            st.stats.inbound = Some(shim.inbound.stats());
            st.stats.outbound = Some(shim.outbound.stats());
        }
    }
}
