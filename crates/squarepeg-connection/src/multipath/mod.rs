//! One session over several TCP connections (TCPLS; docs/wire.md §7): failover and
//! multipath, sans-IO.
//!
//! A [`MultipathConnection`] owns one [`Session`] and the connections ("paths") it runs
//! over, each a TLS 1.3 connection on a byte-stream substrate (kernel TCP, or the userspace
//! TCP read in order) with its own handshake and keys: the first by a full handshake, each
//! further one by a *join*, an ordinary TLS 1.3 PSK resumption with a single-use ticket
//! issued inside the session (`squarepeg_tls::join`). Records are sealed per connection,
//! so no (key, nonce) is ever used twice, also when a frame is re-sent on another
//! connection: it is sealed again under that connection's keys and sequence numbers.
//!
//! # Sending
//!
//! The session's scheduler picks each frame as late as possible, when a connection asks
//! for output ([`MultipathConnection::poll_transmit`]); the frame's [`PathPolicy`] says
//! which connection carries it (aggregate: the one asking; lowest RTT; round robin; pinned;
//! redundant: the two lowest-RTT ones, the receiver drops the second copy). What a
//! connection sent stays in its `SentLog` (`log.rs`) until the peer acknowledges it at the
//! session level.
//!
//! # Acknowledgements and failover
//!
//! A receiver acknowledges each connection's plaintext it has taken with PATH_ACK (whole
//! frames, after at most `ack_delay`, at once after `ack_bytes` or a PATH_PROBE), on that
//! connection. When a connection dies — the driver reports a reset, timeout or end
//! ([`MultipathConnection::handle_path_closed`]), or acknowledgements stop for
//! `path_timeout` while something is outstanding (a blackhole; idle connections are probed
//! every `probe_interval`) — every unacknowledged frame of the session's goes to the front
//! of the queue of the surviving connections, except messages whose lifetime has ended.
//! The receiving session takes each message number and stream byte once (its duplicate
//! window and stream offsets), and control frames are idempotent, so the application
//! receives everything once. Unacknowledged bytes are bounded (`max_unacked`), and so is
//! the span of unacknowledged message numbers (half the session's duplicate window), so that
//! a re-sent message is still recognised.
//!
//! # Driver contract
//!
//! As [`crate::Connection`]'s, per connection: after anything happened, for every path,
//! hand the socket what [`MultipathConnection::poll_transmit`] gives, end it once
//! [`MultipathConnection::poll_shutdown`] says so, read while
//! [`MultipathConnection::wants_read`]; report a socket's end or failure with
//! [`MultipathConnection::handle_path_closed`]; drain
//! [`MultipathConnection::poll_event`] and [`MultipathConnection::poll_path_event`] (close
//! the socket of a path reported closed; open a join after [`PathEvent::NoPath`]); run
//! [`MultipathConnection::handle_timeout`] at [`MultipathConnection::poll_timeout`]. A
//! server drives a new connection's handshake on its own [`Path`] first, then decides with
//! its `squarepeg_tls::JoinRegistry` whether it starts a session or joins one
//! ([`MultipathConnection::add_path`]).

mod log;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use squarepeg_framing::{FrameFormat, FrameHeader};
use squarepeg_session::control::{ControlFrame, record_numbers};
use squarepeg_session::{
    ConfigError, Event, MessageNumber, PathPolicy, ProtocolError, Role, Session, TransmitContent,
    TransportError,
};
use squarepeg_tls::Tls;

use crate::record::{open_into, tls_transport_error};
use crate::{Receiver, SessionConfig};
use log::{BadAck, Kind, Orphan, SentLog};

/// A connection of a multipath session, numbered from 0 in the order added on this side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathId(pub u64);

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path {}", self.0)
    }
}

/// Settings of a multipath session.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MultipathConfig {
    /// The session's settings.
    pub session: SessionConfig,
    /// Bytes read from a socket at once.
    pub read_buffer: usize,
    /// Bytes sent and not yet acknowledged, over all connections, beyond which no more
    /// frames leave the session (they wait there, where the scheduler can still reorder
    /// and expire them). At least the paths' summed bandwidth-delay products. Copies of a
    /// suspect connection's frames ([`Self::reinject`]) may hold as much again.
    pub max_unacked: usize,
    /// A receiver acknowledges at once after this many new bytes on a connection.
    pub ack_bytes: usize,
    /// … and otherwise at most this long after a frame that asks for it.
    pub ack_delay: Duration,
    /// A connection with frames outstanding and no acknowledgement for this long is dead
    /// (a blackhole): the application's detection time. It must exceed the path's RTT plus
    /// `ack_delay`, with the queueing a loaded path adds.
    pub path_timeout: Duration,
    /// Each connection is probed this often (RTT for lowest-RTT steering, and liveness
    /// while idle).
    pub probe_interval: Duration,
    /// How long the session waits for a new connection once it has none.
    pub linger: Duration,
    /// Copy a *suspect* connection's unacknowledged session frames to the lowest-RTT other
    /// one, once each, before it is declared dead: one with frames outstanding and no
    /// acknowledgement for half `path_timeout` (and at least twice its RTT plus
    /// `ack_delay`). A blackhole then stalls the session about that long rather than
    /// `path_timeout` plus the survivor's queue; a connection that was only slow (a TCP
    /// retransmission timeout) costs duplicates, which the receiver drops (MPTCP's
    /// opportunistic reinjection does the same for a window-limited subflow).
    pub reinject: bool,
    /// When a connection dies suddenly (reset, or closed while acknowledgements flowed),
    /// re-send the frames the peer is most likely missing first and those it most likely
    /// took (sealed more than its one-way trip before, their acknowledgement lost with the
    /// connection) after them, so that the stream's hole is filled first. Off: in the order
    /// sent. Nothing on the wire changes.
    pub resend_missing_first: bool,
    /// A connection added while its TLS handshake runs (the client's first one and its
    /// joins) that has not finished it this long after it was added is closed
    /// (`TlsFailure::HandshakeTimedOut`): a server that stalls mid-handshake neither holds
    /// the first connect for ever nor keeps a join's slot.
    pub handshake_timeout: Duration,
}

