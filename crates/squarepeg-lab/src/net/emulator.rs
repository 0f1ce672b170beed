//! The real-time link emulator: a userspace bridge between two interfaces that sends every IP
//! packet through the lab's impairment path in real time.
//!
//! The path is the simulator's own dumbbell ([`Simulator`]): client-side middlebox chain,
//! bottleneck (one [`LinkDirection`](crate::model::LinkDirection) per direction), server-side
//! chain. The emulator adds two *port hosts* — the client and server interfaces — as the
//! default hosts of the left and right sides, and runs the simulator's clock against the wall
//! clock: a frame read from an interface at time `t` is injected at `t`, and a packet the
//! simulator delivers to a port at `T` is written to the other interface as soon as the
//! clock passes `T`. So the emulator has no impairment code of its own: a link spec behaves
//! identically in both engines, up to the emulator's timing error (its `lateness` counters).
//!
//! The thread sleeps in `ppoll` (nanosecond timeouts, timer slack 1 ns, raised priority)
//! until the next frame or the simulator's next event. Non-IP frames (ARP) and IPv6
//! neighbour discovery and MLD pass at once, unimpaired, so that address resolution does not
//! depend on the impairments. Ethernet headers are learnt per direction from the frames
//! crossing it (the ends resolve each other through the bridge), and rebuilt for packets the
//! middleboxes create.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::BufWriter;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etherparse::PacketBuilder;
use serde::{Deserialize, Serialize};

use super::netns::NetNs;
use super::packet_socket::{PacketSocket, Received};
use super::{NetError, sys};
use crate::middlebox::{Middlebox, MiddleboxConfig};
use crate::model::{Bottleneck, LinkConfig, LinkStats};
use crate::packet::{FlowKey, IpVersion, TcpView, parse_ip, tcp_flags};
use crate::pcap::PcapWriter;
use crate::sim::{Host, HostId, SimConfig, Simulator};
use crate::{Direction, Side};

/// Default bound on packets held by the emulator at once (in flight on the links, queued,
/// or held by middleboxes): 100 000 full-size frames are about 150 MB. Beyond it, arriving
/// packets are dropped and counted (`dropped_overload`).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 100_000;

/// SCHED_FIFO priority of the emulator thread: low among real-time threads (kernel threads
/// that need it more run at 50).
const REALTIME_PRIORITY: i32 = 10;

/// Frames read from one interface before the other gets a turn and due packets are sent.
const READ_BATCH: usize = 64;

/// Largest frame read: jumbo frames fit; longer ones are dropped and counted.
const FRAME_BUFFER: usize = 65_536 + 14;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ICMPV6: u8 = 58;

/// Where a capture listens: on the emulator's interface facing the client or the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureSide {
    /// The client-facing veth: client packets before the impairments, server packets after.
    Client,
    /// The server-facing veth: server packets before the impairments, client packets after.
    Server,
}

impl CaptureSide {
    fn index(self) -> usize {
        match self {
            CaptureSide::Client => 0,
            CaptureSide::Server => 1,
        }
    }

    fn from_index(index: usize) -> Self {
        if index == 0 {
            CaptureSide::Client
        } else {
            CaptureSide::Server
        }
    }
}

/// What the emulator does, as plain data (serde, so the CLI can pass it to its daemon).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmulatorConfig {
    /// The emulator's interface facing the client (the simulator's left side).
    pub client_interface: String,
    /// The emulator's interface facing the server (the right side).
    pub server_interface: String,
    /// `left_to_right` is client to server ("up"), `right_to_left` server to client ("down").
    pub bottleneck: Bottleneck,
    /// Seed of every random decision (as the simulator's).
    pub seed: u64,
    /// Middleboxes between the client and the bottleneck, in path order.
    #[serde(default)]
    pub client_side: Vec<MiddleboxConfig>,
    /// Middleboxes between the bottleneck and the server, in path order.
    #[serde(default)]
    pub server_side: Vec<MiddleboxConfig>,
    /// Most packets held at once (see [`DEFAULT_MAX_IN_FLIGHT`]).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Captures started with the emulator.
    #[serde(default)]
    pub captures: Vec<(CaptureSide, PathBuf)>,
    /// Run the emulator thread in the SCHED_FIFO real-time class (falling back to a raised
    /// nice value), so that packets leave on time on a busy machine.
    #[serde(default = "yes")]
    pub realtime: bool,
}

fn yes() -> bool {
    true
}

fn default_max_in_flight() -> usize {
    DEFAULT_MAX_IN_FLIGHT
}

impl EmulatorConfig {
    /// An emulator between two interfaces with an ideal path.
    pub fn new(client_interface: &str, server_interface: &str) -> Self {
        Self {
            client_interface: client_interface.to_owned(),
            server_interface: server_interface.to_owned(),
            bottleneck: Bottleneck::default(),
            seed: 0,
            client_side: Vec::new(),
            server_side: Vec::new(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            captures: Vec::new(),
            realtime: true,
        }
    }
}

/// How late the emulator wrote packets, compared with the delivery time the model gave them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Lateness {
    /// Packets measured.
    pub packets: u64,
    /// Mean lateness in microseconds.
    pub mean_us: f64,
    /// Largest lateness in microseconds.
    pub max_us: f64,
    /// Packets more than 100 µs late.
    pub over_100us: u64,
    /// Packets more than 1 ms late.
    pub over_1ms: u64,
}

