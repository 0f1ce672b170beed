//! Simulator hosts built on squarepeg's userspace TCP (`squarepeg_tcp::Endpoint`): the voice
//! endpoints of the TCP transports and the bulk transfers of the contention scenario.
//!
//! A host owns one sans-IO endpoint and plays the application on top of it: the simulator
//! feeds it packets and timer expiries, the host moves bytes between the endpoint and its
//! application after each, and hands the endpoint's packets to the simulator.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use std::collections::{BTreeSet, HashMap};

use squarepeg_connection::{
    Config as CoreConfig, Connection as Core, EndpointLink, Substrate,
    tcp_config as core_tcp_config,
};
use squarepeg_framing::{FrameHeader, Reassembler, encode_frame};
use squarepeg_lab::sim::{Host, KIND_DATA, decode_payload, encode_payload};
use squarepeg_session::{MAX_FRAME_BODY, MessageProps, MessageStatus, Role};
use squarepeg_tcp::{
    ConnectionConfig, ConnectionHandle, Endpoint, EndpointConfig, Error as TcpError, Event,
    ListenerHandle, WriteTag,
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

pub(crate) fn endpoint(address: IpAddr, seed: u64, host: u8, now: Instant) -> Endpoint {
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
    /// The lifetime of each voice message: its playout budget (Hollywood §7.2).
    lifetime: Option<Duration>,
    /// The connection core and its link to the endpoint connection, once established.
    conn: Option<(Core, EndpointLink)>,
    /// Send side: the voice message number of each session message number.
    numbers: HashMap<u64, u64>,
    /// Send side: messages dropped unsent (lifetime over, or squashed).
    dropped: BTreeSet<u64>,
    /// Send side: messages whose retransmission carried others instead (Hollywood §4.2).
    replaced: BTreeSet<u64>,
}

impl SquarepegCodec {
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
    /// message due `lifetime` after it is sent; with `inconsistent`, expired retransmissions
    /// carry live messages instead.
    pub fn unordered(lifetime: Duration, inconsistent: bool) -> Self {
        let window = ConnectionConfig::default().recv_buffer;
        Self::squarepeg(Substrate::utcp(window), inconsistent, Some(lifetime))
    }

    fn squarepeg(substrate: Substrate, inconsistent: bool, lifetime: Option<Duration>) -> Self {
        Self::Squarepeg(Box::new(SquarepegCodec {
            substrate,
            inconsistent,
            lifetime,
            conn: None,
            numbers: HashMap::new(),
            dropped: BTreeSet::new(),
            replaced: BTreeSet::new(),
        }))
    }

    /// The connection options this codec needs at either end.
    pub fn connection_config(&self) -> ConnectionConfig {
        match self {
            Self::Squarepeg(c) => {
                core_tcp_config(ConnectionConfig::default(), c.substrate, c.inconsistent)
            }
            Self::Records { .. } => ConnectionConfig::default(),
        }
    }
}

/// The uTCP receive path (Minion §4.1, §5.2): reads every segment waiting on `h`, puts it
/// into `reassembler` at its offset, and hands the payload of every whole message frame to
/// `on_message` at once, in whatever order frames complete. The same message may come more
/// than once (a spurious or inconsistent retransmission); the caller deduplicates.
pub(crate) fn read_unordered(
    ep: &mut Endpoint,
    h: ConnectionHandle,
    reassembler: &mut Reassembler,
    buf: &mut [u8],
    errors: &mut Vec<String>,
    mut on_message: impl FnMut(&[u8]),
) {
    loop {
        let segment = match ep.read_segment(h, buf) {
            Ok(s) if s.len > 0 => s,
            Ok(_) | Err(TcpError::WouldBlock) => break,
            Err(e) => {
                errors.push(format!("read_segment: {e}"));
                break;
            }
        };
        if let Err(e) = reassembler.insert(segment.offset, &buf[..segment.len]) {
            errors.push(format!("reassembly: {e}"));
        }
        while let Some(frame) = reassembler.next_frame() {
            // A frame mixing two transmissions fails its checksum (Hollywood §4.5); its
            // message arrives whole in one of them.
            if let Ok(frame) = frame
                && let FrameHeader::Message { .. } = frame.frame.header
            {
                on_message(&frame.frame.payload);
            }
        }
    }
}

/// A reassembler for a uTCP receiver with the default receive buffer: the TCP receive
/// window plus one maximal frame, so that no segment TCP accepts is refused
/// (squarepeg_framing::reassembler, "Memory").
pub(crate) fn unordered_reassembler() -> Result<Reassembler, squarepeg_framing::ReassemblyError> {
    let limit = ConnectionConfig::default().recv_buffer + Reassembler::min_limit(MAX_FRAME_BODY);
    Reassembler::new(MAX_FRAME_BODY, limit)
}

/// Writes `payload` as message `number`'s uCOBS message frame with `write_message` and
/// `tag` (all or nothing; `WouldBlock` when the send buffer has no room).
pub(crate) fn write_message_frame(
    ep: &mut Endpoint,
    h: ConnectionHandle,
    frame: &mut Vec<u8>,
    number: u64,
    payload: &[u8],
    tag: WriteTag,
) -> Result<(), TcpError> {
    frame.clear();
    encode_frame(
        &FrameHeader::Message {
            substream: 0,
            number,
        },
        payload,
        frame,
    )
    .map_err(|_| TcpError::BadRecord("the message does not fit a uCOBS frame"))?;
    ep.write_message(h, frame, tag)
}

/// Which end of the call a host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// Listens and sends the voice.
    Sender,
    /// Connects at the start of the run and receives the voice.
    Receiver,
}