impl Default for MultipathConfig {
    fn default() -> Self {
        Self {
            session: SessionConfig::default(),
            read_buffer: 64 * 1024,
            max_unacked: 16 << 20,
            ack_bytes: 64 * 1024,
            ack_delay: Duration::from_millis(10),
            path_timeout: Duration::from_secs(1),
            probe_interval: Duration::from_millis(250),
            linger: Duration::from_secs(30),
            reinject: true,
            resend_missing_first: true,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl MultipathConfig {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.session.validate()?;
        if self.read_buffer == 0 || self.ack_bytes == 0 {
            return Err(ConfigError("read_buffer and ack_bytes must be > 0"));
        }
        if self.max_unacked < 4 * self.ack_bytes {
            return Err(ConfigError("max_unacked must be at least 4 × ack_bytes"));
        }
        if self.path_timeout <= self.ack_delay {
            return Err(ConfigError("path_timeout must exceed ack_delay"));
        }
        if self.probe_interval.is_zero() || self.handshake_timeout.is_zero() {
            return Err(ConfigError(
                "probe_interval and handshake_timeout must be > 0",
            ));
        }
        Ok(())
    }
}

/// Something about the session's connections.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathEvent {
    /// The connection is gone (its socket should be closed); what it had not delivered goes
    /// on another.
    Closed {
        path: PathId,
        reason: TransportError,
        /// Frames moved to the other connections.
        resent: usize,
    },
    /// The connection got no acknowledgement for a while: its unacknowledged frames were
    /// copied to another ([`MultipathConfig::reinject`]); it may still recover. Once per
    /// stall (frames bound to it later are copied too, without a new event).
    Suspect {
        path: PathId,
        /// Frames copied then.
        copied: usize,
    },
    /// No connection is left: open one (a join) within `linger`, or the session ends.
    NoPath,
    /// The peer announced an address it can be reached at.
    PeerAddress { id: u64, addr: SocketAddr },
    /// The peer withdrew an address.
    PeerAddressRemoved { id: u64 },
}

/// A connection's state, as [`MultipathConnection::paths`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathInfo {
    pub id: PathId,
    /// Handshake done and not closed.
    pub usable: bool,
    /// Smoothed RTT from probes (or the driver's [`MultipathConnection::set_path_rtt`]).
    pub srtt: Option<Duration>,
    /// Bytes sent and not yet acknowledged.
    pub unacked: usize,
    /// Plaintext bytes sent and received.
    pub sent: u64,
    pub received: u64,
}

/// A connection that is gone: when this side learnt it and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClosedPath {
    pub id: PathId,
    pub at: Instant,
    pub reason: TransportError,
    /// The smoothed RTT of the fastest connection left then (what its data moves to).
    pub survivor_srtt: Option<Duration>,
    /// When it was found suspect and its frames copied to another
    /// ([`MultipathConfig::reinject`]), if it was and got no acknowledgement since.
    pub suspected: Option<Instant>,
}

/// Most path events kept for [`MultipathConnection::poll_path_event`] (the oldest go first).
const MAX_EVENTS: usize = 64;
/// Most addresses of the peer remembered.
pub const MAX_PEER_ADDRESSES: usize = 16;

fn push_event(events: &mut VecDeque<PathEvent>, signal: &mut bool, event: PathEvent) {
    if events.len() == MAX_EVENTS {
        events.pop_front();
    }
    events.push_back(event);
    *signal = true;
}

/// Closed connections remembered ([`MultipathConnection::closed_paths`]), and closed
/// connections kept in the table (their drivers may still ask about them) before the oldest
/// are dropped.
const CLOSED_KEPT: usize = 16;

/// Counters of a multipath session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MultipathStats {
    pub session: squarepeg_session::Stats,
    pub paths_added: u64,
    pub paths_closed: u64,
    /// Connections declared dead for lack of acknowledgements.
    pub paths_timed_out: u64,
    /// Connections closed because their TLS handshake took longer than
    /// [`MultipathConfig::handshake_timeout`].
    pub handshakes_timed_out: u64,
    /// Frames re-sent on another connection after theirs died.
    pub frames_resent: u64,
    /// Of those, frames the peer most likely had (sealed more than a one-way trip before a
    /// sudden death, their acknowledgement lost with the connection): re-sent after the
    /// others.
    pub resends_deferred: u64,
    /// Times a connection was found suspect ([`MultipathConfig::reinject`]; once per
    /// stall), and the frames copied from suspect connections to another.
    pub paths_suspected: u64,
    pub frames_reinjected: u64,
    /// Messages not re-sent because their lifetime had ended.
    pub resends_expired: u64,
    pub acks_sent: u64,
    pub acks_received: u64,
    pub probes_sent: u64,
}

/// One TLS connection of a multipath session. A client makes it with `Tls::client` (the
/// first) or `Tls::client_join` (the others); a server with `Tls::server` on the
/// configuration its `JoinRegistry` handed out, and drives the handshake with
/// [`Path::handle_bytes`] and [`Path::poll_transmit`] until [`Path::is_established`], then
/// adds it to a session.
pub struct Path {
    tls: Tls,
    tls_failed: Option<TransportError>,
    close_notify_out: bool,
    receiver: Receiver,
    log: SentLog,
    /// Plaintext taken from the peer (whole frames) and acknowledged so far.
    received: u64,
    ack_sent: u64,
    ack_due: Option<Instant>,
    /// An acknowledgement fell due (or a keep-alive one, while this side's session cannot
    /// read): written at the path's next poll.
    ack_now: bool,
    /// Since when frames asking for an acknowledgement wait without progress.
    outstanding_since: Option<Instant>,
    /// When the next probe falls due; `None` until the first PATH_PROBE is in its log
    /// (every other frame goes after it): see [`Path::probed`].
    next_probe: Option<Instant>,
    /// A probe fell due: written at the path's next poll (the first one at once).
    probe_now: bool,
    /// The probe in flight: its end offset and when it left.
    probe: Option<(u64, Instant)>,
    /// A frame came from the peer on it (the first must be the peer's PATH_PROBE).
    peer_frame_seen: bool,
    /// When it was last found suspect, unless acknowledgements came since.
    suspected: Option<Instant>,
    srtt: Option<Duration>,
    /// The lowest RTT sample: twice the path's one-way delay, without its queues.
    min_rtt: Option<Duration>,
    /// How much the RTT samples vary around `srtt` (RFC 6298's RTTVAR).
    rttvar: Duration,
    /// The last RTT sample.
    latest_rtt: Duration,
    /// When the last PATH_ACK that acknowledged something new came.
    last_ack_at: Option<Instant>,
    fin_sent: bool,
    closed: bool,
    /// A client's join: refused unless its handshake resumed (a server that did not take
    /// the ticket made a full handshake, i.e. a new session that this one is not).
    must_resume: bool,
    /// Added to a session still handshaking: when the handshake must be done by.
    handshake_deadline: Option<Instant>,
}