#[derive(Debug, Clone, Default)]
struct LatenessAccumulator {
    packets: u64,
    sum_ns: u128,
    max_ns: u64,
    over_100us: u64,
    over_1ms: u64,
}

impl LatenessAccumulator {
    fn record(&mut self, late: Duration) {
        let ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        self.packets += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
        self.over_100us += u64::from(ns > 100_000);
        self.over_1ms += u64::from(ns > 1_000_000);
    }

    fn report(&self) -> Lateness {
        Lateness {
            packets: self.packets,
            mean_us: if self.packets == 0 {
                0.0
            } else {
                self.sum_ns as f64 / self.packets as f64 / 1000.0
            },
            max_us: self.max_ns as f64 / 1000.0,
            over_100us: self.over_100us,
            over_1ms: self.over_1ms,
        }
    }
}

/// Counters of one direction.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DirectionStats {
    /// Frames read from the sending side's interface.
    pub frames_in: u64,
    /// Their bytes (Ethernet header included).
    pub frame_bytes_in: u64,
    /// Frames passed at once, unimpaired: non-IP (ARP), IPv6 neighbour discovery and MLD.
    pub control_frames: u64,
    /// IP packets sent into the impairment path.
    pub ip_packets_in: u64,
    /// Their IP bytes.
    pub ip_bytes_in: u64,
    /// IP packets written out after the path (duplicates and middlebox output included).
    pub ip_packets_out: u64,
    /// Their IP bytes.
    pub ip_bytes_out: u64,
    /// Packets refused because the emulator held `max_in_flight` packets.
    pub dropped_overload: u64,
    /// Frames longer than the emulator's buffer, dropped.
    pub dropped_oversize: u64,
    /// Frames without a usable Ethernet header, or packets with no known destination MAC.
    pub dropped_unaddressable: u64,
    /// Frames the kernel refused to send (e.g. above the MTU, or no buffer space).
    pub send_errors: u64,
    /// Frames the kernel dropped before the emulator read them (socket buffer full).
    pub kernel_drops: u64,
    /// Frames dropped because the path was blocked (blackholed or cut): non-IP and neighbour
    /// discovery frames (IP packets show in the link's `dropped_link_down`).
    pub dropped_blocked: u64,
    /// Packets of flows being reset, dropped (see [`Emulator::reset_flows`]).
    pub dropped_resetting: u64,
    /// TCP RSTs the emulator sent in this direction (towards the server for `up`).
    pub resets_sent: u64,
    /// The link model's counters for this direction.
    pub link: LinkStats,
    /// Timing error of the packets written.
    pub lateness: Lateness,
}

#[derive(Debug, Clone, Default)]
struct DirectionCounters {
    frames_in: u64,
    frame_bytes_in: u64,
    control_frames: u64,
    ip_packets_in: u64,
    ip_bytes_in: u64,
    ip_packets_out: u64,
    ip_bytes_out: u64,
    dropped_overload: u64,
    dropped_oversize: u64,
    dropped_unaddressable: u64,
    send_errors: u64,
    dropped_blocked: u64,
    dropped_resetting: u64,
    resets_sent: u64,
    lateness: LatenessAccumulator,
}

/// A capture's state, for reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaptureStatus {
    /// Which interface.
    pub side: CaptureSide,
    /// The pcap file.
    pub path: PathBuf,
    /// Packets written.
    pub packets: u64,
}

/// Everything the emulator counts, as JSON-friendly data. `up` is client to server.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EmulatorStats {
    /// Seconds since the emulator started.
    pub elapsed_s: f64,
    /// Client to server.
    pub up: DirectionStats,
    /// Server to client.
    pub down: DirectionStats,
    /// Counters of the client-side middleboxes (summed by name).
    pub client_side_middleboxes: BTreeMap<String, u64>,
    /// Counters of the server-side middleboxes (summed by name).
    pub server_side_middleboxes: BTreeMap<String, u64>,
    /// Packets the simulator could not parse as IP (dropped).
    pub malformed: u64,
    /// Packets held at the moment of the snapshot.
    pub in_flight: usize,
    /// Running captures.
    pub captures: Vec<CaptureStatus>,
    /// True while the path is blocked (every frame dropped both ways).
    pub blocked: bool,
    /// TCP flows the emulator is tracking (for [`Emulator::reset_flows`]).
    pub tracked_flows: usize,
}

impl EmulatorStats {
    /// The statistics as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Plain data: serialisation cannot fail (non-finite floats become null).
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The counters of one direction.
    pub fn direction(&self, dir: Direction) -> &DirectionStats {
        match dir {
            Direction::LeftToRight => &self.up,
            Direction::RightToLeft => &self.down,
        }
    }
}

/// A port: one of the emulator's interfaces, as a simulator host that stands for the whole
/// network behind it. It claims no address and is its side's default host.
#[derive(Default)]
struct PortHost {
    /// Packets read from the interface, to inject.
    inbox: VecDeque<Vec<u8>>,
    /// Packets the simulator delivered, with their delivery time, to write.
    outbox: VecDeque<(Instant, Vec<u8>)>,
}

