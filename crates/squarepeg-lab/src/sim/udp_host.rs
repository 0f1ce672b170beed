//! A tiny UDP endpoint for the simulator: sends datagrams on a schedule and records when each
//! arrives. It is the lab's own test host and the "UDP" reference transport of the VoIP
//! experiment (Hollywood §5.1.2; Minion §8.2 compares against UDP the same way).
//!
//! Every datagram starts with a 24-byte header, big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `SPLB` |
//! | 4 | kind: 0 data, 1 echo |
//! | 5..8 | zero |
//! | 8..16 | sequence number within the sending flow |
//! | 16..24 | send time, nanoseconds since the sender's epoch |
//!
//! and is zero-padded to the flow's payload length. Hosts that share an epoch (in the
//! simulator: [`Simulator::start`](super::Simulator::start)) measure one-way delay from it.

use std::collections::{HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use thiserror::Error;

use super::Host;

/// Bytes of the datagram header; the smallest payload a flow may send.
pub const MIN_PAYLOAD: usize = 24;
const MAGIC: &[u8; 4] = b"SPLB";

/// Why a flow cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UdpHostError {
    /// Payload smaller than the header.
    #[error("payload of {0} bytes is below the {MIN_PAYLOAD}-byte datagram header")]
    PayloadTooSmall(usize),
    /// Payload that does not fit one IP packet.
    #[error("payload of {0} bytes does not fit in one IP packet")]
    PayloadTooLarge(usize),
    /// A zero interval would send every datagram at one instant.
    #[error("a periodic flow needs an interval above zero")]
    ZeroInterval,
    /// IPv4 host, IPv6 destination or the reverse.
    #[error("destination {0} is not of the host's address family")]
    AddressFamily(SocketAddr),
}

/// Datagrams sent at a fixed interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodicFlow {
    /// Where to.
    pub dest: SocketAddr,
    /// Source port (identifies the flow at the receiver).
    pub src_port: u16,
    /// UDP payload bytes per datagram (at least [`MIN_PAYLOAD`]).
    pub payload_len: usize,
    /// Time between datagrams.
    pub interval: Duration,
    /// Datagrams to send.
    pub count: u64,
    /// When the first is sent, after the host's epoch.
    pub start: Duration,
}

impl PeriodicFlow {
    /// Hollywood §5.1.2's VoIP stream: a 160-byte message every 20 ms (G.711), 3000 messages
    /// (one minute).
    pub fn voip(dest: SocketAddr, src_port: u16) -> Self {
        Self {
            dest,
            src_port,
            payload_len: 160,
            interval: Duration::from_millis(20),
            count: 3000,
            start: Duration::ZERO,
        }
    }
}

/// A data datagram as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Sender address and port.
    pub from: SocketAddr,
    /// Local port.
    pub to_port: u16,
    /// Sequence number within the sender's flow.
    pub seq: u64,
    /// When the sender sent it.
    pub sent_at: Instant,
    /// When it arrived.
    pub received_at: Instant,
    /// UDP payload bytes.
    pub payload_len: usize,
    /// True if the same (sender, port, seq) arrived before.
    pub duplicate: bool,
}

impl Arrival {
    /// One-way delay.
    pub fn one_way_delay(&self) -> Duration {
        self.received_at.saturating_duration_since(self.sent_at)
    }
}

/// A round trip measured from an echoed datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttSample {
    /// The echoing peer.
    pub peer: SocketAddr,
    /// Sequence number of the echoed datagram.
    pub seq: u64,
    /// When it was sent.
    pub sent_at: Instant,
    /// Send to echo arrival.
    pub rtt: Duration,
}

#[derive(Debug, Clone)]
struct FlowState {
    flow: PeriodicFlow,
    sent: u64,
}

impl FlowState {
    /// When the next datagram is due; `None` when the flow is done (or its schedule runs
    /// past what an `Instant` can hold).
    fn next_send(&self, epoch: Instant) -> Option<Instant> {
        if self.sent >= self.flow.count {
            return None;
        }
        let offset = self.flow.interval.as_nanos() * u128::from(self.sent);
        let offset = Duration::from_nanos(u64::try_from(offset).ok()?);
        epoch.checked_add(self.flow.start)?.checked_add(offset)
    }
}

/// The UDP test host (see the module documentation).
#[derive(Debug, Clone)]
pub struct UdpHost {
    address: IpAddr,
    epoch: Instant,
    echo: bool,
    flows: Vec<FlowState>,
    outbox: VecDeque<Vec<u8>>,
    next_adhoc_seq: u64,
    received: Vec<Arrival>,
    seen: HashSet<(SocketAddr, u16, u64)>,
    rtts: Vec<RttSample>,
    record_limit: usize,
    records_dropped: u64,
    ignored: u64,
    datagrams_sent: u64,
    echoes_sent: u64,
}

