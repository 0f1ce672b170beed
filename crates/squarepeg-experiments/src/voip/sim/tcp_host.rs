//! Simulator hosts built on squarepeg's userspace TCP (`squarepeg_tcp::Endpoint`): the voice
//! endpoints of the TCP transports (also the network-limited sender of the priority
//! experiment, [`Pacing::NetworkLimited`]) and the bulk transfers of the contention scenario.
//!
//! A host owns one sans-IO endpoint and plays the application on top of it: the simulator
//! feeds it packets and timer expiries, the host moves bytes between the endpoint and its
//! application after each, and hands the endpoint's packets to the simulator.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use squarepeg_connection::{
    Config as CoreConfig, Connection as Core, EndpointLink, Receive, Send, SessionConfig,
    Substrate, TlsSetup, TlsStats, tcp_config as core_tcp_config,
};
use squarepeg_lab::sim::{Host, KIND_DATA, decode_payload, encode_payload};
use squarepeg_session::{MessageProps, MessageStatus, Priority, Role, SendError};
use squarepeg_tcp::{
    ConnectionConfig, ConnectionHandle, Endpoint, EndpointConfig, Event, ListenerHandle,
};

use crate::voip::config::{MAX_MESSAGE_BYTES, VoipConfig};
use crate::voip::wire::{encode_record, take_records};

/// Largest packet the hosts send (the lab's links have no smaller MTU).
const PACKET_BUFFER: usize = 1500;
/// Bytes read from an endpoint per call.
const READ_CHUNK: usize = 64 * 1024;

/// An endpoint secret derived from the run's seed and a host index, so that a seed fixes
/// every ISN and timestamp offset.
pub fn secret(seed: u64, host: u8) -> [u8; 32] {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s[8] = host;
    s[31] = 0x5a;
    s
}

fn endpoint(address: IpAddr, seed: u64, host: u8, now: Instant) -> Endpoint {
    let mut config = EndpointConfig::default();
    config.secret = secret(seed, host);
    config.local_addresses = vec![address];
    Endpoint::new(config, now)
}

/// How the voice messages are carried over the TCP byte stream.
#[derive(Debug)]
pub enum StreamCodec {
    /// Length-prefixed records (the plain-TCP baseline); the receive buffer holds a partial
    /// record.
    Records {
        /// Bytes received but not yet a whole record.
        partial: Vec<u8>,
    },
    /// squarepeg messages through the library's connection core
    /// (`squarepeg_connection::Connection`, driven on the endpoint by its `EndpointLink`):
    /// what a user of `squarepeg::Connection` gets, on either substrate.
    Squarepeg(Box<SquarepegCodec>),
}

/// The state of [`StreamCodec::Squarepeg`] at either end.
#[derive(Debug)]
pub struct SquarepegCodec {
    substrate: Substrate,
    /// Inconsistent retransmissions (Hollywood §4.2), on the uTCP substrate.
    inconsistent: bool,
    /// TLS 1.3 in the connection core, both sides' set-ups (each end takes its role's).
    tls: Option<TlsPair>,
    /// The lifetime of each voice message: its playout budget (Hollywood §7.2).
    lifetime: Option<Duration>,
    /// The endpoint connection's settings before the substrate's uTCP options.
    tcp: ConnectionConfig,
    /// The session's limits.
    session: SessionConfig,
    /// The connection core and its link to the endpoint connection, once established.
    conn: Option<(Core, EndpointLink)>,
    /// Send side: the voice message number of each session message number.
    numbers: HashMap<u64, u64>,
    /// Send side: messages dropped unsent (lifetime over, or squashed).
    dropped: BTreeSet<u64>,
    /// Send side: messages whose retransmission carried others instead (Hollywood §4.2).
    replaced: BTreeSet<u64>,
    /// Send side, network-limited over tagged writes: session numbers of the messages handed
    /// over that have not entered the TCP's send queue yet (they wait in the session, or
    /// for room in the TCP's send buffer).
    outside_tcp: Vec<u64>,
}

/// The client's and the server's TLS set-ups of one call (the client trusts the server's
/// certificate).
#[derive(Debug, Clone)]
pub struct TlsPair {
    /// The connecting end's (the voice receiver's).
    pub client: TlsSetup,
    /// The listening end's (the voice sender's).
    pub server: TlsSetup,
}

impl TlsPair {
    fn for_role(&self, role: Role) -> TlsSetup {
        match role {
            Role::Client => self.client.clone(),
            Role::Server => self.server.clone(),
        }
    }
}

