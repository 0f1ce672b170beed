//! The endpoint: demultiplexes packets to connections and listeners, answers packets that
//! belong to no connection (RFC 9293 §3.10.7.1), runs SYN cookies, and collects output, timers
//! and events.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use crate::config::{ConnectionConfig, EndpointConfig, SynCookies};
use crate::conn::{
    ClientFastOpen, CloseReason, ConnEvent, Connection, ConnectionStats, FastOpenNote,
    NewConnection, PeerSyn, Shared, State,
};
use crate::error::{DropReason, Error};
use crate::resume::{PathCache, SavedPath};
use crate::secret::Secret;
use crate::send_queue::{MessageReport, Padder, SendQueue, WriteTag};
use crate::seq::RcvSeq;
use crate::syncookie;
use crate::utcp::ReceivedSegment;
use crate::wire::{self, FastOpenCookie, OutHeader, OutOptions, Segment, TcpFlags, is_non_unicast};

/// Handle of a connection. Stays valid until the application closes or aborts it (and, for a
/// connection that closed by itself, until then too, so that its stats and errors can be read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionHandle {
    index: u32,
    generation: u32,
}

/// Handle of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerHandle(u32);

/// What the endpoint tells the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An active open completed (ESTABLISHED).
    Connected(ConnectionHandle),
    /// A passive open completed; `accept` on the listener returns it.
    Incoming(ListenerHandle),
    /// New in-order data can be read (edge-triggered: sent again only after `read` drained the
    /// buffer or returned `WouldBlock`).
    Readable(ConnectionHandle),
    /// Send-buffer space freed after a short or refused write: sent once at least a third of
    /// the send buffer is free, so that a writer is not woken for every few acknowledged bytes.
    Writable(ConnectionHandle),
    /// The peer sent FIN: after the buffered data, `read` returns 0.
    PeerFin(ConnectionHandle),
    /// The connection closed (includes resets, refusals and time-outs).
    Closed(ConnectionHandle, CloseReason),
}

/// Endpoint-wide counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointStats {
    drops: [u64; DropReason::ALL.len()],
    pub packets_received: u64,
    pub packets_sent: u64,
    pub resets_sent: u64,
    pub syn_cookies_sent: u64,
    pub syn_cookies_accepted: u64,
    pub connections_opened: u64,
    pub connections_closed: u64,
    pub replies_dropped: u64,
    /// TCP Fast Open (RFC 7413), both as client and as server.
    pub fast_open: FastOpenStats,
    /// Path states saved into the path cache, and taken by new connections (Careful Resume).
    pub path_states_saved: u64,
    pub path_states_used: u64,
    /// Memory budget ([`EndpointConfig::memory`], [`crate::mem`]): payload bytes all
    /// connections hold now, and the most they held at once.
    pub memory_in_use: usize,
    pub memory_peak: usize,
    /// Received segments trimmed or dropped, out-of-order pruning runs, and uTCP copies of
    /// received data not queued, all for the budget (each counted once per segment).
    pub memory_pressure_drops: u64,
    /// Writes shortened or refused for the budget (the send buffer itself had room).
    pub memory_limited_writes: u64,
    /// Times the total rose above the pressure threshold.
    pub memory_pressure_events: u64,
    /// ICMP "packet too big" errors believed (each lowered a connection's send MSS or found
    /// it low enough already); those not believed are dropped as
    /// [`DropReason::IcmpIgnored`].
    pub packet_too_big_believed: u64,
}

/// TCP Fast Open counters (RFC 7413) of an endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FastOpenStats {
    // Client.
    /// SYNs sent with a cookie request (no cookie cached).
    pub cookie_requests_sent: u64,
    /// Cookies received in SYN-ACKs (and cached).
    pub cookies_received: u64,
    /// SYNs sent with a cookie (with or without data).
    pub syns_with_cookie: u64,
    /// SYNs sent with a cookie and data, and the data bytes they carried.
    pub syn_data_sent: u64,
    pub syn_data_bytes: u64,
    /// SYN-ACKs that acknowledged all the SYN's data.
    pub syn_data_acked: u64,
    /// SYN-ACKs that acknowledged only the SYN (data sent again after the handshake).
    pub syn_data_not_acked: u64,
    /// SYNs with data that timed out (retransmitted without data).
    pub syn_data_timeouts: u64,
    /// Cached cookies dropped because the server ignored them (RFC 7413 §4.1.3).
    pub cookies_forgotten: u64,
    /// Servers marked as Fast Open blackholes (SYN with data lost, SYN without it answered).
    pub blackholes_detected: u64,
    /// Fast Open connects sent as ordinary ones because the server is marked a blackhole.
    pub blackholed_connects: u64,
    // Server.
    /// Cookie requests received (empty option).
    pub cookie_requests_received: u64,
    /// Cookies sent in SYN-ACKs (answers to requests and to invalid cookies).
    pub cookies_sent: u64,
    /// SYNs with a valid cookie (with or without data).
    pub cookies_accepted: u64,
    /// SYNs with a valid cookie whose data was accepted before the handshake.
    pub syn_data_accepted: u64,
    /// SYNs with an invalid cookie (data dropped).
    pub cookies_refused: u64,
    /// Of `cookies_accepted`, those made with the previous key period's key (answered with a
    /// cookie of the current one).
    pub cookies_of_previous_key: u64,
    /// SYNs with a valid cookie and data handled as ordinary SYNs because the listener had
    /// `fast_open_max_pending` Fast Open connections in the handshake (RFC 7413 §5.1).
    pub pending_overflows: u64,
}

/// A server's entry in the client's Fast Open cache, for export and import (so that a tool
/// can keep cookies across runs). Text form (`Display` / `FromStr`): `<ip> <cookie hex>
/// [<mss>]`, e.g. `192.0.2.1 0123456789abcdef 1460`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastOpenEntry {
    /// The server's address.
    pub server: IpAddr,
    /// Its cookie (never a request).
    pub cookie: FastOpenCookie,
    /// The MSS its SYN-ACK announced, which bounds the data on a SYN.
    pub mss: Option<u16>,
}

impl std::fmt::Display for FastOpenEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ", self.server)?;
        for b in self.cookie.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        if let Some(m) = self.mss {
            write!(f, " {m}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for FastOpenEntry {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = Error::InvalidAddress("not a Fast Open cache entry: <ip> <cookie hex> [<mss>]");
        let mut words = s.split_whitespace();
        let server: IpAddr = words.next().and_then(|w| w.parse().ok()).ok_or(bad)?;
        let hex = words.next().ok_or(bad)?;
        if hex.len() % 2 != 0 || !hex.is_ascii() {
            return Err(bad);
        }
        let bytes = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad)?;
        let cookie = FastOpenCookie::new(&bytes)
            .filter(|c| !c.is_request())
            .ok_or(bad)?;
        let mss = match words.next() {
            Some(w) => Some(w.parse().map_err(|_| bad)?),
            None => None,
        };
        if words.next().is_some() {
            return Err(bad);
        }
        Ok(FastOpenEntry {
            server,
            cookie,
            mss,
        })
    }
}

/// What the client remembers per server (RFC 7413 §4.1.3): the cookie and MSS, and until
/// when Fast Open is off to it (blackhole).
#[derive(Clone, Copy, Debug, Default)]
struct FastOpenCacheEntry {
    cookie: Option<FastOpenCookie>,
    mss: Option<u16>,
    blackholed_until: Option<Instant>,
    /// Use counter, for least-recently-used eviction.
    used: u64,
}