impl UdpHost {
    /// A host at `address` whose send times count from `epoch`.
    pub fn new(address: IpAddr, epoch: Instant) -> Self {
        Self {
            address,
            epoch,
            echo: false,
            flows: Vec::new(),
            outbox: VecDeque::new(),
            next_adhoc_seq: 0,
            received: Vec::new(),
            seen: HashSet::new(),
            rtts: Vec::new(),
            record_limit: 10_000_000,
            records_dropped: 0,
            ignored: 0,
            datagrams_sent: 0,
            echoes_sent: 0,
        }
    }

    /// Echo every data datagram back to its sender (which then records an [`RttSample`]).
    pub fn with_echo(mut self, echo: bool) -> Self {
        self.echo = echo;
        self
    }

    /// Keeps at most `limit` arrival and RTT records each (10 million by default); later ones
    /// are counted in [`records_dropped`](UdpHost::records_dropped).
    pub fn with_record_limit(mut self, limit: usize) -> Self {
        self.record_limit = limit;
        self
    }

    /// The host's address.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    fn check(&self, dest: SocketAddr, payload_len: usize) -> Result<(), UdpHostError> {
        if dest.is_ipv4() != self.address.is_ipv4() {
            return Err(UdpHostError::AddressFamily(dest));
        }
        if payload_len < MIN_PAYLOAD {
            return Err(UdpHostError::PayloadTooSmall(payload_len));
        }
        // 65535 minus the IPv4 and UDP headers; IPv6's payload length excludes its header.
        let max = if self.address.is_ipv4() {
            65_535 - 28
        } else {
            65_535 - 8
        };
        if payload_len > max {
            return Err(UdpHostError::PayloadTooLarge(payload_len));
        }
        Ok(())
    }

    /// Adds a periodic flow; returns its index.
    pub fn add_flow(&mut self, flow: PeriodicFlow) -> Result<usize, UdpHostError> {
        self.check(flow.dest, flow.payload_len)?;
        if flow.interval.is_zero() {
            return Err(UdpHostError::ZeroInterval);
        }
        self.flows.push(FlowState { flow, sent: 0 });
        Ok(self.flows.len() - 1)
    }

    /// Queues one datagram to send at once (sequence numbers count separately from flows).
    pub fn send(
        &mut self,
        now: Instant,
        dest: SocketAddr,
        src_port: u16,
        payload_len: usize,
    ) -> Result<(), UdpHostError> {
        self.check(dest, payload_len)?;
        let seq = self.next_adhoc_seq;
        self.next_adhoc_seq += 1;
        let payload = self.payload(KIND_DATA, seq, now, payload_len);
        self.queue(src_port, dest, &payload);
        self.datagrams_sent += 1;
        Ok(())
    }

    /// Data datagrams received, in arrival order.
    pub fn received(&self) -> &[Arrival] {
        &self.received
    }

    /// Round trips measured from echoes.
    pub fn rtts(&self) -> &[RttSample] {
        &self.rtts
    }

    /// Data datagrams sent (not counting echoes).
    pub fn datagrams_sent(&self) -> u64 {
        self.datagrams_sent
    }

    /// Echoes sent.
    pub fn echoes_sent(&self) -> u64 {
        self.echoes_sent
    }

    /// Datagrams sent so far by flow `index`.
    pub fn flow_sent(&self, index: usize) -> Option<u64> {
        self.flows.get(index).map(|f| f.sent)
    }

    /// Records not kept because of the record limit.
    pub fn records_dropped(&self) -> u64 {
        self.records_dropped
    }

    /// Packets that were not datagrams of this format.
    pub fn ignored(&self) -> u64 {
        self.ignored
    }

    /// Sequence numbers in `0..count` from `from` that never arrived.
    pub fn missing(&self, from: SocketAddr, count: u64) -> Vec<u64> {
        let got: HashSet<u64> = self
            .received
            .iter()
            .filter(|a| a.from == from)
            .map(|a| a.seq)
            .collect();
        (0..count).filter(|seq| !got.contains(seq)).collect()
    }

    fn payload(&self, kind: u8, seq: u64, sent: Instant, len: usize) -> Vec<u8> {
        encode_payload(kind, seq, sent.saturating_duration_since(self.epoch), len)
    }

    fn queue(&mut self, src_port: u16, dest: SocketAddr, payload: &[u8]) {
        let builder = match (self.address, dest.ip()) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                PacketBuilder::ipv6(src.octets(), dst.octets(), 64)
            }
            // Flows are checked when added; an echo goes back to the family it came from.
            _ => return,
        };
        let builder = builder.udp(src_port, dest.port());
        let mut packet = Vec::with_capacity(builder.size(payload.len()));
        if builder.write(&mut packet, payload).is_ok() {
            self.outbox.push_back(packet);
        }
    }
}