impl SquarepegCodec {
    /// The record layer's counters, over TLS once the connection exists.
    pub fn tls_stats(&self) -> Option<TlsStats> {
        self.conn.as_ref().and_then(|(core, _)| core.stats().tls)
    }

    /// Messages the sender replaced in a retransmission.
    pub fn replaced(&self) -> &BTreeSet<u64> {
        &self.replaced
    }

    /// Messages the sender dropped unsent.
    pub fn dropped(&self) -> &BTreeSet<u64> {
        &self.dropped
    }
}

impl StreamCodec {
    /// Length-prefixed records.
    pub fn records() -> Self {
        Self::Records {
            partial: Vec::new(),
        }
    }

    /// squarepeg over the in-order byte stream (what kernel TCP gives), each message with
    /// `lifetime`.
    pub fn session(lifetime: Option<Duration>) -> Self {
        Self::squarepeg(Substrate::byte_stream(), false, lifetime)
    }

    /// squarepeg over the uTCP interface (unordered segments in, tagged writes out), each
    /// message due `lifetime` after it is sent (`None`: never dropped); with `inconsistent`,
    /// expired retransmissions carry live messages instead.
    pub fn unordered(lifetime: Option<Duration>, inconsistent: bool) -> Self {
        let window = ConnectionConfig::default().recv_buffer;
        Self::squarepeg(Substrate::utcp(window), inconsistent, lifetime)
    }

    fn squarepeg(substrate: Substrate, inconsistent: bool, lifetime: Option<Duration>) -> Self {
        Self::Squarepeg(Box::new(SquarepegCodec {
            substrate,
            inconsistent,
            tls: None,
            lifetime,
            tcp: ConnectionConfig::default(),
            session: SessionConfig::default(),
            conn: None,
            numbers: HashMap::new(),
            dropped: BTreeSet::new(),
            replaced: BTreeSet::new(),
            outside_tcp: Vec::new(),
        }))
    }

    /// squarepeg over TCP connections with `tcp`'s buffers (the uTCP receiver's reassembler
    /// follows its receive buffer). No effect on [`StreamCodec::Records`].
    pub fn with_tcp(mut self, tcp: ConnectionConfig) -> Self {
        if let Self::Squarepeg(c) = &mut self {
            if let Receive::Segments { .. } = c.substrate.receive {
                c.substrate = Substrate::utcp(tcp.recv_buffer);
            }
            c.tcp = tcp;
        }
        self
    }

    /// squarepeg over TLS 1.3 with `tls` (records numbered and read out of order on the uTCP
    /// substrate). No effect on [`StreamCodec::Records`].
    pub fn with_tls(mut self, tls: TlsPair) -> Self {
        if let Self::Squarepeg(c) = &mut self {
            c.tls = Some(tls);
        }
        self
    }

    /// squarepeg with the session's limits `session` (its message queue, windows). No effect
    /// on [`StreamCodec::Records`].
    pub fn with_session(mut self, session: SessionConfig) -> Self {
        if let Self::Squarepeg(c) = &mut self {
            c.session = session;
        }
        self
    }

    /// The connection options this codec needs at either end.
    pub fn connection_config(&self) -> ConnectionConfig {
        match self {
            // With inconsistent retransmissions the link installs the connection's own padder
            // (under TLS, padding records).
            Self::Squarepeg(c) => core_tcp_config(c.tcp.clone(), c.substrate, c.inconsistent),
            Self::Records { .. } => ConnectionConfig::default(),
        }
    }
}

/// Which end of the call a host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// Listens and sends the voice.
    Sender,
    /// Connects at the start of the run and receives the voice.
    Receiver,
}

/// When the sending application hands its messages to the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// The voice call: message `n` at [`VoipConfig::due`]`(n)`, [`VoipConfig::count`] of them,
    /// each at the default priority.
    Schedule,
    /// A network-limited sender (Minion §8.3): from the start until `stop` it hands over the
    /// next message whenever the transport takes one (over squarepeg: whenever the session's
    /// message queue has room), so the transport always holds as much as it will take. With
    /// `high_priority_every`, the last message of every group of that many is sent at
    /// [`Priority::HIGHEST`], the others at [`Priority::DEFAULT`].
    NetworkLimited {
        /// When the sender stops.
        stop: Instant,
        /// One message in this many is high priority.
        high_priority_every: Option<u64>,
    },
}