impl fmt::Debug for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Path")
            .field("established", &self.is_established())
            .field("sent", &self.log.end())
            .field("acked", &self.log.acked())
            .field("received", &self.received)
            .field("srtt", &self.srtt)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl Path {
    /// A connection running `tls`; `read_buffer` as [`MultipathConfig::read_buffer`].
    pub fn new(tls: Tls, read_buffer: usize) -> Self {
        let mut receiver = Receiver::new(read_buffer, 4 * read_buffer, true);
        receiver.start_plain();
        Self {
            tls,
            tls_failed: None,
            close_notify_out: false,
            receiver,
            log: SentLog::default(),
            received: 0,
            ack_sent: 0,
            ack_due: None,
            ack_now: false,
            outstanding_since: None,
            next_probe: None,
            probe_now: true,
            probe: None,
            peer_frame_seen: false,
            suspected: None,
            srtt: None,
            min_rtt: None,
            rttvar: Duration::ZERO,
            latest_rtt: Duration::ZERO,
            last_ack_at: None,
            fin_sent: false,
            closed: false,
            must_resume: false,
            handshake_deadline: None,
        }
    }

    /// A client's further connection, running `tls` from `Tls::client_join`: dropped if
    /// the server does not resume it.
    pub fn join(tls: Tls, read_buffer: usize) -> Self {
        Self {
            must_resume: true,
            ..Self::new(tls, read_buffer)
        }
    }

    /// The TLS connection (the join registry judges it by it).
    pub fn tls(&self) -> &Tls {
        &self.tls
    }

    /// Whether the handshake is done.
    pub fn is_established(&self) -> bool {
        !self.tls.is_handshaking()
    }

    /// Why the handshake or a record failed, if it did.
    pub fn failure(&self) -> Option<&TransportError> {
        self.tls_failed.as_ref()
    }

    /// Before the path belongs to a session: ciphertext from the socket. Plaintext after
    /// the handshake waits in the path until it is added.
    pub fn handle_bytes(&mut self, data: &[u8]) {
        if self.tls_failed.is_some() {
            return;
        }
        if let Err(e) = open_into(&mut self.tls, &mut self.receiver, data) {
            self.tls_failed = Some(tls_transport_error(&e));
        }
    }

    /// Before the path belongs to a session: handshake flights (and alerts) for the socket.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) {
        self.tls.poll_output(out);
    }

    fn usable(&self) -> bool {
        !self.closed && self.tls_failed.is_none() && self.is_established() && !self.fin_sent
    }

    /// When its handshake times out, if it is still running one.
    fn handshake_deadline(&self) -> Option<Instant> {
        if self.closed || self.tls_failed.is_some() || self.is_established() {
            return None;
        }
        self.handshake_deadline
    }

    /// The RTT to steer by: the smoothed one, or the age of an unanswered probe if that is
    /// longer (a path that stopped answering stops looking fast before it is declared dead).
    fn steering_rtt(&self, now: Instant) -> Duration {
        let srtt = self.srtt.unwrap_or(Duration::MAX);
        match self.probe {
            Some((_, sent)) => srtt.max(now.saturating_duration_since(sent)),
            None => srtt,
        }
    }

    /// Whether its first PATH_PROBE is in its log (probes are scheduled from then on).
    fn probed(&self) -> bool {
        self.next_probe.is_some()
    }

    /// When the path becomes suspect ([`MultipathConfig::reinject`]): after this long
    /// without acknowledgement while it holds frames without a copy elsewhere.
    fn suspect_at(&self, config: &MultipathConfig) -> Option<Instant> {
        if !self.log.has_uncopied() {
            return None;
        }
        let rtt_bound = self
            .srtt
            .map_or(Duration::ZERO, |s| s * 2 + config.ack_delay);
        let after = (config.path_timeout / 2).max(rtt_bound);
        self.outstanding_since.map(|t| t + after)
    }

    /// At its death: frames sealed before this most likely reached the peer, though their
    /// acknowledgement did not come back — if the death was sudden (a reset or a FIN while
    /// acknowledgements flowed; not a timeout or a stall, after which the frames sent before
    /// it are as lost as the last ones). A frame sealed at `t` reached the peer by `t` + its
    /// wait in the socket + the path's queue + the one-way delay, i.e. `t` + RTT − min_rtt/2
    /// (the probes' RTT includes the socket's queue: they wait in it too), with the RTT the
    /// larger of the smoothed one and the latest sample (a queue that just grew) and a margin
    /// of a quarter of it or RFC 6298's RTTVAR, whichever is larger. The death is taken to be
    /// `now`, or `ack_delay` after the last PATH_ACK that acknowledged something new if that
    /// is earlier (a driver that saw the reset late; a peer that stopped taking data, whose
    /// acknowledgements only keep the path). The error costs are lopsided, hence the margins: a frame the peer has,
    /// re-sent early, costs its own transmission time; a frame it is missing, put last,
    /// holds the stream until everything else is re-sent.
    fn arrived_before(
        &self,
        now: Instant,
        reason: TransportError,
        ack_delay: Duration,
    ) -> Option<Instant> {
        if reason == TransportError::TimedOut || self.suspected.is_some() {
            return None;
        }
        let (srtt, min_rtt) = self.srtt.zip(self.min_rtt)?;
        let died = self.last_ack_at?.checked_add(ack_delay)?.min(now);
        let rtt = srtt.max(self.latest_rtt);
        died.checked_sub(rtt.saturating_sub(min_rtt / 2) + (srtt / 4).max(self.rttvar))
    }

    fn rtt_sample(&mut self, sample: Duration) {
        self.min_rtt = Some(self.min_rtt.map_or(sample, |m| m.min(sample)));
        self.latest_rtt = sample;
        // RFC 6298 §2.2-2.3's smoothing (the variation first, from the old srtt).
        self.rttvar = match self.srtt {
            None => sample / 2,
            Some(s) => (self.rttvar * 3 + s.abs_diff(sample)) / 4,
        };
        self.srtt = Some(match self.srtt {
            None => sample,
            Some(s) => (s * 7 + sample) / 8,
        });
    }
}