/// The client's Fast Open cache, bounded by `EndpointConfig::fast_open_cache_size` (least
/// recently used out first: the scan is linear, but only on inserting into a full cache).
#[derive(Debug, Default)]
struct FastOpenCache {
    entries: HashMap<IpAddr, FastOpenCacheEntry>,
    tick: u64,
}

impl FastOpenCache {
    fn get(&mut self, ip: &IpAddr) -> Option<FastOpenCacheEntry> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(ip).map(|e| {
            e.used = tick;
            *e
        })
    }

    fn update(&mut self, ip: IpAddr, capacity: usize, f: impl FnOnce(&mut FastOpenCacheEntry)) {
        if capacity == 0 {
            return;
        }
        if !self.entries.contains_key(&ip)
            && self.entries.len() >= capacity
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k)
        {
            self.entries.remove(&oldest);
        }
        self.tick += 1;
        let e = self.entries.entry(ip).or_default();
        e.used = self.tick;
        f(e);
    }
}

impl EndpointStats {
    /// Packets dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }
    /// Packets dropped for any reason.
    pub fn dropped_total(&self) -> u64 {
        self.drops.iter().sum()
    }
}

#[derive(Debug)]
struct Listener {
    addr: SocketAddr,
    backlog: usize,
    config: ConnectionConfig,
    accept_queue: VecDeque<ConnectionHandle>,
    half_open: usize,
    /// Fast Open connections (SYN data accepted) still in the handshake (RFC 7413 §5.1).
    fo_pending: usize,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    conn: Option<Box<Connection>>,
    /// The application holds the handle (active opens, accepted passive opens).
    owned: bool,
    /// Listener a passive open belongs to until accepted.
    listener: Option<ListenerHandle>,
    /// Counted in the listener's and endpoint's half-open totals.
    half_open: bool,
    in_ready: bool,
    timer: Option<Instant>,
    in_table: bool,
    /// A Fast Open passive open put in the accept queue at the SYN (not at ESTABLISHED), and
    /// counted in its listener's `fo_pending` while half-open.
    early_queued: bool,
    /// The connection's path state went into the path cache (once, at its end).
    path_saved: bool,
}

type Tuple = (SocketAddr, SocketAddr);

/// A sans-IO TCP endpoint: fed whole IP packets and the time, polled for packets, timers and
/// events.
#[derive(Debug)]
pub struct Endpoint {
    config: EndpointConfig,
    secret: Secret,
    shared: Shared,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    half_open: usize,
    table: HashMap<Tuple, u32>,
    /// The last tuple found in `table`: a bulk transfer's segments all hit it, and comparing
    /// two tuples costs less than SipHashing one (3 % of the driver thread receiving at MTU
    /// 1500). Cleared whenever `table` changes.
    last_lookup: Option<(Tuple, u32)>,
    listeners: Vec<Option<Listener>>,
    listener_by_addr: HashMap<SocketAddr, ListenerHandle>,
    events: VecDeque<Event>,
    ready: VecDeque<u32>,
    timers: BTreeSet<(Instant, u32)>,
    replies: VecDeque<Vec<u8>>,
    stats: EndpointStats,
    ephemeral_next: u16,
    fo_cache: FastOpenCache,
    /// Path state per remote host (RFC 9040 temporal sharing, RFC 9959 Careful Resume).
    path_cache: PathCache,
}

const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;

/// Smallest buffer `poll_transmit` can always write into: an IPv6 header plus a TCP header
/// with 40 bytes of options.
pub const MIN_TRANSMIT_BUFFER: usize = 40 + 60;

impl Endpoint {
    /// Creates an endpoint; `now` becomes the epoch of its clocks (ISN timer, timestamps).
    pub fn new(config: EndpointConfig, now: Instant) -> Endpoint {
        let path_cache = PathCache::new(config.path_cache);
        Endpoint {
            secret: Secret::new(config.secret),
            shared: Shared {
                epoch: now,
                ttl: config.ttl,
                mem: crate::mem::MemPool::new(config.memory),
            },
            config,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            half_open: 0,
            table: HashMap::new(),
            last_lookup: None,
            listeners: Vec::new(),
            listener_by_addr: HashMap::new(),
            events: VecDeque::new(),
            ready: VecDeque::new(),
            timers: BTreeSet::new(),
            replies: VecDeque::new(),
            stats: EndpointStats::default(),
            ephemeral_next: 0,
            fo_cache: FastOpenCache::default(),
            path_cache,
        }
    }

    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// The path state kept per remote host (RFC 9040 §4 temporal sharing): saved when a
    /// connection ends, taken by the next connection to the same host that has
    /// [`ConnectionConfig::careful_resume`] on.
    pub fn path_cache(&self) -> &PathCache {
        &self.path_cache
    }

    pub fn path_cache_mut(&mut self) -> &mut PathCache {
        &mut self.path_cache
    }

    /// The unexpired path state, with ages, for a tool to keep across processes.
    pub fn export_path_state(&self, now: Instant) -> Vec<SavedPath> {
        self.path_cache.export(now)
    }

    /// Loads path state exported earlier ([`Endpoint::export_path_state`]).
    pub fn import_path_state(&mut self, now: Instant, saved: &[SavedPath]) {
        self.path_cache.import(now, saved);
    }

    /// Saves what connection `h` has observed of its path now, without waiting for its end
    /// (a long-lived connection's periodic update). Returns whether anything was saved.
    pub fn save_path_state(&mut self, now: Instant, h: ConnectionHandle) -> bool {
        let Some(c) = self.connection(h) else {
            return false;
        };
        let remote = c.remote_addr().ip();
        match c.path_observation(now) {
            Some(record) => {
                self.path_cache.insert(remote, record);
                self.stats.path_states_saved += 1;
                true
            }
            None => false,
        }
    }

    /// Number of connections held (any state, including TIME-WAIT and half-open).
    pub fn connection_count(&self) -> usize {
        self.live
    }