impl Host for PortHost {
    fn addresses(&self) -> Vec<IpAddr> {
        Vec::new()
    }
    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>) {
        self.outbox.push_back((now, packet));
    }
    fn poll_transmit(&mut self, _now: Instant) -> Option<Vec<u8>> {
        self.inbox.pop_front()
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _now: Instant) {}
}

enum Control {
    Stats(Sender<EmulatorStats>),
    StartCapture(CaptureSide, PathBuf, Sender<Result<(), String>>),
    StopCapture(CaptureSide, Sender<Result<Option<CaptureStatus>, String>>),
    FlushCaptures(Sender<Result<(), String>>),
    Reconfigure(Direction, Box<LinkConfig>, Sender<Result<(), String>>),
    SetBlocked(bool, Sender<()>),
    ResetFlows(Sender<usize>),
    Stop,
}

struct Capture {
    path: PathBuf,
    writer: PcapWriter<BufWriter<File>>,
}

/// Source and destination MAC of a direction's unicast frames.
#[derive(Debug, Clone, Copy)]
struct MacPair {
    dst: [u8; 6],
    src: [u8; 6],
}

/// The running emulator's state, owned by its thread.
struct Engine {
    sim: Simulator,
    ports: [HostId; 2],
    sockets: [PacketSocket; 2],
    counters: [DirectionCounters; 2],
    macs: [Option<MacPair>; 2],
    captures: [Option<Capture>; 2],
    max_in_flight: usize,
    started: Instant,
    wall_at_start: Duration,
    last_flush: Instant,
    buf: Vec<u8>,
    frame: Vec<u8>,
    /// Every frame dropped both ways (blackhole or cut).
    blocked: bool,
    /// TCP flows seen, keyed client to server.
    flows: BTreeMap<FlowKey, TrackedFlow>,
}

/// Most TCP flows tracked at once; beyond it, flows idle for [`FLOW_IDLE`] are forgotten,
/// and new flows are not tracked if none is.
const MAX_TRACKED_FLOWS: usize = 4096;

/// How long a flow may be idle before it may be forgotten to make room.
const FLOW_IDLE: Duration = Duration::from_secs(120);

/// How long the packets of a flow being reset are dropped (each answered with a RST carrying
/// the sender's own acknowledgement number), long enough for a retransmission timeout.
const RESET_HOLD: Duration = Duration::from_secs(3);

/// What the emulator knows of one end of a TCP flow, from the segments it sent.
#[derive(Debug, Clone, Copy, Default)]
struct TrackedEnd {
    /// The acknowledgement number of its latest segment with ACK: its RCV.NXT then.
    last_ack: Option<u32>,
    /// One past the highest sequence number it sent (SYN and FIN count).
    snd_nxt: Option<u32>,
}

/// A TCP flow crossing the path; `ends[0]` is the client's end.
#[derive(Debug, Clone, Default)]
struct TrackedFlow {
    ends: [TrackedEnd; 2],
    last_seen: Option<Instant>,
    /// While set (and not passed), the flow is being reset: its packets are dropped and each
    /// is answered with a RST.
    resetting_until: Option<Instant>,
}

/// True if sequence number `a` is after `b` (RFC 1982 serial arithmetic).
fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// A bare TCP RST|ACK from `key.src:src_port` to `key.dst:dst_port`, without options, its
/// checksums computed. `None` for mixed address families.
fn build_rst(key: &FlowKey, seq: u32, ack: u32) -> Option<Vec<u8>> {
    let builder = match (key.src, key.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => PacketBuilder::ipv4(src.octets(), dst.octets(), 64),
        (IpAddr::V6(src), IpAddr::V6(dst)) => PacketBuilder::ipv6(src.octets(), dst.octets(), 64),
        _ => return None,
    };
    let builder = builder
        .tcp(key.src_port, key.dst_port, seq, 0)
        .rst()
        .ack(ack);
    let mut packet = Vec::with_capacity(builder.size(0));
    builder.write(&mut packet, &[]).ok()?;
    Some(packet)
}

/// The direction of travel of packets written out of `side`'s interface.
fn dir_into(side: usize) -> Direction {
    if side == 0 {
        Direction::RightToLeft
    } else {
        Direction::LeftToRight
    }
}

/// Frames classified.
enum Frame<'a> {
    /// Pass unimpaired.
    Control,
    /// An IP packet (Ethernet padding removed).
    Ip(&'a [u8]),
}

fn classify(frame: &[u8]) -> Option<Frame<'_>> {
    let header = frame.get(..14)?;
    let ethertype = u16::from_be_bytes([header[12], header[13]]);
    if ethertype != ETHERTYPE_IPV4 && ethertype != ETHERTYPE_IPV6 {
        return Some(Frame::Control);
    }
    let packet = &frame[14..];
    let Ok(ip) = parse_ip(packet) else {
        // Let the simulator count it as malformed.
        return Some(Frame::Ip(packet));
    };
    if ip.version == IpVersion::V6 && ip.protocol == ICMPV6 && !ip.fragment {
        // RFC 4861 §4 (router/neighbour solicitation and advertisement, redirect) and MLD
        // (RFC 2710 types 130-132, RFC 3810 type 143): link control, never impaired.
        if let Some(&kind) = packet.get(ip.header_len)
            && matches!(kind, 130..=137 | 143)
        {
            return Some(Frame::Control);
        }
    }
    Some(Frame::Ip(&packet[..ip.total_len]))
}