impl Pacing {
    /// The priority of message `number`.
    fn priority(&self, number: u64) -> Priority {
        match *self {
            Pacing::NetworkLimited {
                high_priority_every: Some(every),
                ..
            } if every > 0 && number % every == every - 1 => Priority::HIGHEST,
            _ => Priority::DEFAULT,
        }
    }
}

/// What happened to the sender's messages below the session, in order (see
/// [`TcpVoiceHost::timeline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderStep {
    /// Message `number` entered the TCP's tagged send queue (uTCP interface,
    /// network-limited pacing only), where priority insertion happens (Minion §4.2).
    Queued(u64),
    /// The connection reported message `number` `Sent`: over the uTCP interface, for a
    /// message without a lifetime, its first transmission (`squarepeg_connection`, "Message
    /// statuses").
    Sent(u64),
}

/// One end of a voice call over squarepeg's TCP in standard mode.
#[derive(Debug)]
pub struct TcpVoiceHost {
    ep: Endpoint,
    address: IpAddr,
    end: CallEnd,
    epoch: Instant,
    config: VoipConfig,
    pacing: Pacing,
    codec: StreamCodec,
    listener: Option<ListenerHandle>,
    conn: Option<ConnectionHandle>,
    next_number: u64,
    sent: Vec<Option<Duration>>,
    timeline: Vec<SenderStep>,
    arrivals: Vec<(u64, Duration)>,
    /// Bytes the endpoint has not taken yet (its send buffer was full).
    unsent: Vec<u8>,
    packet: Vec<u8>,
    read_buf: Vec<u8>,
    errors: Vec<String>,
}

impl TcpVoiceHost {
    /// The sending end, listening on `local`.
    pub fn sender(
        local: SocketAddr,
        epoch: Instant,
        config: VoipConfig,
        codec: StreamCodec,
        seed: u64,
    ) -> Self {
        let mut host = Self::new(local.ip(), CallEnd::Sender, epoch, config, codec, seed, 1);
        let conn_config = host.codec.connection_config();
        match host.ep.listen(local, 4, conn_config) {
            Ok(l) => host.listener = Some(l),
            Err(e) => host.errors.push(format!("listen on {local}: {e}")),
        }
        host
    }

    /// The receiving end at `local`, connecting to `remote` at the epoch.
    pub fn receiver(
        local: SocketAddr,
        remote: SocketAddr,
        epoch: Instant,
        config: VoipConfig,
        codec: StreamCodec,
        seed: u64,
    ) -> Self {
        let mut host = Self::new(local.ip(), CallEnd::Receiver, epoch, config, codec, seed, 2);
        let conn_config = host.codec.connection_config();
        match host.ep.connect(epoch, local, remote, conn_config) {
            Ok(c) => host.conn = Some(c),
            Err(e) => host.errors.push(format!("connect to {remote}: {e}")),
        }
        host
    }

    fn new(
        address: IpAddr,
        end: CallEnd,
        epoch: Instant,
        config: VoipConfig,
        codec: StreamCodec,
        seed: u64,
        index: u8,
    ) -> Self {
        Self {
            ep: endpoint(address, seed, index, epoch),
            address,
            end,
            epoch,
            config,
            pacing: Pacing::Schedule,
            codec,
            listener: None,
            conn: None,
            next_number: 0,
            sent: Vec::new(),
            timeline: Vec::new(),
            arrivals: Vec::new(),
            unsent: Vec::new(),
            packet: vec![0; PACKET_BUFFER],
            read_buf: vec![0; READ_CHUNK],
            errors: Vec::new(),
        }
    }

    /// The sender with `pacing` instead of the voice schedule.
    pub fn with_pacing(mut self, pacing: Pacing) -> Self {
        self.pacing = pacing;
        self
    }

    /// Per message number, when it was handed to the transport (from the epoch).
    pub fn sent(&self) -> &[Option<Duration>] {
        &self.sent
    }

    /// When the sender's messages entered the TCP's send queue and were reported `Sent`, in
    /// the order it happened: the host notes entries right after the link wrote them, and a
    /// status before the next entry (the TCP transmits, and so reports, only between host
    /// calls, before which the host takes every report).
    pub fn timeline(&self) -> &[SenderStep] {
        &self.timeline
    }

    /// Messages received: number and arrival (from the epoch).
    pub fn arrivals(&self) -> &[(u64, Duration)] {
        &self.arrivals
    }