/// Kind byte of a data datagram.
pub const KIND_DATA: u8 = 0;
/// Kind byte of an echoed datagram.
pub const KIND_ECHO: u8 = 1;

/// A datagram payload in the test host's format (see the module documentation): `kind`,
/// sequence number, send time since the sender's epoch, zero-padded to `len` bytes (at least
/// [`MIN_PAYLOAD`]). Real senders in the network lab use it too, so that both engines carry
/// the same datagrams.
pub fn encode_payload(kind: u8, seq: u64, since_epoch: Duration, len: usize) -> Vec<u8> {
    let mut payload = vec![0u8; len.max(MIN_PAYLOAD)];
    payload[0..4].copy_from_slice(MAGIC);
    payload[4] = kind;
    payload[8..16].copy_from_slice(&seq.to_be_bytes());
    let nanos = u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX);
    payload[16..24].copy_from_slice(&nanos.to_be_bytes());
    payload
}

/// The (kind, seq, send offset) of a datagram payload in the test host's format.
pub fn decode_payload(payload: &[u8]) -> Option<(u8, u64, Duration)> {
    if payload.len() < MIN_PAYLOAD || &payload[0..4] != MAGIC {
        return None;
    }
    let seq = u64::from_be_bytes(payload[8..16].try_into().ok()?);
    let nanos = u64::from_be_bytes(payload[16..24].try_into().ok()?);
    Some((payload[4], seq, Duration::from_nanos(nanos)))
}

impl Host for UdpHost {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.address]
    }

    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>) {
        let Ok(sliced) = SlicedPacket::from_ip(&packet) else {
            self.ignored += 1;
            return;
        };
        let src_ip: IpAddr = match &sliced.net {
            Some(NetSlice::Ipv4(ip)) => ip.header().source_addr().into(),
            Some(NetSlice::Ipv6(ip)) => ip.header().source_addr().into(),
            _ => {
                self.ignored += 1;
                return;
            }
        };
        let Some(TransportSlice::Udp(udp)) = &sliced.transport else {
            self.ignored += 1;
            return;
        };
        let from = SocketAddr::new(src_ip, udp.source_port());
        let to_port = udp.destination_port();
        let payload = udp.payload();
        let Some((kind, seq, sent_offset)) = decode_payload(payload) else {
            self.ignored += 1;
            return;
        };
        // The send time comes from the peer: never trust it to fit.
        let Some(sent_at) = self.epoch.checked_add(sent_offset) else {
            self.ignored += 1;
            return;
        };
        match kind {
            KIND_DATA => {
                if self.received.len() < self.record_limit {
                    let duplicate = !self.seen.insert((from, to_port, seq));
                    self.received.push(Arrival {
                        from,
                        to_port,
                        seq,
                        sent_at,
                        received_at: now,
                        payload_len: payload.len(),
                        duplicate,
                    });
                } else {
                    self.records_dropped += 1;
                }
                if self.echo {
                    let mut echo = payload.to_vec();
                    echo[4] = KIND_ECHO;
                    self.queue(to_port, from, &echo);
                    self.echoes_sent += 1;
                }
            }
            KIND_ECHO => {
                if self.rtts.len() < self.record_limit {
                    self.rtts.push(RttSample {
                        peer: from,
                        seq,
                        sent_at,
                        rtt: now.saturating_duration_since(sent_at),
                    });
                } else {
                    self.records_dropped += 1;
                }
            }
            _ => self.ignored += 1,
        }
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Vec<u8>> {
        self.outbox.pop_front()
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        let epoch = self.epoch;
        self.flows.iter().filter_map(|f| f.next_send(epoch)).min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        let epoch = self.epoch;
        for index in 0..self.flows.len() {
            while let Some(due) = self.flows[index].next_send(epoch) {
                if due > now {
                    break;
                }
                let flow = self.flows[index].flow;
                let seq = self.flows[index].sent;
                let payload = self.payload(KIND_DATA, seq, now, flow.payload_len);
                self.queue(flow.src_port, flow.dest, &payload);
                self.flows[index].sent += 1;
                self.datagrams_sent += 1;
            }
        }
    }
}