/// The Ethernet multicast address of an IP multicast (or broadcast) destination.
fn multicast_mac(dst: IpAddr) -> Option<[u8; 6]> {
    match dst {
        IpAddr::V4(v4) if v4.is_broadcast() => Some([0xff; 6]),
        // RFC 1112 §6.4: 01:00:5e and the low 23 bits.
        IpAddr::V4(v4) if v4.is_multicast() => {
            let o = v4.octets();
            Some([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
        }
        // RFC 2464 §7: 33:33 and the low 32 bits.
        IpAddr::V6(v6) if v6.is_multicast() => {
            let o = v6.octets();
            Some([0x33, 0x33, o[12], o[13], o[14], o[15]])
        }
        _ => None,
    }
}

impl Engine {
    fn new(config: &EmulatorConfig) -> Result<Self, NetError> {
        let open = |name: &str| -> Result<PacketSocket, NetError> {
            let index = sys::interface_index(name).map_err(|source| NetError::Io {
                context: format!("finding interface {name}"),
                source,
            })?;
            PacketSocket::open(index).map_err(|source| NetError::Io {
                context: format!("opening an AF_PACKET socket on {name}"),
                source,
            })
        };
        let sockets = [
            open(&config.client_interface)?,
            open(&config.server_interface)?,
        ];
        let started = Instant::now();
        let wall_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut sim = Simulator::with_start(
            SimConfig::new(config.seed, config.bottleneck.clone()),
            started,
        )?;
        for (side, boxes) in [
            (Side::Left, &config.client_side),
            (Side::Right, &config.server_side),
        ] {
            for middlebox in boxes {
                sim.add_boxed_middlebox(side, middlebox.build());
            }
        }
        let client = sim.add_host(Side::Left, PortHost::default())?;
        let server = sim.add_host(Side::Right, PortHost::default())?;
        sim.set_default_host(client);
        sim.set_default_host(server);
        let mut engine = Self {
            sim,
            ports: [client, server],
            sockets,
            counters: Default::default(),
            macs: [None, None],
            captures: [None, None],
            max_in_flight: config.max_in_flight,
            started,
            wall_at_start,
            last_flush: started,
            buf: vec![0; FRAME_BUFFER],
            frame: Vec::with_capacity(FRAME_BUFFER),
            blocked: false,
            flows: BTreeMap::new(),
        };
        for (side, path) in &config.captures {
            engine.start_capture(*side, path)?;
        }
        Ok(engine)
    }

    fn start_capture(&mut self, side: CaptureSide, path: &Path) -> Result<(), NetError> {
        let io = |source| NetError::Io {
            context: format!("creating capture {}", path.display()),
            source,
        };
        let file = File::create(path).map_err(io)?;
        let writer = PcapWriter::new(BufWriter::new(file)).map_err(io)?;
        if let Some(old) = self.captures[side.index()].replace(Capture {
            path: path.to_owned(),
            writer,
        }) {
            let _ = old.writer.into_inner();
        }
        Ok(())
    }

    fn capture(&mut self, side: usize, at: Instant, packet: &[u8]) {
        if let Some(capture) = &mut self.captures[side] {
            let timestamp = self.wall_at_start + at.saturating_duration_since(self.started);
            if let Err(error) = capture.writer.write_packet(timestamp, packet) {
                // A full disk must not stop the emulator; the capture ends.
                eprintln!(
                    "squarepeg-lab: capture {} stopped: {error}",
                    capture.path.display()
                );
                self.captures[side] = None;
            }
        }
    }

    fn flush_captures(&mut self) -> Result<(), String> {
        self.last_flush = Instant::now();
        for capture in self.captures.iter_mut().flatten() {
            capture
                .writer
                .flush()
                .map_err(|e| format!("flushing {}: {e}", capture.path.display()))?;
        }
        Ok(())
    }

    fn stats(&mut self) -> EmulatorStats {
        let sim = self.sim.stats();
        let mut direction = |index: usize, link: LinkStats| {
            let c = &self.counters[index];
            DirectionStats {
                frames_in: c.frames_in,
                frame_bytes_in: c.frame_bytes_in,
                control_frames: c.control_frames,
                ip_packets_in: c.ip_packets_in,
                ip_bytes_in: c.ip_bytes_in,
                ip_packets_out: c.ip_packets_out,
                ip_bytes_out: c.ip_bytes_out,
                dropped_overload: c.dropped_overload,
                dropped_oversize: c.dropped_oversize,
                dropped_unaddressable: c.dropped_unaddressable,
                send_errors: c.send_errors,
                kernel_drops: self.sockets[index].kernel_drops(),
                dropped_blocked: c.dropped_blocked,
                dropped_resetting: c.dropped_resetting,
                resets_sent: c.resets_sent,
                link,
                lateness: c.lateness.report(),
            }
        };
        let up = direction(0, sim.left_to_right);
        let down = direction(1, sim.right_to_left);
        let counters = |side: Side| {
            let mut map = BTreeMap::new();
            for (name, value) in self.sim.chain(side).counters() {
                *map.entry(name.to_owned()).or_insert(0) += value;
            }
            map
        };
        EmulatorStats {
            elapsed_s: self.started.elapsed().as_secs_f64(),
            up,
            down,
            client_side_middleboxes: counters(Side::Left),
            server_side_middleboxes: counters(Side::Right),
            malformed: sim.malformed,
            in_flight: self.sim.pending_events(),
            captures: self
                .captures
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    c.as_ref().map(|c| CaptureStatus {
                        side: CaptureSide::from_index(i),
                        path: c.path.clone(),
                        packets: c.writer.packets(),
                    })
                })
                .collect(),
            blocked: self.blocked,
            tracked_flows: self.flows.len(),
        }
    }

    /// Blocks or unblocks the path: the links go down (IP packets dropped and counted as
    /// `dropped_link_down`; those already in flight still arrive) and control frames are
    /// dropped too.
    fn set_blocked(&mut self, blocked: bool) {
        self.blocked = blocked;
        for dir in [Direction::LeftToRight, Direction::RightToLeft] {
            self.sim.link_mut(dir).set_up(!blocked);
        }
    }

    /// Sends a RST to the end on `side` (0 client, 1 server) of flow `key` (client to server)
    /// with sequence number `seq`, at once and unimpaired.
    fn send_rst(&mut self, side: usize, key: &FlowKey, seq: u32, ack: u32) {
        // From the other end to this one.
        let header = if side == 0 { key.reversed() } else { *key };
        let Some(packet) = build_rst(&header, seq, ack) else {
            return;
        };
        let dir = dir_into(side);
        self.counters[dir.index()].resets_sent += 1;
        self.write(side, dir, Instant::now(), &packet);
    }

    /// Starts resetting every tracked flow: each end gets a RST at once with the sequence
    /// number it last acknowledged (its RCV.NXT, RFC 5961 §3: an exact match resets), and
    /// for [`RESET_HOLD`] every later packet of the flow is dropped and answered with a RST
    /// carrying that packet's own acknowledgement number (so an end whose RCV.NXT moved on,
    /// and that answered the first RST with a challenge ACK, is reset by the second).
    fn reset_flows(&mut self) -> usize {
        let now = Instant::now();
        // Flows reset earlier are over.
        self.flows
            .retain(|_, f| f.resetting_until.is_none_or(|until| now < until));
        let mut sends = Vec::new();
        for (key, flow) in &mut self.flows {
            flow.resetting_until = Some(now + RESET_HOLD);
            for side in 0..2 {
                let end = flow.ends[side];
                if let Some(seq) = end.last_ack {
                    sends.push((side, *key, seq, end.snd_nxt.unwrap_or(0)));
                }
            }
        }
        let count = self.flows.len();
        for (side, key, seq, ack) in sends {
            self.send_rst(side, &key, seq, ack);
        }
        count
    }

    /// Follows a TCP segment read from `side`; returns false if it must be dropped (its flow
    /// is being reset).
    fn track(&mut self, side: usize, now: Instant, packet: &[u8]) -> bool {
        let Some(view) = TcpView::parse(packet) else {
            return true;
        };
        let key = if side == 0 {
            view.key(packet)
        } else {
            view.key(packet).reversed()
        };
        let flags = view.flags(packet);
        let ack = view.ack(packet);
        if let Some(flow) = self.flows.get_mut(&key)
            && let Some(until) = flow.resetting_until
        {
            let fresh_syn = flags & tcp_flags::SYN != 0 && flags & tcp_flags::ACK == 0;
            if now < until && !fresh_syn {
                self.counters[side].dropped_resetting += 1;
                if flags & tcp_flags::ACK != 0 && flags & tcp_flags::RST == 0 {
                    let seq_end = view.seq(packet).wrapping_add(view.payload_len() as u32);
                    self.send_rst(side, &key, ack, seq_end);
                }
                return false;
            }
            self.flows.remove(&key);
        }
        if flags & tcp_flags::RST != 0 {
            self.flows.remove(&key);
            return true;
        }
        if !self.flows.contains_key(&key) {
            if self.flows.len() >= MAX_TRACKED_FLOWS {
                self.flows.retain(|_, f| {
                    f.last_seen
                        .is_some_and(|seen| now.saturating_duration_since(seen) < FLOW_IDLE)
                });
            }
            if self.flows.len() >= MAX_TRACKED_FLOWS {
                return true;
            }
            self.flows.insert(key, TrackedFlow::default());
        }
        let Some(flow) = self.flows.get_mut(&key) else {
            return true;
        };
        flow.last_seen = Some(now);
        let end = &mut flow.ends[side];
        if flags & tcp_flags::ACK != 0 {
            end.last_ack = Some(ack);
        }
        let len = view.payload_len() as u32
            + u32::from(flags & tcp_flags::SYN != 0)
            + u32::from(flags & tcp_flags::FIN != 0);
        let next = view.seq(packet).wrapping_add(len);
        if end.snd_nxt.is_none_or(|old| seq_after(next, old)) {
            end.snd_nxt = Some(next);
        }
        true
    }

    /// Handles a control message; returns false to stop.
    fn control(&mut self, message: Control) -> bool {
        match message {
            Control::Stats(reply) => {
                let _ = reply.send(self.stats());
            }
            Control::StartCapture(side, path, reply) => {
                let _ = reply.send(self.start_capture(side, &path).map_err(|e| e.to_string()));
            }
            Control::StopCapture(side, reply) => {
                let result = match self.captures[side.index()].take() {
                    None => Ok(None),
                    Some(capture) => {
                        let packets = capture.writer.packets();
                        let path = capture.path.clone();
                        capture
                            .writer
                            .into_inner()
                            .map(|_| {
                                Some(CaptureStatus {
                                    side,
                                    path: path.clone(),
                                    packets,
                                })
                            })
                            .map_err(|e| format!("closing {}: {e}", path.display()))
                    }
                };
                let _ = reply.send(result);
            }
            Control::FlushCaptures(reply) => {
                let _ = reply.send(self.flush_captures());
            }
            Control::Reconfigure(dir, config, reply) => {
                let result = self
                    .sim
                    .link_mut(dir)
                    .reconfigure(*config)
                    .map_err(|e| e.to_string());
                let _ = reply.send(result);
            }
            Control::SetBlocked(blocked, reply) => {
                self.set_blocked(blocked);
                let _ = reply.send(());
            }
            Control::ResetFlows(reply) => {
                let _ = reply.send(self.reset_flows());
            }
            Control::Stop => return false,
        }
        true
    }

    /// Reads up to a batch of frames arriving on `side`'s interface; returns how many.
    fn read(&mut self, side: usize) -> Result<usize, NetError> {
        // Read from `side`: travelling away from it.
        let dir = dir_into(side).reverse();
        let mut count = 0;
        while count < READ_BATCH {
            let received =
                self.sockets[side]
                    .recv(&mut self.buf)
                    .map_err(|source| NetError::Io {
                        context: "reading a frame".to_owned(),
                        source,
                    })?;
            let Received::Frame { len, truncated } = received else {
                break;
            };
            count += 1;
            let now = Instant::now();
            let counters = &mut self.counters[side];
            counters.frames_in += 1;
            counters.frame_bytes_in += len as u64;
            if truncated {
                counters.dropped_oversize += 1;
                continue;
            }
            let frame = &self.buf[..len];
            match classify(frame) {
                None => counters.dropped_unaddressable += 1,
                Some(Frame::Control) if self.blocked => counters.dropped_blocked += 1,
                Some(Frame::Control) => {
                    counters.control_frames += 1;
                    let out = 1 - side;
                    if let Err(_error) = self.sockets[out].send(frame) {
                        self.counters[side].send_errors += 1;
                    }
                    if u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE_IPV6 {
                        let packet = frame[14..].to_vec();
                        self.capture(side, now, &packet);
                        self.capture(out, now, &packet);
                    }
                }
                Some(Frame::Ip(packet)) => {
                    if frame[0] & 1 == 0 {
                        let mut pair = MacPair {
                            dst: [0; 6],
                            src: [0; 6],
                        };
                        pair.dst.copy_from_slice(&frame[0..6]);
                        pair.src.copy_from_slice(&frame[6..12]);
                        self.macs[dir.index()] = Some(pair);
                    }
                    let packet = packet.to_vec();
                    self.capture(side, now, &packet);
                    if self.track(side, now, &packet) {
                        self.inject(side, now, packet)?;
                    }
                }
            }
        }
        Ok(count)
    }

    /// Sends an IP packet read from `side` into the path at `now`.
    fn inject(&mut self, side: usize, now: Instant, packet: Vec<u8>) -> Result<(), NetError> {
        let counters = &mut self.counters[side];
        if self.sim.pending_events() >= self.max_in_flight {
            counters.dropped_overload += 1;
            return Ok(());
        }
        counters.ip_packets_in += 1;
        counters.ip_bytes_in += packet.len() as u64;
        // Bring the simulator to the arrival time, queue the packet at the port, and let the
        // simulator take it at exactly that time.
        self.sim.run_until(now)?;
        if let Some(port) = self.sim.host_mut::<PortHost>(self.ports[side]) {
            port.inbox.push_back(packet);
        }
        self.sim.next_event_time()?;
        Ok(())
    }

    /// Writes every packet the simulator has delivered to the ports.
    fn write_due(&mut self) {
        for side in 0..2 {
            let port = self.ports[side];
            let waiting = self
                .sim
                .host::<PortHost>(port)
                .is_some_and(|p| !p.outbox.is_empty());
            if !waiting {
                continue;
            }
            let Some(host) = self.sim.host_mut::<PortHost>(port) else {
                continue;
            };
            let due: Vec<(Instant, Vec<u8>)> = host.outbox.drain(..).collect();
            // Delivered to the left port: it travelled right to left, out of the client side.
            let dir = dir_into(side);
            for (at, packet) in due {
                self.write(side, dir, at, &packet);
            }
        }
    }

    fn header_for(&self, dir: Direction, packet: &[u8]) -> Option<[u8; 14]> {
        let ip = parse_ip(packet).ok()?;
        let learned = self.macs[dir.index()].or_else(|| {
            // Nothing crossed this way yet: answer with the other direction's pair reversed.
            self.macs[dir.reverse().index()].map(|p| MacPair {
                dst: p.src,
                src: p.dst,
            })
        })?;
        let dst = multicast_mac(ip.dst).unwrap_or(learned.dst);
        let ethertype = match ip.version {
            IpVersion::V4 => ETHERTYPE_IPV4,
            IpVersion::V6 => ETHERTYPE_IPV6,
        };
        let mut header = [0u8; 14];
        header[0..6].copy_from_slice(&dst);
        header[6..12].copy_from_slice(&learned.src);
        header[12..14].copy_from_slice(&ethertype.to_be_bytes());
        Some(header)
    }

    /// Writes a packet out of `side`'s interface.
    fn write(&mut self, side: usize, dir: Direction, due: Instant, packet: &[u8]) {
        let counters_index = dir.index();
        let Some(header) = self.header_for(dir, packet) else {
            self.counters[counters_index].dropped_unaddressable += 1;
            return;
        };
        self.frame.clear();
        self.frame.extend_from_slice(&header);
        self.frame.extend_from_slice(packet);
        let result = self.sockets[side].send(&self.frame);
        let now = Instant::now();
        let counters = &mut self.counters[counters_index];
        match result {
            Ok(()) => {
                counters.ip_packets_out += 1;
                counters.ip_bytes_out += packet.len() as u64;
                counters.lateness.record(now.saturating_duration_since(due));
                self.capture(side, now, packet);
            }
            Err(_) => counters.send_errors += 1,
        }
    }

    fn run(&mut self, control: &Receiver<Control>, wake: &sys::EventFd) -> Result<(), NetError> {
        let fds = [self.sockets[0].raw(), self.sockets[1].raw(), wake.raw()];
        let mut ready = [false; 3];
        loop {
            while let Ok(message) = control.try_recv() {
                if !self.control(message) {
                    return Ok(());
                }
            }
            self.sim.run_until(Instant::now())?;
            self.write_due();
            let read = self.read(0)? + self.read(1)?;
            if read > 0 {
                continue;
            }
            if self.last_flush.elapsed() > Duration::from_secs(1) {
                let _ = self.flush_captures();
            }
            let timeout = self
                .sim
                .next_event_time()?
                .map(|t| t.saturating_duration_since(Instant::now()));
            if timeout == Some(Duration::ZERO) {
                continue;
            }
            // Wake at least once a second to flush captures.
            let timeout = timeout.map_or(Duration::from_secs(1), |t| t.min(Duration::from_secs(1)));
            sys::poll(&fds, Some(timeout), &mut ready).map_err(|source| NetError::Io {
                context: "waiting for frames".to_owned(),
                source,
            })?;
            if ready[2] {
                wake.drain();
            }
        }
    }
}