    /// The codec (for what it recorded).
    pub fn codec(&self) -> &StreamCodec {
        &self.codec
    }

    /// What went wrong, if anything (errors from the endpoint, the session or the peer).
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    fn established(&self) -> bool {
        match &self.codec {
            // Only the sender sends, and its connection is set once accepted (established).
            StreamCodec::Records { .. } => self.conn.is_some(),
            StreamCodec::Squarepeg(c) => c.conn.is_some(),
        }
    }

    fn next_due(&self) -> Option<Instant> {
        (self.end == CallEnd::Sender
            && self.pacing == Pacing::Schedule
            && self.next_number < self.config.count)
            .then(|| self.epoch + self.config.due(self.next_number))
    }

    /// Sends every message due by `now`.
    fn send_due(&mut self, now: Instant) {
        while let Some(due) = self.next_due() {
            if due > now {
                break;
            }
            let number = self.next_number;
            self.next_number += 1;
            let accepted = self.hand_over(now, number);
            let at = now.saturating_duration_since(self.epoch);
            self.sent.push(accepted.then_some(at));
        }
    }

    /// Network-limited pacing: hands messages over while the transport takes them, each
    /// moved on into the TCP at once (as a driver would), so that the next finds room.
    fn send_while_taken(&mut self, now: Instant) {
        let Pacing::NetworkLimited { stop, .. } = self.pacing else {
            return;
        };
        while self.end == CallEnd::Sender && now < stop && self.hand_over(now, self.next_number) {
            let at = now.saturating_duration_since(self.epoch);
            self.sent.push(Some(at));
            self.next_number += 1;
            self.write(now);
        }
    }

    /// Hands message `number` to the transport now; whether it took it. A network-limited
    /// writer of records waits while the endpoint holds some of its bytes, as a socket writer
    /// waits while its buffer is full.
    fn hand_over(&mut self, now: Instant, number: u64) -> bool {
        if !self.established() {
            return false;
        }
        let at = now.saturating_duration_since(self.epoch);
        let message = encode_payload(KIND_DATA, number, at, self.config.message_bytes);
        let network_limited = self.pacing != Pacing::Schedule;
        match &mut self.codec {
            StreamCodec::Records { .. } => {
                let room = !network_limited || self.unsent.is_empty();
                if room {
                    encode_record(&message, &mut self.unsent);
                }
                room
            }
            StreamCodec::Squarepeg(c) => {
                let props = MessageProps {
                    lifetime: c.lifetime,
                    priority: self.pacing.priority(number),
                    ..MessageProps::default()
                };
                let Some((core, _)) = c.conn.as_mut() else {
                    return false;
                };
                match core.session_mut().send_message(now, message, props) {
                    Ok(n) => {
                        c.numbers.insert(n, number);
                        if network_limited && c.substrate.send == Send::TaggedWrites {
                            c.outside_tcp.push(n);
                        }
                        true
                    }
                    // The session's queue is full: a network-limited sender waits.
                    Err(SendError::QueueFull { .. }) if network_limited => false,
                    Err(e) => {
                        self.errors.push(format!("message {number}: {e}"));
                        false
                    }
                }
            }
        }
    }

    /// Moves bytes and events between the endpoint and the application.
    fn process(&mut self, now: Instant) {
        while let Some(event) = self.ep.poll_event() {
            match event {
                Event::Connected(h) => {
                    self.conn = Some(h);
                    self.start_session(Role::Client);
                }
                Event::Incoming(l) => {
                    if let Some(h) = self.ep.accept(l) {
                        if self.conn.is_none() {
                            self.conn = Some(h);
                            self.start_session(Role::Server);
                        } else {
                            let _ = self.ep.abort(now, h);
                        }
                    }
                }
                Event::Closed(_, reason) => self.errors.push(format!("closed: {reason:?}")),
                Event::Readable(_) | Event::Writable(_) | Event::PeerFin(_) => {}
            }
        }
        self.read(now);
        self.write(now);
        self.send_while_taken(now);
    }

    fn start_session(&mut self, role: Role) {
        if let (StreamCodec::Squarepeg(c), Some(h)) = (&mut self.codec, self.conn) {
            let mut config = CoreConfig::default();
            config.session = c.session.clone();
            config.tls = c.tls.as_ref().map(|t| t.for_role(role));
            match Core::new(role, config, c.substrate) {
                Ok(core) => c.conn = Some((core, EndpointLink::new(h))),
                Err(e) => self.errors.push(format!("connection: {e}")),
            }
        }
    }