/// A session over several connections (module docs).
#[derive(Debug)]
pub struct MultipathConnection {
    session: Session,
    config: MultipathConfig,
    paths: BTreeMap<PathId, Path>,
    next_path: u64,
    /// Frames of dead connections waiting for another, in the order sent.
    orphans: VecDeque<Orphan>,
    orphan_bytes: usize,
    /// Unacknowledged message numbers (in logs and `orphans`) and how many copies.
    unacked_messages: BTreeMap<MessageNumber, u32>,
    round_robin: u64,
    events: VecDeque<PathEvent>,
    /// Since when no connection is usable (`None` while one is, or before the first).
    no_path_since: Option<Instant>,
    last_path_error: Option<TransportError>,
    peer_addresses: BTreeMap<u64, SocketAddr>,
    next_address: u64,
    /// Session frames (addresses) of this layer, waiting for a connection.
    own_frames: VecDeque<ControlFrame>,
    stats: MultipathStats,
    /// Scratch: a frame moving between logs, a control body.
    scratch: Vec<u8>,
    body: Vec<u8>,
    session_told_closed: bool,
    /// A path finished its handshake once: the session exists at the peer.
    ever_established: bool,
    /// The latest closures, oldest first (at most [`CLOSED_KEPT`]).
    closed: VecDeque<ClosedPath>,
    /// Paths that got frames while another was polled, or whose acknowledgement or probe
    /// fell due: their drivers must poll them.
    to_wake: Vec<PathId>,
    /// The paths were told the session is drained.
    drain_told: bool,
    /// Path events were queued since [`Self::take_path_event_signal`].
    event_signal: bool,
}

/// How far ahead of what a connection can send the session's frames may be bound to it.
const UNSEALED_AHEAD: usize = 64 * 1024;

impl MultipathConnection {
    /// A session for `role`; add its connections with [`Self::add_path`].
    pub fn new(role: Role, config: MultipathConfig) -> Result<Self, crate::NewConnectionError> {
        config.validate()?;
        let mut session = Session::new(role, config.session.clone())?;
        // Records delimit and authenticate: plain frames from the first byte (docs/wire.md
        // §4); every connection is read in order.
        session.use_plain_frames();
        session.announce_record_numbers(record_numbers::READS);
        Ok(Self {
            session,
            config,
            paths: BTreeMap::new(),
            next_path: 0,
            orphans: VecDeque::new(),
            orphan_bytes: 0,
            unacked_messages: BTreeMap::new(),
            round_robin: 0,
            events: VecDeque::new(),
            no_path_since: None,
            last_path_error: None,
            peer_addresses: BTreeMap::new(),
            next_address: 0,
            own_frames: VecDeque::new(),
            stats: MultipathStats::default(),
            scratch: Vec::new(),
            body: Vec::new(),
            session_told_closed: false,
            ever_established: false,
            closed: VecDeque::new(),
            to_wake: Vec::new(),
            drain_told: false,
            event_signal: false,
        })
    }

    /// Adds a connection (established or still handshaking; a server's is established and
    /// admitted by its join registry). Plaintext it received already goes to the session.
    pub fn add_path(&mut self, now: Instant, mut path: Path) -> PathId {
        let id = PathId(self.next_path);
        self.next_path += 1;
        self.stats.paths_added += 1;
        if !path.is_established() {
            // A deadline too far to add to the clock is none.
            path.handshake_deadline = now.checked_add(self.config.handshake_timeout);
        }
        if path.usable() {
            // A server's path comes established (and admitted).
            self.ever_established = true;
            self.no_path_since = None;
        }
        self.paths.insert(id, path);
        self.take_frames(id, now);
        id
    }

    /// The session: messages, streams, close.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The session, to act on it; poll every path afterwards.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// A path's TLS connection.
    pub fn tls(&self, id: PathId) -> Option<&Tls> {
        self.paths.get(&id).map(|p| &p.tls)
    }

    /// A path's TLS connection, to act on it (e.g. [`Tls::initiate_key_update`]); poll the
    /// path afterwards.
    pub fn tls_mut(&mut self, id: PathId) -> Option<&mut Tls> {
        self.paths.get_mut(&id).map(|p| &mut p.tls)
    }

    /// The connections not yet closed.
    pub fn paths(&self) -> Vec<PathInfo> {
        self.paths
            .iter()
            .filter(|(_, p)| !p.closed)
            .map(|(&id, p)| PathInfo {
                id,
                usable: p.usable(),
                srtt: p.srtt,
                unacked: p.log.held(),
                sent: p.log.end(),
                received: p.received,
            })
            .collect()
    }