/// A running emulator thread. Dropping it stops the thread (and closes its captures).
pub struct Emulator {
    thread: Option<JoinHandle<Result<EmulatorStats, NetError>>>,
    control: Sender<Control>,
    wake: Arc<sys::EventFd>,
    failure: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator").finish_non_exhaustive()
    }
}

/// How long a request to the emulator thread may take before it counts as hung.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

impl Emulator {
    /// Starts the emulator on a thread inside namespace `ns` (whose interfaces the config
    /// names) and returns once its sockets are open.
    pub fn spawn(ns: &NetNs, config: EmulatorConfig) -> Result<Self, NetError> {
        Self::spawn_with(Some(ns.try_clone()?), config)
    }

    /// Starts the emulator on a thread in the caller's own namespace.
    pub fn spawn_here(config: EmulatorConfig) -> Result<Self, NetError> {
        Self::spawn_with(None, config)
    }

    fn spawn_with(ns: Option<NetNs>, config: EmulatorConfig) -> Result<Self, NetError> {
        config.bottleneck.validate()?;
        let (control_tx, control_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), NetError>>(1);
        let wake = Arc::new(sys::EventFd::new().map_err(|source| NetError::Io {
            context: "creating an eventfd".to_owned(),
            source,
        })?);
        let failure = Arc::new(Mutex::new(None));
        let thread_wake = Arc::clone(&wake);
        let thread_failure = Arc::clone(&failure);
        let thread = std::thread::Builder::new()
            .name("sqpg-emulator".to_owned())
            .spawn(move || {
                let setup = || -> Result<Engine, NetError> {
                    if let Some(ns) = &ns {
                        ns.enter_current_thread()?;
                    }
                    sys::set_timer_slack(Duration::from_nanos(1));
                    if !(config.realtime && sys::set_realtime_priority(REALTIME_PRIORITY)) {
                        sys::raise_thread_priority(-10);
                    }
                    Engine::new(&config)
                };
                let mut engine = match setup() {
                    Ok(engine) => engine,
                    Err(error) => {
                        let _ = ready_tx.send(Err(error));
                        return Ok(EmulatorStats::default());
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let result = engine.run(&control_rx, &thread_wake);
                let _ = engine.flush_captures();
                let stats = engine.stats();
                // Close the captures (flushes their buffers).
                engine.captures = [None, None];
                if let Err(error) = &result
                    && let Ok(mut failure) = thread_failure.lock()
                {
                    *failure = Some(error.to_string());
                }
                result.map(|()| stats)
            })
            .map_err(|source| NetError::Io {
                context: "spawning the emulator thread".to_owned(),
                source,
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                thread: Some(thread),
                control: control_tx,
                wake,
                failure,
            }),
            Ok(Err(error)) => {
                let _ = thread.join();
                Err(error)
            }
            Err(_) => {
                let _ = thread.join();
                Err(NetError::EmulatorStopped(
                    "the emulator thread died while starting".to_owned(),
                ))
            }
        }
    }

    fn request<T>(&self, make: impl FnOnce(Sender<T>) -> Control) -> Result<T, NetError> {
        let (reply_tx, reply_rx) = mpsc::channel();
        let stopped = || {
            let reason = self
                .failure
                .lock()
                .ok()
                .and_then(|f| f.clone())
                .unwrap_or_else(|| "stopped".to_owned());
            NetError::EmulatorStopped(reason)
        };
        self.control.send(make(reply_tx)).map_err(|_| stopped())?;
        self.wake.wake();
        reply_rx.recv_timeout(REQUEST_TIMEOUT).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => {
                NetError::EmulatorStopped("not answering".to_owned())
            }
            mpsc::RecvTimeoutError::Disconnected => stopped(),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> Result<EmulatorStats, NetError> {
        self.request(Control::Stats)
    }

    /// Starts (or restarts) a pcap capture on one side.
    pub fn start_capture(&self, side: CaptureSide, path: &Path) -> Result<(), NetError> {
        self.request(|reply| Control::StartCapture(side, path.to_owned(), reply))?
            .map_err(NetError::Capture)
    }

    /// Stops the capture on one side and closes its file; returns what it wrote, if one ran.
    pub fn stop_capture(&self, side: CaptureSide) -> Result<Option<CaptureStatus>, NetError> {
        self.request(|reply| Control::StopCapture(side, reply))?
            .map_err(NetError::Capture)
    }

    /// Flushes the captures, so that their files hold every packet so far.
    pub fn flush_captures(&self) -> Result<(), NetError> {
        self.request(Control::FlushCaptures)?
            .map_err(NetError::Capture)
    }

    /// Replaces one direction's link config from now on (queue and random streams kept).
    pub fn reconfigure(&self, dir: Direction, config: LinkConfig) -> Result<(), NetError> {
        config.validate()?;
        self.request(|reply| Control::Reconfigure(dir, Box::new(config), reply))?
            .map_err(NetError::EmulatorStopped)
    }

    /// Blocks the path (every frame dropped both ways, silently) or unblocks it. IP packets
    /// count as the links' `dropped_link_down`, other frames as `dropped_blocked`; packets
    /// already on the links when it is blocked still arrive.
    pub fn set_blocked(&self, blocked: bool) -> Result<(), NetError> {
        self.request(|reply| Control::SetBlocked(blocked, reply))
    }

    /// Resets every TCP flow seen so far: each end receives a RST it accepts (sequence number
    /// equal to its RCV.NXT, RFC 5961 §3), learnt from the acknowledgement numbers it sends;
    /// for a few seconds the flows' packets are dropped and answered with further RSTs, then
    /// the flows are forgotten. Other traffic, and new flows, pass as before. Returns the
    /// number of flows being reset.
    pub fn reset_flows(&self) -> Result<usize, NetError> {
        self.request(Control::ResetFlows)
    }

    /// Stops the thread (packets still in flight are discarded), closes the captures, and
    /// returns the final counters — or the error that stopped the emulator early.
    pub fn stop(mut self) -> Result<EmulatorStats, NetError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<EmulatorStats, NetError> {
        let Some(thread) = self.thread.take() else {
            return Err(NetError::EmulatorStopped("already stopped".to_owned()));
        };
        let _ = self.control.send(Control::Stop);
        self.wake.wake();
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if self.thread.is_some()
            && let Err(error) = self.shutdown()
        {
            eprintln!("squarepeg-lab: emulator: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn classification() {
        // ARP passes.
        assert!(matches!(
            classify(&frame(0x0806, &[0; 28])),
            Some(Frame::Control)
        ));
        // Too short for Ethernet.
        assert!(classify(&[0; 10]).is_none());
        // IPv4 with Ethernet padding: the packet is cut to its total length.
        let mut v4 = vec![
            0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        v4.extend_from_slice(&[0; 26]);
        match classify(&frame(ETHERTYPE_IPV4, &v4)) {
            Some(Frame::Ip(p)) => assert_eq!(p.len(), 20),
            _ => panic!("IPv4 is impaired"),
        }
        // IPv6 neighbour solicitation passes; an ICMPv6 echo does not.
        let mut v6 = vec![0x60, 0, 0, 0, 0, 8, ICMPV6, 255];
        v6.extend_from_slice(&[0; 32]);
        v6.extend_from_slice(&[135, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            classify(&frame(ETHERTYPE_IPV6, &v6)),
            Some(Frame::Control)
        ));
        v6[40] = 128;
        assert!(matches!(
            classify(&frame(ETHERTYPE_IPV6, &v6)),
            Some(Frame::Ip(_))
        ));
    }

    #[test]
    fn multicast_macs() {
        assert_eq!(
            multicast_mac("224.0.0.251".parse().expect("ip")),
            Some([0x01, 0, 0x5e, 0, 0, 0xfb])
        );
        assert_eq!(
            multicast_mac("ff02::1:ff00:2".parse().expect("ip")),
            Some([0x33, 0x33, 0xff, 0, 0, 2])
        );
        assert_eq!(multicast_mac("10.0.0.1".parse().expect("ip")), None);
    }
}