    fn read(&mut self, now: Instant) {
        let Some(h) = self.conn else { return };
        if let StreamCodec::Squarepeg(_) = self.codec {
            // Its link moves data both ways at once: `write`, which follows every read.
            return;
        }
        let at = now.saturating_duration_since(self.epoch);
        loop {
            let n = match self.ep.read(h, &mut self.read_buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let data = &self.read_buf[..n];
            if let StreamCodec::Records { partial } = &mut self.codec {
                partial.extend_from_slice(data);
                match take_records(partial, MAX_MESSAGE_BYTES) {
                    Ok(records) => {
                        for r in records {
                            if let Some((KIND_DATA, number, _)) = decode_payload(&r) {
                                self.arrivals.push((number, at));
                            }
                        }
                    }
                    Err(e) => self.errors.push(e.to_string()),
                }
            }
        }
    }

    /// What the connection core has for the application: voice messages (each number
    /// once, as soon as it is complete), the sender's message statuses, the end.
    fn take_squarepeg(&mut self, at: Duration) {
        let StreamCodec::Squarepeg(c) = &mut self.codec else {
            return;
        };
        let Some((core, _)) = c.conn.as_mut() else {
            return;
        };
        while let Some(m) = core.session_mut().poll_message() {
            if let Some((KIND_DATA, number, _)) = decode_payload(&m.payload) {
                self.arrivals.push((number, at));
            }
        }
        while let Some(event) = core.poll_event() {
            match event {
                squarepeg_session::Event::MessageStatus { numbers, status } => {
                    for number in numbers {
                        let voice = c.numbers.get(&number).copied().unwrap_or(number);
                        match status {
                            MessageStatus::Expired | MessageStatus::Squashed => {
                                c.dropped.insert(voice);
                            }
                            MessageStatus::Replaced => {
                                c.replaced.insert(voice);
                            }
                            MessageStatus::Sent => self.timeline.push(SenderStep::Sent(voice)),
                            _ => {}
                        }
                    }
                }
                squarepeg_session::Event::ConnectionLost(e) => {
                    self.errors.push(format!("session lost: {e}"));
                }
                _ => {}
            }
        }
    }

    fn write(&mut self, now: Instant) {
        let Some(h) = self.conn else { return };
        if let StreamCodec::Squarepeg(c) = &mut self.codec {
            // The core binds frames as late as the endpoint lets it.
            if let Some((core, link)) = c.conn.as_mut() {
                link.drive(now, core, &mut self.ep);
            }
            // Statuses first: the reports the link just took are of transmissions before
            // this call, so before anything it wrote.
            let at = now.saturating_duration_since(self.epoch);
            self.take_squarepeg(at);
            self.note_queued(h);
            return;
        }
        if !self.unsent.is_empty()
            && let Ok(n) = self.ep.write(h, &self.unsent)
        {
            self.unsent.drain(..n);
        }
    }
}

impl TcpVoiceHost {
    /// Network-limited over tagged writes: notes the messages that entered the TCP's send
    /// queue in the last drive of the link. They are among the TCP's writes not yet
    /// transmitted: the link writes only in [`Self::write`], and the TCP transmits only after
    /// the host returns.
    fn note_queued(&mut self, h: ConnectionHandle) {
        let StreamCodec::Squarepeg(c) = &mut self.codec else {
            return;
        };
        if c.outside_tcp.is_empty() {
            return;
        }
        let mut queued = BTreeSet::new();
        let _ = self.ep.send_queue(h, |q| {
            queued.extend(q.pending_writes().filter_map(|(_, tag)| tag.message_id));
        });
        c.outside_tcp.retain(|n| {
            let entered = queued.contains(n);
            if entered {
                let voice = c.numbers.get(n).copied().unwrap_or(*n);
                self.timeline.push(SenderStep::Queued(voice));
            }
            !entered
        });
    }
}

impl Host for TcpVoiceHost {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.address]
    }

    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>) {
        let _ = self.ep.handle_packet(now, &packet);
        self.process(now);
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        let n = self.ep.poll_transmit(now, &mut self.packet)?;
        Some(self.packet[..n].to_vec())
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        let session = match &self.codec {
            StreamCodec::Squarepeg(c) => c.conn.as_ref().and_then(|(core, _)| core.poll_timeout()),
            StreamCodec::Records { .. } => None,
        };
        [self.ep.poll_timeout(), self.next_due(), session]
            .into_iter()
            .flatten()
            .min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.ep.handle_timeout(now);
        if let StreamCodec::Squarepeg(c) = &mut self.codec
            && let Some((core, _)) = c.conn.as_mut()
        {
            core.handle_timeout(now);
        }
        self.process(now);
        self.send_due(now);
        self.write(now);
    }
}