    /// The connections that closed, with when and why (the latest sixteen).
    pub fn closed_paths(&self) -> impl Iterator<Item = &ClosedPath> + '_ {
        self.closed.iter()
    }

    /// The peer's announced addresses.
    pub fn peer_addresses(&self) -> impl Iterator<Item = (u64, SocketAddr)> + '_ {
        self.peer_addresses.iter().map(|(&id, &a)| (id, a))
    }

    /// Announces that this side can also be reached at `addr`; returns the id that
    /// withdraws it ([`Self::withdraw_address`]).
    pub fn announce_address(&mut self, addr: SocketAddr) -> u64 {
        let id = self.next_address;
        self.next_address += 1;
        self.own_frames
            .push_back(ControlFrame::AddAddress { id, addr });
        id
    }

    /// Withdraws an announced address.
    pub fn withdraw_address(&mut self, id: u64) {
        self.own_frames
            .push_back(ControlFrame::RemoveAddress { id });
    }

    /// The driver's RTT estimate for a path (e.g. the kernel's `tcpi_rtt`), folded into the
    /// probes' one.
    pub fn set_path_rtt(&mut self, id: PathId, rtt: Duration) {
        if let Some(p) = self.paths.get_mut(&id) {
            p.rtt_sample(rtt);
        }
    }

    /// Counters.
    pub fn stats(&self) -> MultipathStats {
        MultipathStats {
            session: self.session.stats(),
            ..self.stats
        }
    }

    // ------------------------------------------------------------------ receiving

    /// Whether the driver should read the path's socket.
    pub fn wants_read(&self, id: PathId) -> bool {
        self.paths
            .get(&id)
            .is_some_and(|p| !p.closed && p.tls_failed.is_none())
            && !self.session.receive_blocked()
    }

    /// Ciphertext from a path's socket.
    pub fn handle_bytes(&mut self, id: PathId, now: Instant, data: &[u8]) {
        let Some(p) = self.paths.get_mut(&id) else {
            return;
        };
        if p.closed || p.tls_failed.is_some() {
            return;
        }
        if let Err(e) = open_into(&mut p.tls, &mut p.receiver, data) {
            p.tls_failed = Some(tls_transport_error(&e));
        }
        if p.is_established() && p.tls_failed.is_none() {
            self.ever_established = true;
            self.no_path_since = None;
        }
        if let Some(p) = self.paths.get_mut(&id)
            && p.must_resume
            && p.is_established()
        {
            p.must_resume = false;
            if p.tls.handshake_kind() != Some(rustls::HandshakeKind::Resumed) {
                // Not a join: nothing of the session's may go on it.
                p.tls_failed = Some(TransportError::Refused);
                self.path_gone(id, now, TransportError::Refused);
                return;
            }
        }
        self.take_frames(id, now);
        if let Some(reason) = self.paths.get(&id).and_then(|p| p.tls_failed) {
            // The alert goes out with the next poll; the path is gone for the session.
            self.path_gone(id, now, reason);
        }
    }

    /// Hands the frames a path decoded to the session (and its own to itself).
    fn take_frames(&mut self, id: PathId, now: Instant) {
        let Some(p) = self.paths.get_mut(&id) else {
            return;
        };
        let mut elicited = false;
        let mut ack_now = false;
        let mut bad_ack = None;
        while let Some(frame) = p.receiver.next_frame() {
            let frame = match frame {
                Ok(f) => f,
                // The stream is reliable and authenticated: the peer sent it.
                Err(e) => {
                    self.session.handle_decode_error(now, e);
                    break;
                }
            };
            let control = match frame.header {
                FrameHeader::Control => ControlFrame::decode(&frame.payload).ok(),
                _ => None,
            };
            if !std::mem::replace(&mut p.peer_frame_seen, true)
                && !matches!(
                    control,
                    Some(ControlFrame::PathProbe | ControlFrame::PathAck { .. })
                )
            {
                // Every connection of a multipath session begins with a PATH_PROBE (or
                // PATH_ACK) from each side (docs/wire.md §7): the peer runs a
                // single-connection session, which would never acknowledge, and this
                // one would hold everything it sends until it gave up on the path.
                self.session.fail_protocol(now, ProtocolError::NotMultipath);
                return;
            }
            match control {
                Some(ControlFrame::PathAck { received }) => {
                    let unacked = &mut self.unacked_messages;
                    match p.log.ack(received, |kind| forget_message(unacked, kind)) {
                        Ok(progress) => {
                            self.stats.acks_received += 1;
                            if progress {
                                p.suspected = None;
                                // Only an acknowledgement that moved shows the peer taking
                                // data then (`Path::arrived_before`).
                                p.last_ack_at = Some(now);
                            }
                            // Any acknowledgement shows the path and the peer alive: one that
                            // does not advance is a peer that cannot read now (its session's
                            // receive queue is full) keeping the path.
                            p.outstanding_since = p.log.awaits_ack().then_some(now);
                            if let Some((end, sent)) = p.probe
                                && received >= end
                            {
                                p.probe = None;
                                p.rtt_sample(now.saturating_duration_since(sent));
                            }
                        }
                        Err(bad) => {
                            bad_ack = Some(bad);
                            break;
                        }
                    }
                }
                Some(ControlFrame::PathProbe) => ack_now = true,
                Some(ControlFrame::AddAddress { id, addr }) => {
                    elicited = true;
                    // A bounded table: a peer cannot make this side remember (or connect
                    // to) any number of addresses.
                    let room = self.peer_addresses.len() < MAX_PEER_ADDRESSES
                        || self.peer_addresses.contains_key(&id);
                    if room && self.peer_addresses.insert(id, addr) != Some(addr) {
                        push_event(
                            &mut self.events,
                            &mut self.event_signal,
                            PathEvent::PeerAddress { id, addr },
                        );
                    }
                }
                Some(ControlFrame::RemoveAddress { id }) => {
                    elicited = true;
                    if self.peer_addresses.remove(&id).is_some() {
                        push_event(
                            &mut self.events,
                            &mut self.event_signal,
                            PathEvent::PeerAddressRemoved { id },
                        );
                    }
                }
                _ => {
                    elicited = true;
                    self.session.handle_frame(now, frame);
                }
            }
        }
        if let Some(bad) = bad_ack {
            // Acknowledging what was never sent (or half a frame) would make this side
            // drop data the peer does not have: a protocol violation, the session ends.
            tracing::debug!("{id}: refused PATH_ACK: {bad:?}");
            let acked = match bad {
                BadAck::BeyondSent { acked, .. } | BadAck::NotFrameEnd { acked } => acked,
            };
            self.session.fail_protocol(
                now,
                ProtocolError::BadAcknowledgement {
                    acked,
                    sent: match bad {
                        BadAck::BeyondSent { sent, .. } => sent,
                        BadAck::NotFrameEnd { .. } => p.log.end(),
                    },
                },
            );
            return;
        }
        p.received = p.receiver.frames_end();
        if p.received > p.ack_sent {
            if ack_now || p.received - p.ack_sent >= self.config.ack_bytes as u64 {
                p.ack_now = true;
                if !self.to_wake.contains(&id) {
                    self.to_wake.push(id);
                }
            } else if elicited {
                let due = now + self.config.ack_delay;
                p.ack_due = Some(p.ack_due.map_or(due, |d| d.min(due)));
            }
        }
        self.wake_all_if_drained();
    }

    /// A path's socket ended (the peer's FIN: [`TransportError::PeerClosed`]) or failed.
    pub fn handle_path_closed(&mut self, id: PathId, now: Instant, reason: TransportError) {
        self.path_gone(id, now, reason);
    }

    /// Retires a path: what it has not delivered moves to the others.
    fn path_gone(&mut self, id: PathId, now: Instant, reason: TransportError) {
        let Some(p) = self.paths.get_mut(&id) else {
            return;
        };
        if p.closed {
            return;
        }
        p.closed = true;
        self.stats.paths_closed += 1;
        let mut resent = 0;
        let unacked = &mut self.unacked_messages;
        let arrived_before = self
            .config
            .resend_missing_first
            .then(|| p.arrived_before(now, reason, self.config.ack_delay))
            .flatten();
        let (orphans, deferred) = p
            .log
            .take_orphans(arrived_before, |kind| forget_message(unacked, kind));
        // The deferred frames are the last ones.
        let first_deferred = orphans.len() - deferred;
        for (i, (orphan, kind)) in orphans.into_iter().enumerate() {
            if orphan.deadline.is_some_and(|d| d <= now) {
                // A message past its lifetime is not worth a second try (partial
                // reliability): it is lost with its connection.
                self.stats.resends_expired += 1;
                forget_message(&mut self.unacked_messages, kind);
                continue;
            }
            resent += 1;
            if i >= first_deferred {
                self.stats.resends_deferred += 1;
            }
            self.orphan_bytes += orphan.bytes.len();
            self.orphans.push_back(orphan);
        }
        self.stats.frames_resent += resent as u64;
        if resent > 0 {
            // The survivors carry them on: at once, not at their next wake-up.
            let survivors = self.paths.iter().filter(|(_, p)| p.usable());
            for (&other, _) in survivors {
                if !self.to_wake.contains(&other) {
                    self.to_wake.push(other);
                }
            }
        }
        if self.closed.len() == CLOSED_KEPT
            && let Some(oldest) = self.closed.pop_front()
        {
            // Its driver has long stopped: an unknown path is a finished one to it.
            self.paths.remove(&oldest.id);
        }
        let survivor_srtt = self
            .paths
            .values()
            .filter(|p| p.usable())
            .filter_map(|p| p.srtt)
            .min();
        let suspected = self.paths.get(&id).and_then(|p| p.suspected);
        self.closed.push_back(ClosedPath {
            id,
            at: now,
            reason,
            survivor_srtt,
            suspected,
        });
        tracing::debug!("{id} closed ({reason:?}): {resent} frames move to other paths");
        push_event(
            &mut self.events,
            &mut self.event_signal,
            PathEvent::Closed {
                path: id,
                reason,
                resent,
            },
        );
        self.last_path_error = Some(reason);
        if !self.paths.values().any(|p| !p.closed) {
            if self.session.is_closing() || self.session.error().is_some() || !self.ever_established
            {
                // Nothing left to wait for a new connection for (or the first one failed:
                // there is no session to join).
                self.tell_session_closed(now);
            } else {
                self.no_path_since = Some(now);
                push_event(&mut self.events, &mut self.event_signal, PathEvent::NoPath);
            }
        }
    }

    fn tell_session_closed(&mut self, now: Instant) {
        if !self.session_told_closed {
            self.session_told_closed = true;
            let reason = self.last_path_error.unwrap_or(TransportError::PeerClosed);
            self.session.handle_transport_closed(now, reason);
        }
    }

    // ------------------------------------------------------------------ sending

    /// The usable path with the lowest smoothed RTT (unknown RTTs last, then by id),
    /// other than `except`.
    fn lowest_rtt(&self, now: Instant, except: Option<PathId>) -> Option<PathId> {
        self.paths
            .iter()
            .filter(|(id, p)| p.usable() && Some(**id) != except)
            .min_by_key(|(id, p)| (p.steering_rtt(now), **id))
            .map(|(id, _)| *id)
    }

    /// Which paths carry a frame of `policy`, asked for by `asking`.
    fn targets(&mut self, now: Instant, policy: PathPolicy, asking: PathId) -> [Option<PathId>; 2] {
        match policy {
            PathPolicy::LowestRtt => [self.lowest_rtt(now, None).or(Some(asking)), None],
            PathPolicy::Pinned(n) if self.paths.get(&PathId(n)).is_some_and(Path::usable) => {
                [Some(PathId(n)), None]
            }
            PathPolicy::Pinned(_) => [self.lowest_rtt(now, None).or(Some(asking)), None],
            PathPolicy::RoundRobin => {
                let usable: Vec<PathId> = self
                    .paths
                    .iter()
                    .filter(|(_, p)| p.usable())
                    .map(|(id, _)| *id)
                    .collect();
                self.round_robin += 1;
                let pick = usable
                    .get((self.round_robin % usable.len().max(1) as u64) as usize)
                    .copied();
                [pick.or(Some(asking)), None]
            }
            PathPolicy::Redundant => {
                let first = self.lowest_rtt(now, None).unwrap_or(asking);
                [Some(first), self.lowest_rtt(now, Some(first))]
            }
            // Aggregate, and whatever later policies mean by default.
            _ => [Some(asking), None],
        }
    }

    /// Whether more of the session's frames may be bound to paths now.
    fn may_take_more(&self) -> bool {
        let held: usize =
            self.paths.values().map(|p| p.log.held()).sum::<usize>() + self.orphan_bytes;
        if held >= self.config.max_unacked {
            return false;
        }
        // A re-sent message must still be inside the receiver's duplicate window.
        let span = self.config.session.dedup_window / 2;
        self.unacked_messages
            .first_key_value()
            .is_none_or(|(&oldest, _)| self.session.next_message_number() - oldest < span)
    }

    /// Appends the path's records to `out` (its socket's output) until `out` holds at least
    /// `limit` bytes or nothing is left to send now; returns the session frames it took.
    /// Ask only when the socket can take more, so that the scheduler decides late.
    pub fn poll_transmit(
        &mut self,
        id: PathId,
        now: Instant,
        out: &mut Vec<u8>,
        limit: usize,
    ) -> usize {
        let Some(p) = self.paths.get_mut(&id) else {
            return 0;
        };
        // Handshake flights, KeyUpdates and alerts first.
        p.tls.poll_output(out);
        if !p.usable() {
            return 0;
        }
        let record = p.tls.max_record_plaintext();
        let wanted = limit.saturating_sub(out.len()).div_ceil(record) * record;
        let mut frames = 0;
        // A probe, when due (RTT and liveness).
        if p.probe_now {
            write_probe(p, &mut self.body, now, &self.config, &mut self.stats);
        }
        // This layer's own session frames (addresses), then what dead paths left.
        while let Some(control) = self.own_frames.pop_front() {
            write_local(&mut p.log, &mut self.body, &control, SESSION_FRAME);
        }
        while p.log.unsealed_len() < wanted
            && let Some(orphan) = self.orphans.pop_front()
        {
            self.orphan_bytes -= orphan.bytes.len();
            if orphan.deadline.is_some_and(|d| d <= now) {
                self.stats.resends_expired += 1;
                forget_message(
                    &mut self.unacked_messages,
                    Kind::Session {
                        deadline: None,
                        message: orphan.message,
                    },
                );
                continue;
            }
            p.log.push(
                &orphan.bytes,
                Kind::Session {
                    deadline: orphan.deadline,
                    message: orphan.message,
                },
            );
        }
        // The session's frames, each where its policy sends it.
        while self.paths[&id].log.unsealed_len() < wanted && self.may_take_more() {
            let p = self.paths.get_mut(&id).expect("asking path");
            let at = p.log.buffer().len();
            let Some(t) = self.session.poll_transmit(now, p.log.buffer()) else {
                break;
            };
            frames += 1;
            let (deadline, message) = match t.content {
                TransmitContent::Message {
                    number, deadline, ..
                } => (deadline, Some(number)),
                _ => (None, None),
            };
            let kind = Kind::Session { deadline, message };
            let [first, second] = self.targets(now, t.path, id);
            let first = first.unwrap_or(id);
            let mut over = false;
            if first == id && second.is_none() {
                self.paths
                    .get_mut(&id)
                    .expect("asking path")
                    .log
                    .logged(kind);
            } else {
                let p = self.paths.get_mut(&id).expect("asking path");
                p.log.cut_from(at, &mut self.scratch);
                for target in [Some(first), second].into_iter().flatten() {
                    let q = self.paths.get_mut(&target).expect("a usable path");
                    let bound = Bound {
                        frame: &self.scratch,
                        kind,
                        copy: false,
                    };
                    bind(q, bound, &mut self.body, now, &self.config, &mut self.stats);
                    if target != id {
                        over |= q.log.unsealed_len() >= UNSEALED_AHEAD;
                        if !self.to_wake.contains(&target) {
                            self.to_wake.push(target);
                        }
                    }
                }
            }
            if let Some(n) = message {
                let copies = 1 + u32::from(second.is_some());
                *self.unacked_messages.entry(n).or_default() += copies;
            }
            if over {
                // Bound to a path that is not sending: the rest waits in the session.
                break;
            }
        }
        let drained = self.session.is_drained();
        let p = self.paths.get_mut(&id).expect("asking path");
        // Acknowledge what arrived: when due, or for free with whatever goes now.
        let keepalive = std::mem::take(&mut p.ack_now);
        if keepalive || (p.received > p.ack_sent && p.log.unsealed_len() > 0) {
            let received = p.received;
            let ack = ControlFrame::PathAck { received };
            write_local(&mut p.log, &mut self.body, &ack, LOCAL_ACK);
            p.ack_sent = received;
            p.ack_due = None;
            self.stats.acks_sent += 1;
        }
        if p.outstanding_since.is_none() && p.log.awaits_ack() {
            p.outstanding_since = Some(now);
        }
        let seal_len = crate::record::seal_len(
            p.log.unsealed_len(),
            wanted,
            record,
            !self.session.is_send_finished(),
        );
        if seal_len > 0 {
            let result = p.tls.seal(&p.log.unsealed()[..seal_len], out);
            match result {
                Ok(()) => p.log.mark_sealed(seal_len, now),
                Err(e) => {
                    p.tls_failed = Some(tls_transport_error(&e));
                    p.tls.poll_output(out);
                    let reason = p.tls_failed.expect("just set");
                    self.path_gone(id, now, reason);
                    return frames;
                }
            }
        }
        if drained && p.log.unsealed_len() == 0 && !p.close_notify_out {
            // The session is over: close_notify, then the FIN (RFC 8446 §6.1).
            p.tls.send_close_notify();
            p.tls.poll_output(out);
            p.close_notify_out = true;
        }
        frames
    }

    /// Whether the path's sending direction ends now (its FIN): once the session is
    /// drained and the path's close_notify went out.
    pub fn poll_shutdown(&mut self, id: PathId) -> bool {
        let Some(p) = self.paths.get_mut(&id) else {
            return false;
        };
        if p.fin_sent || p.closed || !p.close_notify_out {
            return false;
        }
        p.fin_sent = true;
        true
    }

    // ------------------------------------------------------------------ events, timers

    /// The session's next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.session.poll_event()
    }

    /// The next event about the connections.
    pub fn poll_path_event(&mut self) -> Option<PathEvent> {
        self.events.pop_front()
    }

    /// When [`Self::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut next = self.session.poll_timeout();
        let mut at = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        let reinject = self.reinjects();
        for p in self.paths.values() {
            at(p.handshake_deadline());
        }
        for p in self.paths.values().filter(|p| p.usable()) {
            at(p.ack_due);
            at(p.next_probe);
            at(p.outstanding_since.map(|t| t + self.config.path_timeout));
            if reinject {
                at(p.suspect_at(&self.config));
            }
        }
        if !self.session_told_closed {
            at(self.no_path_since.map(|t| t + self.config.linger));
        }
        next
    }

    /// Runs the timers that are due. Acknowledgements and probes that fall due are written
    /// at their path's next poll: [`Self::take_paths_to_poll`] names those paths.
    pub fn handle_timeout(&mut self, now: Instant) {
        let blocked = self.session.receive_blocked();
        let reinject = self.reinjects();
        let mut timed_out = Vec::new();
        let mut suspects = Vec::new();
        for (&id, p) in self.paths.iter_mut().filter(|(_, p)| p.usable()) {
            let mut poll = false;
            if p.ack_due.is_some_and(|t| t <= now) {
                p.ack_due = None;
                p.ack_now = true;
                poll = true;
            }
            if p.next_probe.is_some_and(|t| t <= now) {
                p.next_probe = Some(now + self.config.probe_interval);
                if p.probe.is_none() {
                    p.probe_now = true;
                    poll = true;
                }
                if blocked {
                    // This side does not read (its application does not take what
                    // arrived): the peer's acknowledgements wait unread, so its own
                    // timeouts pause, and it tells the peer it is alive.
                    p.ack_now = true;
                    poll = true;
                }
            }
            if blocked {
                if p.outstanding_since.is_some() {
                    p.outstanding_since = Some(now);
                }
            } else if p
                .outstanding_since
                .is_some_and(|t| t + self.config.path_timeout <= now)
            {
                timed_out.push(id);
            } else if reinject && p.suspect_at(&self.config).is_some_and(|t| t <= now) {
                suspects.push(id);
            }
            if poll && !self.to_wake.contains(&id) {
                self.to_wake.push(id);
            }
        }
        let stalled: Vec<PathId> = self
            .paths
            .iter()
            .filter(|(_, p)| p.handshake_deadline().is_some_and(|t| t <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in stalled {
            self.stats.handshakes_timed_out += 1;
            self.path_gone(
                id,
                now,
                TransportError::Tls(squarepeg_session::TlsFailure::HandshakeTimedOut),
            );
        }
        for id in suspects {
            self.reinject_from(id, now);
        }
        for id in timed_out {
            self.stats.paths_timed_out += 1;
            self.path_gone(id, now, TransportError::TimedOut);
        }
        if self
            .no_path_since
            .is_some_and(|t| t + self.config.linger <= now)
        {
            self.tell_session_closed(now);
        }
        if self.session.poll_timeout().is_some_and(|t| t <= now) {
            self.session.handle_timeout(now);
        }
        self.wake_all_if_drained();
    }

    /// Whether suspect paths' frames are copied now: configured, and another usable path
    /// to copy them to.
    fn reinjects(&self) -> bool {
        self.config.reinject && self.paths.values().filter(|p| p.usable()).count() >= 2
    }

    /// Path `id` is suspect: its unacknowledged session frames without a copy go to the
    /// lowest-RTT other path, at the end of what that one has bound (the receiver takes
    /// whichever copy comes first).
    fn reinject_from(&mut self, id: PathId, now: Instant) {
        let Some(target) = self.lowest_rtt(now, Some(id)) else {
            return;
        };
        let Some(p) = self.paths.get_mut(&id) else {
            return;
        };
        // Frames bound to a path already suspect are copied as they come; the path counts
        // (and is reported) once per stall.
        let newly_suspect = p.suspected.is_none();
        p.suspected.get_or_insert(now);
        let mut copied = 0;
        for (copy, kind) in p.log.copy_uncopied() {
            if copy.deadline.is_some_and(|d| d <= now) {
                // Past its lifetime: not worth a second copy.
                continue;
            }
            let q = self.paths.get_mut(&target).expect("a usable path");
            let bound = Bound {
                frame: &copy.bytes,
                kind,
                copy: true,
            };
            bind(q, bound, &mut self.body, now, &self.config, &mut self.stats);
            if let Some(n) = copy.message {
                *self.unacked_messages.entry(n).or_default() += 1;
            }
            copied += 1;
        }
        self.stats.frames_reinjected += copied as u64;
        tracing::debug!("{id} suspect: {copied} frames copied to {target}");
        if copied > 0 && !self.to_wake.contains(&target) {
            self.to_wake.push(target);
        }
        if newly_suspect {
            self.stats.paths_suspected += 1;
            push_event(
                &mut self.events,
                &mut self.event_signal,
                PathEvent::Suspect { path: id, copied },
            );
        }
    }

    /// Once the session is drained every path sends close_notify and its FIN: all of them
    /// are polled once.
    fn wake_all_if_drained(&mut self) {
        if self.session.is_drained() && !self.drain_told {
            self.drain_told = true;
            for (&id, p) in &self.paths {
                if p.usable() && !self.to_wake.contains(&id) {
                    self.to_wake.push(id);
                }
            }
        }
    }

    /// Whether the session is over and every path has ended: the driver stops.
    pub fn is_drained(&self) -> bool {
        self.session.is_drained() && self.paths.values().all(|p| p.closed || p.fin_sent)
    }

    /// The paths that got frames to send while another path was polled (lowest-RTT,
    /// pinned, redundant steering, failover): poll them too. Taking empties the list.
    pub fn take_paths_to_poll(&mut self) -> Vec<PathId> {
        std::mem::take(&mut self.to_wake)
    }

    /// Whether a path is usable (established and not closed).
    pub fn has_usable_path(&self) -> bool {
        self.paths.values().any(Path::usable)
    }

    /// Whether path events were queued since the last call (a driver wakes whoever takes
    /// them once per batch).
    pub fn take_path_event_signal(&mut self) -> bool {
        std::mem::take(&mut self.event_signal)
    }

    /// Whether a path's driver is done with it: the path is closed (or unknown), or it sent
    /// its FIN after the session was drained.
    pub fn path_is_finished(&self, id: PathId) -> bool {
        self.paths
            .get(&id)
            .is_none_or(|p| p.closed || (p.fin_sent && self.session.is_drained()))
    }
}

/// A path's own PATH_PROBE (acknowledged), PATH_ACK (not), and this layer's session frames.
const LOCAL_ELICITS: Kind = Kind::Local { elicits_ack: true };
const LOCAL_ACK: Kind = Kind::Local { elicits_ack: false };
const SESSION_FRAME: Kind = Kind::Session {
    deadline: None,
    message: None,
};

/// Appends a PATH_PROBE to a path's log. A connection's first frame is always its probe
/// (docs/wire.md §7: the peer checks it), also when another path's poll binds frames to it
/// first.
fn write_probe(
    p: &mut Path,
    body: &mut Vec<u8>,
    now: Instant,
    config: &MultipathConfig,
    stats: &mut MultipathStats,
) {
    write_local(&mut p.log, body, &ControlFrame::PathProbe, LOCAL_ELICITS);
    p.probe_now = false;
    p.probe = Some((p.log.end(), now));
    p.next_probe = Some(now + config.probe_interval);
    stats.probes_sent += 1;
}

/// A session frame bound to a path by another path's poll or by reinjection.
struct Bound<'a> {
    frame: &'a [u8],
    kind: Kind,
    /// A copy of a frame a suspect path holds.
    copy: bool,
}