    /// Checks the endpoint's bookkeeping and every connection's internal consistency, and
    /// panics with a description if anything is off: connection and half-open counts (within
    /// [`EndpointConfig::max_connections`] and [`EndpointConfig::max_half_open`]), accept
    /// queues within their backlogs, the demultiplexing table and timers pointing at live
    /// connections, the reply queue within its bound, per connection its receive buffer,
    /// send queue and scoreboard, and the memory account: every connection's charge up to
    /// date and the total within the bound of [`crate::mem`] (the limit plus the floors
    /// held). Read-only and slow (it walks everything): for fuzz targets
    /// and tests, not for the data path.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let live = self.slots.iter().filter(|s| s.conn.is_some()).count();
        assert_eq!(live, self.live, "live connections miscounted");
        assert!(
            self.live <= self.config.max_connections,
            "{} connections, limit {}",
            self.live,
            self.config.max_connections
        );
        let half_open = self.slots.iter().filter(|s| s.half_open).count();
        assert_eq!(
            half_open, self.half_open,
            "half-open connections miscounted"
        );
        assert!(
            self.half_open <= self.config.max_half_open,
            "{} half-open connections, limit {}",
            self.half_open,
            self.config.max_half_open
        );
        for (i, l) in self.listeners.iter().enumerate() {
            let Some(l) = l else { continue };
            assert!(
                l.accept_queue.len() <= l.backlog,
                "accept queue of {} beyond the backlog {}",
                l.accept_queue.len(),
                l.backlog
            );
            let half_open = self
                .slots
                .iter()
                .filter(|s| s.half_open && s.listener == Some(ListenerHandle(i as u32)))
                .count();
            assert_eq!(half_open, l.half_open, "listener half-open miscounted");
            assert!(
                l.half_open <= l.backlog,
                "listener half-open beyond the backlog"
            );
        }
        for (tuple, &idx) in &self.table {
            let slot = &self.slots[idx as usize];
            let conn = slot.conn.as_ref().expect("table entry for a free slot");
            assert!(slot.in_table, "table entry for a slot not in the table");
            assert_eq!(
                (conn.local_addr(), conn.remote_addr()),
                *tuple,
                "table entry for another tuple"
            );
        }
        for &(t, idx) in &self.timers {
            assert_eq!(self.slots[idx as usize].timer, Some(t), "stray timer");
        }
        assert!(
            self.replies.len() <= self.config.max_pending_replies,
            "reply queue beyond its bound"
        );
        for slot in &self.slots {
            if let Some(c) = &slot.conn {
                c.check_invariants();
            }
        }
        // The memory budget (crate::mem): every charge up to date, and the bound.
        let budget = self.shared.mem.budget();
        let floor = budget.per_connection_floor;
        let (mut held, mut floors) = (0usize, 0usize);
        for c in self.slots.iter().filter_map(|s| s.conn.as_ref()) {
            let (send, recv) = c.memory_held();
            assert_eq!(
                c.memory_charged(),
                send + recv,
                "memory charge not up to date"
            );
            held += send + recv;
            floors += send.min(floor) + recv.min(floor);
        }
        let in_use = self.shared.mem.snapshot().in_use;
        assert_eq!(in_use, held, "memory in use miscounted");
        assert!(
            in_use <= budget.limit.saturating_add(floors),
            "memory in use {in_use} beyond the limit {} plus the floors held {floors}",
            budget.limit
        );
    }

    // ------------------------------------------------------------ opening

    /// Active open (RFC 9293 §3.10.1). A local port of 0 picks an ephemeral port.
    pub fn connect(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        config: ConnectionConfig,
    ) -> Result<ConnectionHandle, Error> {
        if local.is_ipv4() != remote.is_ipv4() {
            return Err(Error::InvalidAddress("address families differ"));
        }
        if is_non_unicast(&local.ip()) || is_non_unicast(&remote.ip()) {
            return Err(Error::InvalidAddress("not a unicast address"));
        }
        if remote.port() == 0 {
            return Err(Error::InvalidAddress("remote port 0"));
        }
        if self.live >= self.config.max_connections {
            return Err(Error::TooManyConnections);
        }
        let local = if local.port() == 0 {
            self.pick_ephemeral(local, remote)?
        } else {
            local
        };
        if self.table.contains_key(&(local, remote)) {
            return Err(Error::AddressInUse);
        }
        let fast_open = config.fast_open;
        let params = self.new_conn_params(now, local, remote, config);
        let conn = if fast_open {
            let entry = self.fo_cache.get(&remote.ip()).unwrap_or_default();
            if entry.blackholed_until.is_some_and(|t| t > now) {
                self.stats.fast_open.blackholed_connects += 1;
                Connection::new_active(params)
            } else {
                Connection::new_active_fast_open(
                    params,
                    ClientFastOpen::new(entry.cookie, entry.mss),
                )
            }
        } else {
            Connection::new_active(params)
        };
        let handle = self.insert(conn, true, None, false);
        Ok(handle)
    }

    /// The Fast Open cache's cookies (RFC 7413 §4.1.3), least recently used first, for a tool
    /// to keep across runs ([`FastOpenEntry`] has a text form). Blackhole marks are not
    /// exported: they are about the path of the moment.
    pub fn fast_open_cache(&self) -> Vec<FastOpenEntry> {
        let mut v: Vec<_> = self
            .fo_cache
            .entries
            .iter()
            .filter_map(|(ip, e)| {
                Some((
                    e.used,
                    FastOpenEntry {
                        server: *ip,
                        cookie: e.cookie?,
                        mss: e.mss,
                    },
                ))
            })
            .collect();
        v.sort_by_key(|(used, _)| *used);
        v.into_iter().map(|(_, e)| e).collect()
    }

    /// Adds cookies to the Fast Open cache (in order, so the last is the most recently
    /// used), replacing what it held for those servers; bounded like the cache.
    pub fn import_fast_open_cache(&mut self, entries: impl IntoIterator<Item = FastOpenEntry>) {
        let cap = self.config.fast_open_cache_size;
        for entry in entries {
            if entry.cookie.is_request() {
                continue;
            }
            self.fo_cache.update(entry.server, cap, |e| {
                e.cookie = Some(entry.cookie);
                e.mss = entry.mss;
            });
        }
    }

    /// Whether Fast Open to `server` is off at `now` because a SYN with data to it was lost
    /// while the same SYN without data got through (RFC 7413 §4.1.3).
    pub fn fast_open_blackholed(&self, server: IpAddr, now: Instant) -> bool {
        self.fo_cache
            .entries
            .get(&server)
            .and_then(|e| e.blackholed_until)
            .is_some_and(|t| t > now)
    }

    fn pick_ephemeral(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Result<SocketAddr, Error> {
        // RFC 6056 §3.3.3 (algorithm 3): offset from a keyed hash, then probe sequentially.
        let span = (*EPHEMERAL.end() - *EPHEMERAL.start()) as u32 + 1;
        let offset = self.secret.ip_id(&local, &remote) % span;
        for i in 0..span {
            let port =
                *EPHEMERAL.start() + ((offset + self.ephemeral_next as u32 + i) % span) as u16;
            let candidate = SocketAddr::new(local.ip(), port);
            if !self.table.contains_key(&(candidate, remote)) {
                self.ephemeral_next = self.ephemeral_next.wrapping_add(i as u16 + 1);
                return Ok(candidate);
            }
        }
        Err(Error::AddressInUse)
    }

    /// Passive open: accept connections to `addr` (an unspecified IP listens on all addresses).
    /// `backlog` bounds both half-open connections and connections waiting in `accept`.
    pub fn listen(
        &mut self,
        addr: SocketAddr,
        backlog: usize,
        config: ConnectionConfig,
    ) -> Result<ListenerHandle, Error> {
        if addr.port() == 0 {
            return Err(Error::InvalidAddress("listen port 0"));
        }
        if self.listener_by_addr.contains_key(&addr) {
            return Err(Error::AddressInUse);
        }
        let listener = Listener {
            addr,
            backlog: backlog.max(1),
            config,
            accept_queue: VecDeque::new(),
            half_open: 0,
            fo_pending: 0,
        };
        let idx = match self.listeners.iter().position(|l| l.is_none()) {
            Some(i) => {
                self.listeners[i] = Some(listener);
                i
            }
            None => {
                self.listeners.push(Some(listener));
                self.listeners.len() - 1
            }
        };
        let handle = ListenerHandle(idx as u32);
        self.listener_by_addr.insert(addr, handle);
        Ok(handle)
    }

    /// Stops listening; connections not yet accepted are reset.
    pub fn unlisten(&mut self, now: Instant, listener: ListenerHandle) -> Result<(), Error> {
        let l = self
            .listeners
            .get_mut(listener.0 as usize)
            .and_then(|l| l.take())
            .ok_or(Error::UnknownListener)?;
        self.listener_by_addr.remove(&l.addr);
        for (idx, slot) in self.slots.iter_mut().enumerate() {
            if slot.listener == Some(listener) && !slot.owned {
                if let Some(c) = slot.conn.as_mut() {
                    c.abort(now);
                }
                slot.listener = None;
                if !self.ready.contains(&(idx as u32)) {
                    slot.in_ready = true;
                    self.ready.push_back(idx as u32);
                }
            } else if slot.listener == Some(listener) {
                // A Fast Open connection accepted before its handshake completed.
                slot.listener = None;
            }
        }
        Ok(())
    }

    /// Takes the next established connection from a listener's accept queue.
    pub fn accept(&mut self, listener: ListenerHandle) -> Option<ConnectionHandle> {
        let l = self.listeners.get_mut(listener.0 as usize)?.as_mut()?;
        while let Some(h) = l.accept_queue.pop_front() {
            let Some(slot) = self.slots.get_mut(h.index as usize) else {
                continue;
            };
            if slot.generation != h.generation || slot.conn.is_none() {
                continue;
            }
            slot.owned = true;
            // A Fast Open connection still in the handshake stays counted with its listener
            // until it completes (`after_op`).
            if !slot.half_open {
                slot.listener = None;
            }
            // Report what happened before the application could see the connection.
            if let Some(c) = slot.conn.as_ref() {
                if c.readable() > 0 {
                    self.events.push_back(Event::Readable(h));
                }
                if c.peer_fin() {
                    self.events.push_back(Event::PeerFin(h));
                }
                if let Some(r) = c.close_reason() {
                    self.events.push_back(Event::Closed(h, r));
                }
            }
            return Some(h);
        }
        None
    }

    fn new_conn_params(
        &self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        cfg: ConnectionConfig,
    ) -> NewConnection {
        let since = now.saturating_duration_since(self.shared.epoch);
        NewConnection {
            local,
            remote,
            cfg,
            shared: self.shared.clone(),
            iss: self.secret.isn(&local, &remote, since),
            ts_offset: self.secret.ts_offset(&local, &remote),
            ip_id: self.secret.ip_id(&local, &remote),
            now,
        }
    }

    fn insert(
        &mut self,
        conn: Connection,
        owned: bool,
        listener: Option<ListenerHandle>,
        half_open: bool,
    ) -> ConnectionHandle {
        let tuple = (conn.local_addr(), conn.remote_addr());
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    conn: None,
                    owned: false,
                    listener: None,
                    half_open: false,
                    in_ready: false,
                    timer: None,
                    in_table: false,
                    early_queued: false,
                    path_saved: false,
                });
                (self.slots.len() - 1) as u32
            }
        };
        self.slots[index as usize].path_saved = false;
        let mut conn = conn;
        // RFC 9040 temporal sharing / RFC 9959: a connection to a host we know starts from its
        // saved state. The entry is taken, so no two connections jump on the same state.
        if conn.careful_resume_enabled()
            && let Some(saved) = self
                .path_cache
                .take(conn.remote_addr().ip(), conn.clock_now())
        {
            self.stats.path_states_used += 1;
            conn.start_resume(saved);
        }
        let slot = &mut self.slots[index as usize];
        slot.conn = Some(Box::new(conn));
        slot.owned = owned;
        slot.listener = listener;
        slot.half_open = half_open;
        slot.in_ready = false;
        slot.timer = None;
        slot.in_table = true;
        slot.early_queued = false;
        let handle = ConnectionHandle {
            index,
            generation: slot.generation,
        };
        self.table.insert(tuple, index);
        self.last_lookup = None;
        self.live += 1;
        self.stats.connections_opened += 1;
        if half_open {
            self.half_open += 1;
            if let Some(l) = listener.and_then(|l| self.listener_mut(l)) {
                l.half_open += 1;
            }
        }
        self.mark_ready(index);
        self.after_op(index);
        handle
    }

    fn listener_mut(&mut self, l: ListenerHandle) -> Option<&mut Listener> {
        self.listeners.get_mut(l.0 as usize)?.as_mut()
    }

    // ------------------------------------------------------------ application side

    fn slot_index(&self, h: ConnectionHandle) -> Result<usize, Error> {
        match self.slots.get(h.index as usize) {
            Some(s) if s.generation == h.generation && s.conn.is_some() && s.owned => {
                Ok(h.index as usize)
            }
            _ => Err(Error::UnknownConnection),
        }
    }

    fn with_conn<T>(
        &mut self,
        h: ConnectionHandle,
        f: impl FnOnce(&mut Connection) -> T,
    ) -> Result<T, Error> {
        let idx = self.slot_index(h)?;
        let conn = self.slots[idx]
            .conn
            .as_mut()
            .ok_or(Error::UnknownConnection)?;
        let r = f(conn);
        self.mark_ready(idx as u32);
        self.after_op(idx as u32);
        Ok(r)
    }

    /// The connection behind a handle, for inspection (state, stats, offsets, options).
    pub fn connection(&self, h: ConnectionHandle) -> Option<&Connection> {
        let idx = self.slot_index(h).ok()?;
        self.slots[idx].conn.as_deref()
    }

    /// Per-connection statistics.
    pub fn stats_of(&self, h: ConnectionHandle) -> Result<ConnectionStats, Error> {
        self.connection(h)
            .map(|c| c.stats())
            .ok_or(Error::UnknownConnection)
    }

    /// Drains the connection's trace log (empty unless
    /// [`ConnectionConfig::trace_capacity`] is set; see [`crate::trace`]).
    pub fn take_trace(
        &mut self,
        h: ConnectionHandle,
    ) -> Result<Vec<crate::trace::TraceRecord>, Error> {
        let idx = self.slot_index(h)?;
        let conn = self.slots[idx]
            .conn
            .as_mut()
            .ok_or(Error::UnknownConnection)?;
        Ok(conn.take_trace())
    }

    /// Reads in-order data. `Ok(0)` means end of stream (peer FIN); `Err(WouldBlock)` means no
    /// data yet.
    pub fn read(&mut self, h: ConnectionHandle, buf: &mut [u8]) -> Result<usize, Error> {
        self.with_conn(h, |c| c.read(buf))?
    }

    /// Queues data for sending; returns how much fit in the send buffer (`WouldBlock` if none).
    pub fn write(&mut self, h: ConnectionHandle, data: &[u8]) -> Result<usize, Error> {
        self.with_conn(h, |c| c.write(data, WriteTag::default()))?
    }

    /// Queues a tagged write at the tail (standard order); the tag is kept with the write.
    pub fn write_tagged(
        &mut self,
        h: ConnectionHandle,
        data: &[u8],
        tag: WriteTag,
    ) -> Result<usize, Error> {
        self.with_conn(h, |c| c.write(data, tag))?
    }

    /// Queues a whole message (all or nothing): ahead of pending writes of lower priority but
    /// never ahead of or inside one already partly sent (Minion §4.2), squashing pending
    /// messages with the same squash key, dropped if its deadline passes before it is sent,
    /// never packed into a segment with other writes, and replaceable in a retransmission
    /// once expired (Hollywood §4.2). See [`SendQueue`] and [`MessageReport`]; `WouldBlock`
    /// when the send buffer has no room for it.
    pub fn write_message(
        &mut self,
        h: ConnectionHandle,
        data: &[u8],
        tag: WriteTag,
    ) -> Result<(), Error> {
        self.with_conn(h, |c| c.write_message(data, tag))?
    }

    /// The next report on a message written with a message id.
    pub fn poll_report(&mut self, h: ConnectionHandle) -> Result<Option<MessageReport>, Error> {
        let idx = self.slot_index(h)?;
        let conn = self.slots[idx]
            .conn
            .as_mut()
            .ok_or(Error::UnknownConnection)?;
        Ok(conn.poll_report())
    }

    /// Switches on unordered receive (Minion §4.1 `SO_UNORDERED`, see [`crate::utcp`]): from
    /// now on every accepted segment is handed over at once with its stream offset; data held
    /// so far is handed over first. It stays on.
    pub fn enable_unordered_receive(&mut self, h: ConnectionHandle) -> Result<(), Error> {
        self.with_conn(h, |c| c.enable_unordered())?
    }

    /// Replaces the connection's padder (inconsistent retransmissions, see [`Padder`]):
    /// a layer above with per-connection state (TLS keys) installs its own once the
    /// connection exists; `None` switches replacements off.
    pub fn set_padder(&mut self, h: ConnectionHandle, padder: Option<Padder>) -> Result<(), Error> {
        self.with_conn(h, |c| c.set_padder(padder))
    }

    /// Reads the next received segment, or as much of it as fits, into `buf` (unordered
    /// receive only): its stream offset and length. A length of 0 is the end of the stream
    /// (the peer's FIN, everything read); `WouldBlock` means nothing is waiting.
    pub fn read_segment(
        &mut self,
        h: ConnectionHandle,
        buf: &mut [u8],
    ) -> Result<ReceivedSegment, Error> {
        self.with_conn(h, |c| c.read_segment(buf))?
    }

    /// Direct access to the send queue (inspect writes, squash) for upper layers.
    pub fn send_queue(
        &mut self,
        h: ConnectionHandle,
        f: impl FnOnce(&mut SendQueue),
    ) -> Result<(), Error> {
        self.with_conn(h, |c| f(c.queue_mut()))
    }

    /// Plugs in a congestion controller of the caller's own (the configured algorithms are
    /// [`crate::cc::Cubic`] and [`crate::cc::NewReno`]).
    pub fn set_congestion_control(
        &mut self,
        h: ConnectionHandle,
        cc: Box<dyn crate::cc::CongestionControl>,
    ) -> Result<(), Error> {
        self.with_conn(h, |c| c.set_congestion_control(cc))
    }

    /// Half-close: send FIN after the queued data.
    pub fn shutdown(&mut self, now: Instant, h: ConnectionHandle) -> Result<(), Error> {
        self.with_conn(h, |c| c.shutdown(now))?
    }

    /// Closes the connection and releases the handle. The connection finishes in the
    /// background (FIN exchange, TIME-WAIT); with unread data it is reset instead.
    pub fn close(&mut self, now: Instant, h: ConnectionHandle) -> Result<(), Error> {
        let idx = self.slot_index(h)?;
        if let Some(c) = self.slots[idx].conn.as_mut() {
            c.close(now);
        }
        self.slots[idx].owned = false;
        self.mark_ready(idx as u32);
        self.after_op(idx as u32);
        Ok(())
    }

    /// Aborts the connection with a RST and releases the handle.
    pub fn abort(&mut self, now: Instant, h: ConnectionHandle) -> Result<(), Error> {
        let idx = self.slot_index(h)?;
        if let Some(c) = self.slots[idx].conn.as_mut() {
            c.close(now);
            c.abort(now);
        }
        self.slots[idx].owned = false;
        self.mark_ready(idx as u32);
        self.after_op(idx as u32);
        Ok(())
    }

    /// Next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ------------------------------------------------------------ time

    /// Earliest time `handle_timeout` must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(t, _)| t)
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(t, idx)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            if let Some(slot) = self.slots.get_mut(idx as usize) {
                slot.timer = None;
                if let Some(c) = slot.conn.as_mut() {
                    c.handle_timeout(now);
                }
            }
            self.mark_ready(idx);
            self.after_op(idx);
        }
    }

    // ------------------------------------------------------------ output

    /// Writes the next packet to send into `buf` and returns its length. `buf` should hold the
    /// largest packet (the MTU); data segments shrink to fit a smaller buffer, but it must hold
    /// at least [`MIN_TRANSMIT_BUFFER`] bytes (headers with the largest options) for control
    /// segments to go out.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        while let Some(p) = self.replies.pop_front() {
            if p.len() <= buf.len() {
                buf[..p.len()].copy_from_slice(&p);
                self.stats.packets_sent += 1;
                return Some(p.len());
            }
            self.stats.replies_dropped += 1;
        }
        while let Some(idx) = self.ready.pop_front() {
            let Some(slot) = self.slots.get_mut(idx as usize) else {
                continue;
            };
            let Some(conn) = slot.conn.as_mut() else {
                slot.in_ready = false;
                continue;
            };
            let was_rst = conn.has_pending_rst();
            match conn.poll_transmit(now, buf) {
                Some(n) => {
                    // Round robin: the connection goes to the back of the queue.
                    self.ready.push_back(idx);
                    self.stats.packets_sent += 1;
                    if was_rst {
                        self.stats.resets_sent += 1;
                    }
                    self.after_op(idx);
                    return Some(n);
                }
                None => {
                    slot.in_ready = false;
                    self.after_op(idx);
                }
            }
        }
        None
    }

    /// Convenience for tests and simple drivers: the next packet in a new vector.
    pub fn poll_transmit_vec(&mut self, now: Instant) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 65535];
        let n = self.poll_transmit(now, &mut buf)?;
        buf.truncate(n);
        Some(buf)
    }

    fn mark_ready(&mut self, idx: u32) {
        if let Some(slot) = self.slots.get_mut(idx as usize)
            && !slot.in_ready
            && slot.conn.is_some()
        {
            slot.in_ready = true;
            self.ready.push_back(idx);
        }
    }

    /// Housekeeping after anything touched a connection: events, accept queue, timers, release.
    fn after_op(&mut self, idx: u32) {
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return;
        };
        let Some(conn) = slot.conn.as_mut() else {
            return;
        };
        conn.sync_memory();
        let handle = ConnectionHandle {
            index: idx,
            generation: slot.generation,
        };
        let mut established_passive = false;
        let visible = slot.owned;
        let passive = conn.is_passive();
        let remote_ip = conn.remote_addr().ip();
        let clock = conn.clock_now();
        let notes: Vec<FastOpenNote> = conn.take_fast_open_notes().collect();
        for ev in conn.take_events() {
            match ev {
                ConnEvent::Established if !passive => {
                    self.events.push_back(Event::Connected(handle))
                }
                ConnEvent::Established => established_passive = true,
                _ if !visible => {}
                ConnEvent::Readable => self.events.push_back(Event::Readable(handle)),
                ConnEvent::Writable => self.events.push_back(Event::Writable(handle)),
                ConnEvent::PeerFin => self.events.push_back(Event::PeerFin(handle)),
                ConnEvent::Closed(r) => self.events.push_back(Event::Closed(handle, r)),
            }
        }
        let state = conn.state();
        let closed = state.is_closed();
        // The connection's end (TIME-WAIT, or CLOSED from LAST-ACK, a reset or a timeout):
        // what it observed of the path goes into the cache (RFC 9040 §4).
        if (closed || state == State::TimeWait) && !slot.path_saved {
            slot.path_saved = true;
            if let Some(record) = conn.path_observation(conn.clock_now()) {
                self.path_cache.insert(conn.remote_addr().ip(), record);
                self.stats.path_states_saved += 1;
            }
        }
        let rst_pending = conn.has_pending_rst();
        let timeout = if closed { None } else { conn.next_timeout() };
        let remove_tuple = closed && slot.in_table;
        let tuple = (conn.local_addr(), conn.remote_addr());
        if slot.timer != timeout {
            if let Some(t) = slot.timer {
                self.timers.remove(&(t, idx));
            }
            if let Some(t) = timeout {
                self.timers.insert((t, idx));
            }
            slot.timer = timeout;
        }
        // Half-open accounting ends at ESTABLISHED or CLOSED.
        if slot.half_open && (established_passive || closed || state != State::SynReceived) {
            slot.half_open = false;
            self.half_open -= 1;
            if let Some(l) = slot.listener
                && let Some(Some(listener)) = self.listeners.get_mut(l.0 as usize)
            {
                listener.half_open = listener.half_open.saturating_sub(1);
                if slot.early_queued {
                    listener.fo_pending = listener.fo_pending.saturating_sub(1);
                }
            }
            if slot.early_queued && slot.owned {
                // Accepted during the handshake: the listener is done with it.
                slot.listener = None;
            }
        }
        if established_passive && slot.early_queued {
            // Already in the accept queue (or accepted) since its SYN.
            established_passive = false;
        }
        if !notes.is_empty() {
            self.fast_open_notes(remote_ip, clock, &notes);
        }
        let slot = &mut self.slots[idx as usize];
        if established_passive {
            let listener = slot.listener;
            let queued = listener
                .and_then(|l| self.listeners.get_mut(l.0 as usize))
                .and_then(|l| l.as_mut())
                .filter(|l| l.accept_queue.len() < l.backlog);
            match queued {
                Some(l) => {
                    l.accept_queue.push_back(handle);
                    self.events
                        .push_back(Event::Incoming(ListenerHandle(listener.map_or(0, |l| l.0))));
                }
                None => {
                    // Accept queue overflow (or listener gone): reset, like Linux with
                    // tcp_abort_on_overflow.
                    if let Some(c) = self.slots[idx as usize].conn.as_mut() {
                        c.abort(self.shared.epoch);
                    }
                    self.mark_ready(idx);
                }
            }
        }
        let slot = &mut self.slots[idx as usize];
        if remove_tuple {
            slot.in_table = false;
            if self.table.get(&tuple) == Some(&idx) {
                self.table.remove(&tuple);
                self.last_lookup = None;
            }
        }
        // Free the slot once the connection is closed, its last packet sent, and nobody holds
        // the handle. A passive connection not yet accepted is dropped from its accept queue.
        let closed_now = slot.conn.as_ref().is_some_and(|c| c.state().is_closed());
        if closed_now && !rst_pending && !slot.owned {
            let has_rst = slot.conn.as_ref().is_some_and(|c| c.has_pending_rst());
            if !has_rst {
                if let Some(l) = slot.listener.take()
                    && let Some(Some(listener)) = self.listeners.get_mut(l.0 as usize)
                {
                    listener.accept_queue.retain(|h| h.index != idx);
                }
                if let Some(t) = slot.timer.take() {
                    self.timers.remove(&(t, idx));
                }
                slot.conn = None; // returns its memory charge
                slot.generation = slot.generation.wrapping_add(1);
                slot.in_ready = false;
                self.free.push(idx);
                self.live -= 1;
                self.stats.connections_closed += 1;
            }
        }
        self.refresh_memory_stats();
    }

    fn refresh_memory_stats(&mut self) {
        let m = self.shared.mem.snapshot();
        self.stats.memory_in_use = m.in_use;
        self.stats.memory_peak = m.peak;
        self.stats.memory_pressure_drops = m.drops;
        self.stats.memory_limited_writes = m.limited_writes;
        self.stats.memory_pressure_events = m.pressure_events;
    }

    // ------------------------------------------------------------ input

    /// Processes one incoming IP packet.
    pub fn handle_packet(&mut self, now: Instant, packet: &[u8]) -> Result<(), DropReason> {
        self.stats.packets_received += 1;
        let r = self.handle_packet_inner(now, packet);
        if let Err(reason) = r {
            self.stats.drops[reason.index()] += 1;
        }
        r
    }

    fn handle_packet_inner(&mut self, now: Instant, packet: &[u8]) -> Result<(), DropReason> {
        let seg = match wire::parse_packet(packet, self.config.verify_checksums) {
            Ok(seg) => seg,
            Err(DropReason::NotTcp) => return self.handle_icmp(now, packet),
            Err(e) => return Err(e),
        };
        if seg.src.port() == 0
            || seg.dst.port() == 0
            || is_non_unicast(&seg.src.ip())
            || is_non_unicast(&seg.dst.ip())
        {
            // RFC 9293 §3.9.1 (MUST-57 and friends): never answer non-unicast addresses.
            return Err(DropReason::BadAddress);
        }
        if !self.config.local_addresses.is_empty()
            && !self.config.local_addresses.contains(&seg.dst.ip())
        {
            return Err(DropReason::NotLocal);
        }
        let tuple = (seg.dst, seg.src);
        let found = match self.last_lookup {
            Some((last, idx)) if last == tuple => Some(idx),
            _ => {
                let idx = self.table.get(&tuple).copied();
                self.last_lookup = idx.map(|i| (tuple, i));
                idx
            }
        };
        if let Some(idx) = found {
            if self.time_wait_reuse(now, idx, &seg) {
                // Fall through to the listener as a new connection.
            } else {
                let slot = &mut self.slots[idx as usize];
                let Some(conn) = slot.conn.as_mut() else {
                    return Err(DropReason::NoConnection);
                };
                let r = conn.handle_segment(now, &seg);
                self.mark_ready(idx);
                self.after_op(idx);
                return r;
            }
        }
        let listener = self
            .listener_by_addr
            .get(&seg.dst)
            .or_else(|| {
                let any = SocketAddr::new(
                    if seg.dst.is_ipv4() {
                        std::net::Ipv4Addr::UNSPECIFIED.into()
                    } else {
                        std::net::Ipv6Addr::UNSPECIFIED.into()
                    },
                    seg.dst.port(),
                );
                self.listener_by_addr.get(&any)
            })
            .copied();
        match listener {
            Some(l) => self.listener_segment(now, l, &seg),
            None => {
                self.reply_rst_closed(&seg);
                Err(DropReason::NoConnection)
            }
        }
    }

    /// A packet that is not TCP: an ICMP "packet too big" for one of our connections lowers
    /// its send MSS (path MTU discovery, RFC 1191, RFC 8201); anything else is dropped. Without
    /// this, a path whose MTU is below both ends' (a tunnel, PPPoE) drops every full-sized
    /// segment (they carry DF), and the connection stalls for good.
    fn handle_icmp(&mut self, now: Instant, packet: &[u8]) -> Result<(), DropReason> {
        let Some(ptb) = wire::parse_packet_too_big(packet, self.config.verify_checksums) else {
            return Err(DropReason::NotTcp);
        };
        if !self.config.local_addresses.is_empty()
            && !self.config.local_addresses.contains(&ptb.local.ip())
        {
            return Err(DropReason::NotLocal);
        }
        let Some(&idx) = self.table.get(&(ptb.local, ptb.remote)) else {
            return Err(DropReason::IcmpIgnored);
        };
        let Some(conn) = self.slots[idx as usize].conn.as_mut() else {
            return Err(DropReason::IcmpIgnored);
        };
        if !conn.on_packet_too_big(now, ptb.mtu, ptb.seq) {
            return Err(DropReason::IcmpIgnored);
        }
        self.stats.packet_too_big_believed += 1;
        self.mark_ready(idx);
        self.after_op(idx);
        Ok(())
    }

    /// A SYN for a 4-tuple in TIME-WAIT may start a new incarnation when its timestamp (or,
    /// without timestamps, its sequence number) is beyond the old connection's (RFC 6191,
    /// RFC 9293 §3.6.1). Returns whether the TIME-WAIT connection was dropped for it.
    fn time_wait_reuse(&mut self, _now: Instant, idx: u32, seg: &Segment<'_>) -> bool {
        if !seg.flags.syn() || seg.flags.ack() || seg.flags.rst() {
            return false;
        }
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return false;
        };
        let Some(conn) = slot.conn.as_mut() else {
            return false;
        };
        if conn.state() != State::TimeWait || !conn.time_wait_accepts_syn(seg) {
            return false;
        }
        conn.force_closed();
        self.after_op(idx);
        true
    }

    /// RST for a segment that matches no connection (RFC 9293 §3.10.7.1): never for a RST; if
    /// the segment has ACK, <SEQ=SEG.ACK><CTL=RST>, else <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>.
    fn reply_rst_closed(&mut self, seg: &Segment<'_>) {
        if seg.flags.rst() {
            return;
        }
        let (seq, ack, flags) = if seg.flags.ack() {
            (seg.ack, 0, TcpFlags::RST)
        } else {
            (
                0,
                seg.seq.wrapping_add(seg.seg_len()),
                TcpFlags::RST | TcpFlags::ACK,
            )
        };
        self.queue_reply(seg.dst, seg.src, seq, ack, flags, 0, &OutOptions::default());
        self.stats.resets_sent += 1;
    }

    #[allow(clippy::too_many_arguments)]
    fn queue_reply(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        seq: u32,
        ack: u32,
        flags: TcpFlags,
        window: u16,
        opts: &OutOptions,
    ) {
        if self.replies.len() >= self.config.max_pending_replies {
            self.stats.replies_dropped += 1;
            return;
        }
        let hdr = OutHeader {
            src,
            dst,
            seq,
            ack,
            flags,
            window,
            ttl: self.config.ttl,
            ip_id: 0,
        };
        let mut buf = vec![0u8; 128];
        if let Some(n) = wire::write_packet(&mut buf, &hdr, opts, 0, |_| {}) {
            buf.truncate(n);
            self.replies.push_back(buf);
        }
    }

    /// A segment for a listener (RFC 9293 §3.10.7.2 LISTEN state).
    fn listener_segment(
        &mut self,
        now: Instant,
        lh: ListenerHandle,
        seg: &Segment<'_>,
    ) -> Result<(), DropReason> {
        let flags = seg.flags;
        // First: an incoming RST is ignored.
        if flags.rst() {
            return Err(DropReason::ListenerRejected);
        }
        // Second: an ACK is either a SYN-cookie completion or unacceptable: RST.
        if flags.ack() {
            if !flags.syn() && self.config.syn_cookies != SynCookies::Never {
                match self.accept_cookie(now, lh, seg) {
                    Ok(()) => return Ok(()),
                    Err(DropReason::BadSynCookie) => {
                        self.reply_rst_closed(seg);
                        return Err(DropReason::BadSynCookie);
                    }
                    Err(e) => return Err(e),
                }
            }
            self.reply_rst_closed(seg);
            return Err(DropReason::ListenerRejected);
        }
        // Third: SYN.
        if !flags.syn() {
            return Err(DropReason::ListenerRejected);
        }
        let Some(listener) = self.listener_mut(lh) else {
            return Err(DropReason::NoConnection);
        };
        // Linux drops SYNs while the accept queue is full (no cookie can help there).
        if listener.accept_queue.len() >= listener.backlog {
            return Err(DropReason::BacklogFull);
        }
        let syn_queue_full = listener.half_open >= listener.backlog;
        let config = listener.config.clone();
        let global_full = self.half_open >= self.config.max_half_open;
        let use_cookie = match self.config.syn_cookies {
            SynCookies::Never => false,
            SynCookies::Always => true,
            SynCookies::WhenBacklogFull => syn_queue_full || global_full,
        };
        if use_cookie {
            self.send_cookie_syn_ack(now, seg, &config);
            return Ok(());
        }
        if syn_queue_full || global_full {
            return Err(DropReason::BacklogFull);
        }
        if self.live >= self.config.max_connections {
            return Err(DropReason::TooManyConnections);
        }
        let syn = PeerSyn {
            irs: RcvSeq::new(seg.seq),
            mss: seg.options.mss,
            window_scale: seg.options.window_scale,
            sack_permitted: seg.options.sack_permitted,
            timestamps: seg.options.timestamps,
            window: seg.window,
        };
        let fast_open = if config.fast_open {
            seg.options.fast_open
        } else {
            None
        };
        let max_pending = config.fast_open_max_pending;
        let params = self.new_conn_params(now, seg.dst, seg.src, config);
        // Data on a SYN is accepted before the handshake completes only with a valid Fast
        // Open cookie (RFC 7413 §4.3); otherwise the SYN-ACK acknowledges only the SYN, so the
        // peer sends the data again.
        let mut reply_cookie = None;
        let mut take_data = false;
        if let Some(cookie) = fast_open {
            let period = self.fast_open_key_period_number(now);
            let valid = self.fast_open_cookie(period, seg);
            // The previous period's cookie is computed only for a cookie that is not the
            // current one (a second keyed hash).
            let previous = !cookie.is_request()
                && cookie != valid
                && period
                    .checked_sub(1)
                    .is_some_and(|p| cookie == self.fast_open_cookie(p, seg));
            let stats = &mut self.stats.fast_open;
            if cookie.is_request() {
                stats.cookie_requests_received += 1;
                reply_cookie = Some(valid);
            } else if cookie == valid || previous {
                stats.cookies_accepted += 1;
                if previous {
                    // Still good for one more period; the SYN-ACK brings the new one
                    // (RFC 7413 §4.1.2: the server may send a new cookie at any time).
                    stats.cookies_of_previous_key += 1;
                    reply_cookie = Some(valid);
                }
                let pending = self.listener_mut(lh).map_or(0, |l| l.fo_pending);
                if !seg.payload.is_empty() {
                    if pending < max_pending {
                        take_data = true;
                    } else {
                        // Over the limit: an ordinary handshake, and the cookie sent back so
                        // that the client does not take the unacknowledged data for a
                        // refused cookie (and forget it).
                        self.stats.fast_open.pending_overflows += 1;
                        reply_cookie = Some(valid);
                    }
                }
            } else {
                // RFC 7413 §4.1.2: an invalid cookie gets the data dropped and, as Linux
                // does, a valid cookie for next time.
                stats.cookies_refused += 1;
                reply_cookie = Some(valid);
            }
        }
        if take_data {
            let mut conn = Connection::new_passive_fast_open(params, &syn, seg.payload);
            if let Some(c) = reply_cookie {
                // A cookie of the previous key period: the data is taken, and the SYN-ACK
                // brings the current cookie.
                conn.set_fast_open_reply(c);
                self.stats.fast_open.cookies_sent += 1;
            }
            let handle = self.insert(conn, false, Some(lh), true);
            let slot = &mut self.slots[handle.index as usize];
            slot.early_queued = true;
            if let Some(l) = self.listener_mut(lh) {
                l.fo_pending += 1;
                l.accept_queue.push_back(handle);
            }
            self.stats.fast_open.syn_data_accepted += 1;
            self.events.push_back(Event::Incoming(lh));
            return Ok(());
        }
        let mut conn = Connection::new_passive(params, &syn);
        if let Some(c) = reply_cookie {
            conn.set_fast_open_reply(c);
            self.stats.fast_open.cookies_sent += 1;
        }
        self.insert(conn, false, Some(lh), true);
        Ok(())
    }

    /// The number of the Fast Open key period `now` is in (0 for ever if keys do not rotate,
    /// [`EndpointConfig::fast_open_key_period`](crate::EndpointConfig::fast_open_key_period)).
    /// The cookie of the current period and of the one before are accepted, so a cookie is
    /// good for one to two periods; a new secret (a new endpoint) invalidates every cookie,
    /// and clients fall back to a cookie request.
    fn fast_open_key_period_number(&self, now: Instant) -> u64 {
        self.config.fast_open_key_period.map_or(0, |period| {
            let since = now.saturating_duration_since(self.shared.epoch);
            (since.as_nanos() / period.as_nanos().max(1)) as u64
        })
    }

    /// The Fast Open cookie of key period `period` for the client of `seg` (RFC 7413 §4.1.2: a
    /// MAC of its address under the endpoint's secret and the period's number).
    fn fast_open_cookie(&self, period: u64, seg: &Segment<'_>) -> FastOpenCookie {
        let mac = self
            .secret
            .fast_open_cookie(period, &seg.src.ip(), &seg.dst.ip());
        FastOpenCookie::new(&mac).unwrap_or(FastOpenCookie::REQUEST)
    }

    /// Takes what a connection learned about Fast Open into the cache and the counters.
    fn fast_open_notes(&mut self, server: IpAddr, now: Instant, notes: &[FastOpenNote]) {
        let cap = self.config.fast_open_cache_size;
        let blackhole = self.config.fast_open_blackhole;
        for note in notes {
            let stats = &mut self.stats.fast_open;
            match *note {
                FastOpenNote::CookieRequested => stats.cookie_requests_sent += 1,
                FastOpenNote::SynData(n) => {
                    stats.syns_with_cookie += 1;
                    if n > 0 {
                        stats.syn_data_sent += 1;
                        stats.syn_data_bytes += n as u64;
                    }
                }
                FastOpenNote::CookieLearned(cookie, mss) => {
                    stats.cookies_received += 1;
                    self.fo_cache.update(server, cap, |e| {
                        e.cookie = Some(cookie);
                        e.mss = mss.or(e.mss);
                    });
                }
                FastOpenNote::ServerMss(mss) => {
                    if mss.is_some() && self.fo_cache.entries.contains_key(&server) {
                        self.fo_cache.update(server, cap, |e| e.mss = mss);
                    }
                }
                FastOpenNote::SynDataAcked => stats.syn_data_acked += 1,
                FastOpenNote::SynDataNotAcked => stats.syn_data_not_acked += 1,
                FastOpenNote::ForgetCookie => {
                    stats.cookies_forgotten += 1;
                    if let Some(e) = self.fo_cache.entries.get_mut(&server) {
                        e.cookie = None;
                    }
                }
                FastOpenNote::SynDataTimeout => stats.syn_data_timeouts += 1,
                FastOpenNote::Blackhole => {
                    stats.blackholes_detected += 1;
                    self.fo_cache.update(server, cap, |e| {
                        e.blackholed_until = now.checked_add(blackhole);
                    });
                }
            }
        }
    }

    fn cookie_config_window(config: &ConnectionConfig, local_mss: u16) -> u16 {
        crate::conn::initial_window(config.recv_buffer, local_mss)
    }

    /// Stateless SYN-ACK carrying a SYN cookie (RFC 4987 §3.6).
    fn send_cookie_syn_ack(&mut self, now: Instant, seg: &Segment<'_>, config: &ConnectionConfig) {
        let since = now.saturating_duration_since(self.shared.epoch);
        let peer_mss = seg.options.mss.unwrap_or(536);
        let counter = syncookie::counter(since);
        let iss = syncookie::make(&self.secret, &seg.dst, &seg.src, counter, seg.seq, peer_mss);
        let local_mss = {
            let overhead = wire::ip_header_len(&seg.dst) as u16 + wire::TCP_HEADER as u16;
            config
                .mss
                .unwrap_or_else(|| config.mtu.saturating_sub(overhead))
                .max(config.min_mss)
        };
        let mut opts = OutOptions {
            mss: Some(local_mss),
            ..Default::default()
        };
        // Without timestamps the cookie cannot carry window scale or SACK (as in Linux).
        if config.timestamps
            && let Some((tsval, _)) = seg.options.timestamps
        {
            let ts_offset = self.secret.ts_offset(&seg.dst, &seg.src);
            let ts_now = (since.as_millis() as u32).wrapping_add(ts_offset);
            let wscale = seg.options.window_scale.filter(|_| config.window_scaling);
            let sack = seg.options.sack_permitted && config.sack;
            opts.timestamps = Some((syncookie::encode_ts(ts_now, wscale, sack), tsval));
            opts.sack_permitted = sack;
            if wscale.is_some() {
                opts.window_scale = Some(rcv_wscale_for(config));
            }
        }
        let window = Self::cookie_config_window(config, local_mss);
        self.queue_reply(
            seg.dst,
            seg.src,
            iss,
            seg.seq.wrapping_add(1),
            TcpFlags::SYN | TcpFlags::ACK,
            window,
            &opts,
        );
        self.stats.syn_cookies_sent += 1;
    }

    /// Completes a handshake from a SYN cookie in the ACK (RFC 4987 §3.6).
    fn accept_cookie(
        &mut self,
        now: Instant,
        lh: ListenerHandle,
        seg: &Segment<'_>,
    ) -> Result<(), DropReason> {
        let since = now.saturating_duration_since(self.shared.epoch);
        let cookie = seg.ack.wrapping_sub(1);
        let client_isn = seg.seq.wrapping_sub(1);
        let mss = syncookie::check(
            &self.secret,
            &seg.dst,
            &seg.src,
            syncookie::counter(since),
            client_isn,
            cookie,
        )
        .ok_or(DropReason::BadSynCookie)?;
        let Some(listener) = self.listener_mut(lh) else {
            return Err(DropReason::NoConnection);
        };
        if listener.accept_queue.len() >= listener.backlog {
            return Err(DropReason::BacklogFull);
        }
        let config = listener.config.clone();
        if self.live >= self.config.max_connections {
            return Err(DropReason::TooManyConnections);
        }
        let (wscale, sack, ts) = match seg.options.timestamps {
            Some((tsval, tsecr)) if config.timestamps => {
                let (w, s) = syncookie::decode_ts(tsecr);
                (w, s, Some((tsval, tsecr)))
            }
            _ => (None, false, None),
        };
        let syn = PeerSyn {
            irs: RcvSeq::new(client_isn),
            mss: Some(mss),
            window_scale: wscale,
            sack_permitted: sack,
            timestamps: ts,
            window: seg.window,
        };
        let mut params = self.new_conn_params(now, seg.dst, seg.src, config.clone());
        params.iss = cookie;
        let mut cfg = config;
        if wscale.is_none() {
            cfg.window_scaling = false;
        }
        params.cfg = cfg;
        let mut conn = Connection::new_from_cookie(params, &syn, ts.map(|t| t.1));
        // The ACK's window is scaled by the peer's shift now that the handshake is done.
        conn.set_window_from_ack(seg);
        self.stats.syn_cookies_accepted += 1;
        // Queue it for accept, then let the connection process any data on the ACK.
        let handle = self.insert(conn, false, Some(lh), false);
        if let Some(l) = self.listener_mut(lh) {
            l.accept_queue.push_back(handle);
        }
        self.events.push_back(Event::Incoming(lh));
        let idx = handle.index;
        if !seg.payload.is_empty() || seg.flags.fin() {
            if let Some(c) = self.slots[idx as usize].conn.as_mut() {
                let _ = c.handle_segment(now, seg);
            }
            self.mark_ready(idx);
            self.after_op(idx);
        }
        Ok(())
    }
}

/// Our window shift for a configuration (also used for cookie SYN-ACKs).
pub(crate) fn rcv_wscale_for(config: &ConnectionConfig) -> u8 {
    if !config.window_scaling {
        return 0;
    }
    config
        .window_scale
        .unwrap_or_else(|| {
            let mut s = 0u8;
            while s < 14 && (config.recv_buffer >> s) > 65535 {
                s += 1;
            }
            s
        })
        .min(14)
}