/// One end of a voice call over squarepeg's TCP in standard mode.
#[derive(Debug)]
pub struct TcpVoiceHost {
    ep: Endpoint,
    address: IpAddr,
    end: CallEnd,
    epoch: Instant,
    config: VoipConfig,
    codec: StreamCodec,
    listener: Option<ListenerHandle>,
    conn: Option<ConnectionHandle>,
    next_number: u64,
    sent: Vec<Option<Duration>>,
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
            codec,
            listener: None,
            conn: None,
            next_number: 0,
            sent: Vec::new(),
            arrivals: Vec::new(),
            unsent: Vec::new(),
            packet: vec![0; PACKET_BUFFER],
            read_buf: vec![0; READ_CHUNK],
            errors: Vec::new(),
        }
    }

    /// Per message number, when it was handed to the transport (from the epoch).
    pub fn sent(&self) -> &[Option<Duration>] {
        &self.sent
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
        (self.end == CallEnd::Sender && self.next_number < self.config.count)
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
            let at = now.saturating_duration_since(self.epoch);
            let message = encode_payload(KIND_DATA, number, at, self.config.message_bytes);
            let accepted = self.established()
                && match &mut self.codec {
                    StreamCodec::Records { .. } => {
                        encode_record(&message, &mut self.unsent);
                        true
                    }
                    StreamCodec::Squarepeg(c) => {
                        let props = MessageProps {
                            lifetime: c.lifetime,
                            ..MessageProps::default()
                        };
                        match c.conn.as_mut() {
                            Some((core, _)) => {
                                match core.session_mut().send_message(now, message, props) {
                                    Ok(n) => {
                                        c.numbers.insert(n, number);
                                        true
                                    }
                                    Err(e) => {
                                        self.errors.push(format!("message {number}: {e}"));
                                        false
                                    }
                                }
                            }
                            None => false,
                        }
                    }
                };
            self.sent.push(accepted.then_some(at));
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
    }

    fn start_session(&mut self, role: Role) {
        if let (StreamCodec::Squarepeg(c), Some(h)) = (&mut self.codec, self.conn) {
            match Core::new(role, CoreConfig::default(), c.substrate) {
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
                squarepeg_session::Event::MessageStatus { number, status } => {
                    let voice = c.numbers.get(&number).copied().unwrap_or(number);
                    match status {
                        MessageStatus::Expired | MessageStatus::Squashed => {
                            c.dropped.insert(voice);
                        }
                        MessageStatus::Replaced => {
                            c.replaced.insert(voice);
                        }
                        _ => {}
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
            let at = now.saturating_duration_since(self.epoch);
            self.take_squarepeg(at);
            return;
        }
        if !self.unsent.is_empty()
            && let Ok(n) = self.ep.write(h, &self.unsent)
        {
            self.unsent.drain(..n);
        }
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

/// `Host` for a simulator host that is one `Endpoint` (`ep`) at one `address`, with a
/// `packet` buffer and a `process(now)` that runs its application after every event.
macro_rules! endpoint_host {
    ($t:ty) => {
        impl squarepeg_lab::sim::Host for $t {
            fn addresses(&self) -> Vec<std::net::IpAddr> {
                vec![self.address]
            }
            fn handle_packet(&mut self, now: std::time::Instant, packet: Vec<u8>) {
                let _ = self.ep.handle_packet(now, &packet);
                self.process(now);
            }
            fn poll_transmit(&mut self, now: std::time::Instant) -> Option<Vec<u8>> {
                let n = self.ep.poll_transmit(now, &mut self.packet)?;
                Some(self.packet[..n].to_vec())
            }
            fn poll_timeout(&mut self) -> Option<std::time::Instant> {
                self.ep.poll_timeout()
            }
            fn handle_timeout(&mut self, now: std::time::Instant) {
                self.ep.handle_timeout(now);
                self.process(now);
            }
        }
    };
}
pub(crate) use endpoint_host;

endpoint_host!(BulkServer);

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