/// Appends `bound` to path `q`'s log, after the path's PATH_PROBE if it has none yet (a
/// connection's first frame is its probe, docs/wire.md §7).
fn bind(
    q: &mut Path,
    bound: Bound<'_>,
    body: &mut Vec<u8>,
    now: Instant,
    config: &MultipathConfig,
    stats: &mut MultipathStats,
) {
    if !q.probed() {
        write_probe(q, body, now, config, stats);
    }
    if bound.copy {
        q.log.push_copy(bound.frame, bound.kind);
    } else {
        q.log.push(bound.frame, bound.kind);
    }
}

/// Appends a control frame of this layer to a path's log.
fn write_local(log: &mut SentLog, body: &mut Vec<u8>, control: &ControlFrame, kind: Kind) {
    body.clear();
    // Our own control frames always encode (values within varint range).
    if control.encode(body).is_ok()
        && FrameFormat::Plain
            .encode(&FrameHeader::Control, body, log.buffer())
            .is_ok()
    {
        log.logged(kind);
    }
}

/// A logged frame left the logs (acknowledged, or dropped as expired).
fn forget_message(unacked: &mut BTreeMap<MessageNumber, u32>, kind: Kind) {
    if let Kind::Session {
        message: Some(n), ..
    } = kind
        && let Some(count) = unacked.get_mut(&n)
    {
        *count -= 1;
        if *count == 0 {
            unacked.remove(&n);
        }
    }
}