/// Bulk TCP downloads for the contention scenario: the server end, which writes as fast as
/// TCP takes data on every connection it accepts, until `stop`.
#[derive(Debug)]
pub struct BulkServer {
    ep: Endpoint,
    address: IpAddr,
    conns: Vec<ConnectionHandle>,
    stop: Instant,
    chunk: Vec<u8>,
    packet: Vec<u8>,
}

impl BulkServer {
    /// Listens on `local`; stops writing at `stop`.
    pub fn new(local: SocketAddr, epoch: Instant, stop: Instant, seed: u64) -> Self {
        let mut ep = endpoint(local.ip(), seed, 3, epoch);
        // Listening on a fresh endpoint cannot fail but for a zero backlog.
        let _ = ep.listen(local, 16, ConnectionConfig::default());
        Self {
            ep,
            address: local.ip(),
            conns: Vec::new(),
            stop,
            chunk: vec![0; READ_CHUNK],
            packet: vec![0; PACKET_BUFFER],
        }
    }

    fn process(&mut self, now: Instant) {
        while let Some(event) = self.ep.poll_event() {
            if let Event::Incoming(l) = event {
                while let Some(h) = self.ep.accept(l) {
                    self.conns.push(h);
                }
            }
        }
        if now < self.stop {
            for &h in &self.conns {
                while matches!(self.ep.write(h, &self.chunk), Ok(n) if n > 0) {}
            }
        }
    }
}

impl Host for BulkServer {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.address]
    }
    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>) {
        let _ = self.ep.handle_packet(now, &packet);
        self.process(now);
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        let n = self.ep.poll_transmit(now, &mut self.packet)?;
        Some(self.packet[..n].to_vec())
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        self.ep.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.ep.handle_timeout(now);
        self.process(now);
    }
}

/// The client end of the bulk downloads: opens one connection at each start time and reads
/// and discards everything.
#[derive(Debug)]
pub struct BulkClient {
    ep: Endpoint,
    local: SocketAddr,
    server: SocketAddr,
    starts: Vec<Instant>,
    conns: Vec<ConnectionHandle>,
    received: u64,
    buf: Vec<u8>,
    packet: Vec<u8>,
}

impl BulkClient {
    /// Connects from `local` (port 0: ephemeral ports) to `server` at each of `starts`.
    pub fn new(
        local: SocketAddr,
        server: SocketAddr,
        epoch: Instant,
        mut starts: Vec<Instant>,
        seed: u64,
    ) -> Self {
        starts.sort_unstable_by(|a, b| b.cmp(a)); // popped from the end, earliest first
        Self {
            ep: endpoint(local.ip(), seed, 4, epoch),
            local,
            server,
            starts,
            conns: Vec::new(),
            received: 0,
            buf: vec![0; READ_CHUNK],
            packet: vec![0; PACKET_BUFFER],
        }
    }

    /// Bytes received over all flows.
    pub fn received(&self) -> u64 {
        self.received
    }

    fn process(&mut self, now: Instant) {
        while self.starts.last().is_some_and(|&t| t <= now) {
            self.starts.pop();
            if let Ok(h) =
                self.ep
                    .connect(now, self.local, self.server, ConnectionConfig::default())
            {
                self.conns.push(h);
            }
        }
        while self.ep.poll_event().is_some() {}
        for &h in &self.conns {
            while let Ok(n) = self.ep.read(h, &mut self.buf) {
                if n == 0 {
                    break;
                }
                self.received += n as u64;
            }
        }
    }
}

impl Host for BulkClient {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.local.ip()]
    }
    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>) {
        let _ = self.ep.handle_packet(now, &packet);
        self.process(now);
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        let n = self.ep.poll_transmit(now, &mut self.packet)?;
        Some(self.packet[..n].to_vec())
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        [self.ep.poll_timeout(), self.starts.last().copied()]
            .into_iter()
            .flatten()
            .min()
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.ep.handle_timeout(now);
        self.process(now);
    }
}
