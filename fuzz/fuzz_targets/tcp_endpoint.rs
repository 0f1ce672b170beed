//! squarepeg-tcp's endpoint driven by a peer that sends what the fuzzer makes up.
//!
//! A server endpoint listens (its connection configuration, SYN-cookie policy and backlog
//! picked by the input); a scripted client completes a genuine handshake with it (SYN with
//! input-chosen options, the SYN-ACK read back, the ACK), so one connection is established and
//! accepted. Then a sequence of operations: segments built from the input relative to the real
//! sequence numbers (the client's next sequence number, the highest the server sent, the
//! server's last timestamp), so that they are often in window, with any flags, window, MSS /
//! window-scale / SACK-permitted / timestamp options, SACK blocks, raw option bytes and
//! payload (of any length, or the window the server last offered less a few bytes), from the
//! connection's port or another one (a SYN storm); raw bytes as an IP packet or as a TCP
//! header and payload in a valid IP packet; ICMP "fragmentation needed" errors quoting the
//! connection's segments, with any MTU; time advances (timers run); the application's
//! writes, messages, reads, unordered reads, shutdown, close and abort.
//!
//! After every operation (and every packet the server sends is read back):
//! - no panic (debug assertions on: overflows are bugs);
//! - `Endpoint::check_invariants`: the endpoint's counts, accept queues, table and timers, and
//!   every connection's receive buffer, send queue and scoreboard are consistent;
//! - memory bounded: connections within `max_connections`, half-open within `max_half_open`
//!   (both checked by `check_invariants`, as is the endpoint memory budget's bound, the
//!   budget itself picked by the input); per connection the receive buffer within its
//!   configured size, the send buffer within its limit, the unordered-receive queue within
//!   the buffer plus its duplicate allowance (a quarter) and a segment; a bounded number of
//!   packets and events per step;
//! - every packet the server sends parses, with valid checksums;
//! - until a SYN or RST on the connection's 4-tuple (a new incarnation, a reset), the server's
//!   direction of the connection passes `WireAudit` (no sequence holes, retransmissions within
//!   one earlier transmission, ACKs never ahead of the data the client sent).
#![no_main]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use squarepeg_tcp::audit::WireAudit;
use squarepeg_tcp::wire::{TcpFlags, parse_packet};
use squarepeg_tcp::{
    CongestionAlgorithm, ConnectionConfig, ConnectionHandle, Endpoint, EndpointConfig, Event,
    KeepaliveConfig, MemoryBudget, State, SynCookies, WriteTag,
};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const SERVER_PORT: u16 = 80;
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// Packets the server may send in one step (beyond it, output does not end).
const MAX_PACKETS_PER_STEP: usize = 20_000;
const MAX_EVENTS_PER_STEP: usize = 10_000;
const MAX_CONNECTIONS: usize = 24;
const MAX_HALF_OPEN: usize = 12;

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
struct Setup {
    client_isn: u32,
    client_port: u16,
    syn: SynOptions,
    recv_buffer: u16,
    send_buffer: u16,
    max_ooo_ranges: u8,
    window_scale: Option<u8>,
    mss: Option<u16>,
    sack: bool,
    timestamps: bool,
    window_scaling: bool,
    delayed_ack: bool,
    nagle: bool,
    unordered: bool,
    reno: bool,
    rack_tlp: bool,
    consistent_segmentation: bool,
    keepalive: bool,
    user_timeout: bool,
    drop_without_timestamps: bool,
    backlog: u8,
    cookies: u8,
    /// TCP Fast Open on the listener (the peer's raw options may carry kind 34).
    fast_open: bool,
    /// Short TIME-WAIT (max(2 × RTO, 100 ms) with timestamps).
    short_time_wait: bool,
}

#[derive(Arbitrary, Debug, Clone)]
struct SynOptions {
    mss: Option<u16>,
    wscale: Option<u8>,
    sack_permitted: bool,
    timestamps: bool,
    window: u16,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Segment(Seg),
    /// Arbitrary bytes as an IP packet.
    RawIp(Vec<u8>),
    /// Arbitrary bytes as the TCP header and payload of a valid IPv4 packet on the
    /// connection's ports (if long enough), with a correct checksum.
    RawTcp(Vec<u8>),
    /// A handshake from another client port: SYN, then the ACK of the SYN-ACK.
    Connect {
        port: u16,
        syn: SynOptions,
        ack: bool,
    },
    Advance {
        ms: u16,
    },
    /// Jump to the next timer.
    NextTimer,
    Write {
        conn: u8,
        len: u16,
        fill: u8,
    },
    WriteMessage {
        conn: u8,
        len: u16,
        priority: i8,
        squash: Option<u8>,
        deadline_ms: Option<u16>,
        id: Option<u8>,
        depends_on: Option<u8>,
    },
    Squash {
        conn: u8,
        key: u8,
    },
    Read {
        conn: u8,
        len: u16,
    },
    ReadSegment {
        conn: u8,
        len: u16,
    },
    EnableUnordered {
        conn: u8,
    },
    PollReports {
        conn: u8,
    },
    Shutdown {
        conn: u8,
    },
    Close {
        conn: u8,
    },
    Abort {
        conn: u8,
    },
    Unlisten,
    /// An ICMP "fragmentation needed" from a router on the path, quoting a segment of the
    /// server's on the connection numbered `behind` below the highest it sent, with a next-hop
    /// MTU of `mtu` (anything, zero included).
    PacketTooBig {
        mtu: u16,
        behind: u16,
    },
}

#[derive(Arbitrary, Debug)]
enum SeqSel {
    Next,
    Ahead(u16),
    Behind(u16),
    Wild(u32),
}

#[derive(Arbitrary, Debug)]
enum AckSel {
    Latest,
    Behind(u16),
    Ahead(u16),
    Wild(u32),
}

#[derive(Arbitrary, Debug)]
enum FlagSel {
    Ack,
    AckPsh,
    FinAck,
    Fin,
    Rst,
    RstAck,
    Syn,
    SynAck,
    NoFlags,
    Raw(u8),
}

#[derive(Arbitrary, Debug)]
enum TsSel {
    Good,
    Absent,
    Old(u16),
    Future(u32),
    Wild(u32, u32),
}

#[derive(Arbitrary, Debug)]
enum LenSel {
    Bytes(u16),
    /// The server's window last offered, less this many bytes (at least one byte).
    WindowLess(u16),
}

#[derive(Arbitrary, Debug)]
struct Seg {
    seq: SeqSel,
    ack: AckSel,
    flags: FlagSel,
    window: u16,
    ts: TsSel,
    /// SACK blocks as (distance below the highest sequence number the server sent, length).
    sack: Vec<(u16, u16)>,
    mss: Option<u16>,
    wscale: Option<u8>,
    sack_permitted: bool,
    raw_options: Vec<u8>,
    len: LenSel,
    fill: u8,
    /// From another client port (a new 4-tuple).
    other_port: Option<u16>,
    bad_checksum: bool,
    /// The peer counts the bytes as sent (the next segment continues after them).
    advance: bool,
}

/// The scripted client of the connection.
struct Peer {
    port: u16,
    isn: u32,
    /// Next sequence number to send (wire).
    nxt: u32,
    /// Highest sequence number + length the server sent (wire; the ACK to send).
    server_high: u32,
    server_isn: Option<u32>,
    /// Our timestamp clock and the server's last TSval.
    tsval: u32,
    ts_recent: u32,
    /// Whether the client offered window scaling, the server's shift, and the window it last
    /// offered (bytes, relative to `window_ack`).
    offered_wscale: bool,
    server_wscale: u8,
    server_window: u32,
    window_ack: u32,
}

fn seq_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

fn checksum(mut acc: u64, bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        acc += u64::from(*b) << 8;
    }
    acc
}

fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// An ICMP "fragmentation needed" (RFC 1191 §4) from a router to the server, with next-hop
/// MTU `mtu`, quoting the IP header and first 8 bytes of a segment the server sent to the
/// client's `port` numbered `seq`.
fn packet_too_big(mtu: u16, port: u16, seq: u32) -> Vec<u8> {
    let mut quoted = vec![0x45, 0, 0x05, 0xdc, 0, 0, 0x40, 0, 64, 6, 0, 0];
    quoted.extend_from_slice(&SERVER_IP.octets());
    quoted.extend_from_slice(&CLIENT_IP.octets());
    let c = fold(checksum(0, &quoted));
    quoted[10..12].copy_from_slice(&c.to_be_bytes());
    quoted.extend_from_slice(&SERVER_PORT.to_be_bytes());
    quoted.extend_from_slice(&port.to_be_bytes());
    quoted.extend_from_slice(&seq.to_be_bytes());
    let mut icmp = vec![3, 4, 0, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(&quoted);
    let c = fold(checksum(0, &icmp));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let total = 20 + icmp.len();
    let mut p = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0, 0, 64, 1, 0, 0];
    p.extend_from_slice(&[10, 0, 0, 254]);
    p.extend_from_slice(&SERVER_IP.octets());
    let c = fold(checksum(0, &p));
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(&icmp);
    p
}

/// An IPv4 packet from `src_port` of the client to the server around `tcp` (header and
/// payload); fixes the TCP checksum when `fix` and the header is long enough.
fn ipv4(tcp: &[u8], fix: bool) -> Vec<u8> {
    let total = 20 + tcp.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        1,
        0x40,
        0,
        64,
        6,
        0,
        0,
    ]);
    p.extend_from_slice(&CLIENT_IP.octets());
    p.extend_from_slice(&SERVER_IP.octets());
    let c = fold(checksum(0, &p));
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(tcp);
    if fix && tcp.len() >= 18 {
        p[20 + 16..20 + 18].copy_from_slice(&[0, 0]);
        let mut acc = checksum(0, &CLIENT_IP.octets());
        acc = checksum(acc, &SERVER_IP.octets());
        acc += 6 + tcp.len() as u64;
        acc = checksum(acc, &p[20..]);
        let c = fold(acc);
        p[20 + 16..20 + 18].copy_from_slice(&c.to_be_bytes());
    }
    p
}

#[allow(clippy::too_many_arguments)]
fn tcp_segment(
    port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    options: &[u8],
    payload: &[u8],
    bad_checksum: bool,
) -> Vec<u8> {
    let mut opts = options[..options.len().min(40)].to_vec();
    while opts.len() % 4 != 0 {
        opts.push(0);
    }
    let mut t = Vec::with_capacity(20 + opts.len() + payload.len());
    t.extend_from_slice(&port.to_be_bytes());
    t.extend_from_slice(&SERVER_PORT.to_be_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&ack.to_be_bytes());
    t.push(((5 + opts.len() / 4) as u8) << 4);
    t.push(flags);
    t.extend_from_slice(&window.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 0]);
    t.extend_from_slice(&opts);
    t.extend_from_slice(payload);
    let mut p = ipv4(&t, true);
    if bad_checksum {
        p[20 + 16] ^= 0x5a;
    }
    p
}

fn syn_options(o: &SynOptions, tsval: u32) -> Vec<u8> {
    let mut v = Vec::new();
    if let Some(mss) = o.mss {
        v.extend_from_slice(&[2, 4]);
        v.extend_from_slice(&mss.to_be_bytes());
    }
    if o.sack_permitted {
        v.extend_from_slice(&[1, 1, 4, 2]);
    }
    if o.timestamps {
        v.extend_from_slice(&[1, 1, 8, 10]);
        v.extend_from_slice(&tsval.to_be_bytes());
        v.extend_from_slice(&0u32.to_be_bytes());
    }
    if let Some(ws) = o.wscale {
        v.extend_from_slice(&[1, 3, 3, ws]);
    }
    v
}

struct Run {
    ep: Endpoint,
    now: Instant,
    peer: Peer,
    listener: Option<squarepeg_tcp::ListenerHandle>,
    /// Connections the application holds (the first is the fuzzed one).
    conns: Vec<ConnectionHandle>,
    config: ConnectionConfig,
    audit: Option<WireAudit>,
    buf: Vec<u8>,
    /// Latest SYN-ACK seen per client port (for `Connect`).
    syn_acks: Vec<(u16, u32, u32)>,
}

impl Run {
    fn send(&mut self, packet: &[u8]) {
        self.audit_client(packet);
        let _ = self.ep.handle_packet(self.now, packet);
        self.step();
    }

    /// Feeds a packet from the client side to the audit if it belongs to the connection's
    /// 4-tuple; a SYN or RST there ends the audit (a new incarnation or a reset, which the
    /// audit's picture of one conversation does not cover).
    fn audit_client(&mut self, packet: &[u8]) {
        let Ok(seg) = parse_packet(packet, false) else {
            return;
        };
        if seg.src.port() != self.peer.port || seg.dst.port() != SERVER_PORT {
            return;
        }
        if seg.flags.syn() || seg.flags.rst() {
            self.audit = None;
        }
        if let Some(a) = self.audit.as_mut() {
            a.packet(packet);
        }
    }

    /// Reads the server's output and events back, then checks.
    fn step(&mut self) {
        let mut packets = 0;
        while let Some(n) = self.ep.poll_transmit(self.now, &mut self.buf) {
            packets += 1;
            assert!(packets <= MAX_PACKETS_PER_STEP, "output does not end");
            let p = self.buf[..n].to_vec();
            let seg = parse_packet(&p, true).expect("the endpoint's packets parse");
            assert_eq!(seg.src, SocketAddr::from((SERVER_IP, SERVER_PORT)));
            let SocketAddr::V4(dst) = seg.dst else {
                panic!("IPv6 answer to IPv4")
            };
            if seg.flags.syn() && seg.flags.ack() {
                self.syn_acks.retain(|s| s.0 != dst.port());
                self.syn_acks
                    .push((dst.port(), seg.seq, seg.seq.wrapping_add(seg.seg_len())));
                if self.syn_acks.len() > 64 {
                    self.syn_acks.remove(0);
                }
            }
            if dst.port() == self.peer.port && !seg.flags.rst() {
                if seg.flags.syn() {
                    self.peer.server_isn = Some(seg.seq);
                    self.peer.server_high = seg.seq.wrapping_add(seg.seg_len());
                }
                let end = seg.seq.wrapping_add(seg.seg_len());
                if self.peer.server_isn.is_some() && seq_gt(end, self.peer.server_high) {
                    self.peer.server_high = end;
                }
                if let Some((tsval, _)) = seg.options.timestamps {
                    self.peer.ts_recent = tsval;
                }
                if seg.flags.syn() {
                    self.peer.server_wscale = match seg.options.window_scale {
                        Some(ws) if self.peer.offered_wscale => ws.min(14),
                        _ => 0,
                    };
                    self.peer.server_window = u32::from(seg.window);
                } else if seg.flags.ack() {
                    self.peer.server_window = u32::from(seg.window) << self.peer.server_wscale;
                }
                if seg.flags.ack() {
                    self.peer.window_ack = seg.ack;
                }
            }
            if dst.port() == self.peer.port {
                if let Some(a) = self.audit.as_mut() {
                    a.packet(&p);
                }
                if seg.flags.rst() {
                    self.check_audit();
                    self.audit = None;
                }
            }
        }
        let mut events = 0;
        while let Some(ev) = self.ep.poll_event() {
            events += 1;
            assert!(events <= MAX_EVENTS_PER_STEP, "events do not end");
            if let Event::Incoming(l) = ev {
                while let Some(h) = self.ep.accept(l) {
                    if self.conns.len() < 64 {
                        self.conns.push(h);
                    } else {
                        let _ = self.ep.abort(self.now, h);
                    }
                }
            }
        }
        self.check();
    }

    fn check(&mut self) {
        self.ep.check_invariants();
        assert!(self.ep.connection_count() <= MAX_CONNECTIONS);
        for &h in &self.conns {
            let Some(c) = self.ep.connection(h) else {
                continue;
            };
            let s = c.stats();
            assert!(
                s.recv_buffered <= self.config.recv_buffer,
                "{} bytes in the receive buffer of {}",
                s.recv_buffered,
                self.config.recv_buffer
            );
            assert!(
                s.send_buffered <= self.config.send_buffer,
                "{} bytes in the send buffer of {}",
                s.send_buffered,
                self.config.send_buffer
            );
            if c.unordered_receive() {
                let bound = self.config.recv_buffer * 5 / 4 + 65_536;
                assert!(
                    c.readable() <= bound,
                    "{} bytes waiting in unordered receive, bound {bound}",
                    c.readable()
                );
            }
        }
        self.check_audit();
    }

    fn check_audit(&self) {
        if let Some(a) = &self.audit {
            let server = format!(" {SERVER_IP}:{SERVER_PORT} -> ");
            let bad: Vec<&String> = a
                .violations()
                .iter()
                .filter(|v| v.contains(&server))
                .collect();
            assert!(bad.is_empty(), "wire audit of the server: {bad:#?}");
        }
    }

    fn conn(&self, i: u8) -> Option<ConnectionHandle> {
        (!self.conns.is_empty()).then(|| self.conns[usize::from(i) % self.conns.len()])
    }

    fn segment(&mut self, s: &Seg) {
        let peer = &self.peer;
        let port = s.other_port.filter(|&p| p != 0).unwrap_or(peer.port);
        let seq = match s.seq {
            SeqSel::Next => peer.nxt,
            SeqSel::Ahead(d) => peer.nxt.wrapping_add(u32::from(d)),
            SeqSel::Behind(d) => peer.nxt.wrapping_sub(u32::from(d)),
            SeqSel::Wild(x) => x,
        };
        let ack = match s.ack {
            AckSel::Latest => peer.server_high,
            AckSel::Behind(d) => peer.server_high.wrapping_sub(u32::from(d)),
            AckSel::Ahead(d) => peer.server_high.wrapping_add(u32::from(d)),
            AckSel::Wild(x) => x,
        };
        let flags = match s.flags {
            FlagSel::Ack => TcpFlags::ACK.0,
            FlagSel::AckPsh => TcpFlags::ACK.0 | TcpFlags::PSH.0,
            FlagSel::FinAck => TcpFlags::ACK.0 | TcpFlags::FIN.0,
            FlagSel::Fin => TcpFlags::FIN.0,
            FlagSel::Rst => TcpFlags::RST.0,
            FlagSel::RstAck => TcpFlags::RST.0 | TcpFlags::ACK.0,
            FlagSel::Syn => TcpFlags::SYN.0,
            FlagSel::SynAck => TcpFlags::SYN.0 | TcpFlags::ACK.0,
            FlagSel::NoFlags => 0,
            FlagSel::Raw(f) => f,
        };
        self.peer.tsval = self.peer.tsval.wrapping_add(1);
        let mut opts = Vec::new();
        if let Some(mss) = s.mss {
            opts.extend_from_slice(&[2, 4]);
            opts.extend_from_slice(&mss.to_be_bytes());
        }
        if let Some(ws) = s.wscale {
            opts.extend_from_slice(&[1, 3, 3, ws]);
        }
        if s.sack_permitted {
            opts.extend_from_slice(&[1, 1, 4, 2]);
        }
        let ts = match s.ts {
            TsSel::Good => Some((self.peer.tsval, self.peer.ts_recent)),
            TsSel::Absent => None,
            TsSel::Old(d) => Some((
                self.peer.tsval.wrapping_sub(u32::from(d)),
                self.peer.ts_recent,
            )),
            TsSel::Future(d) => Some((self.peer.tsval.wrapping_add(d), self.peer.ts_recent)),
            TsSel::Wild(a, b) => Some((a, b)),
        };
        if let Some((val, ecr)) = ts {
            opts.extend_from_slice(&[1, 1, 8, 10]);
            opts.extend_from_slice(&val.to_be_bytes());
            opts.extend_from_slice(&ecr.to_be_bytes());
        }
        let blocks: Vec<_> = s.sack.iter().take(4).collect();
        if !blocks.is_empty() {
            opts.extend_from_slice(&[1, 1, 5, 2 + 8 * blocks.len() as u8]);
            for &&(below, len) in &blocks {
                let left = self.peer.server_high.wrapping_sub(u32::from(below));
                opts.extend_from_slice(&left.to_be_bytes());
                opts.extend_from_slice(&left.wrapping_add(u32::from(len)).to_be_bytes());
            }
        }
        opts.extend_from_slice(&s.raw_options);
        let len = match s.len {
            LenSel::Bytes(n) => usize::from(n) % 4000,
            LenSel::WindowLess(less) => {
                let right = self.peer.window_ack.wrapping_add(self.peer.server_window);
                let room = right.wrapping_sub(seq) as i32;
                room.saturating_sub(i32::from(less)).clamp(1, 60_000) as usize
            }
        };
        let payload: Vec<u8> = (0..len)
            .map(|i| s.fill.wrapping_add((i as u32).wrapping_add(seq) as u8))
            .collect();
        let packet = tcp_segment(
            port,
            seq,
            ack,
            flags,
            s.window,
            &opts,
            &payload,
            s.bad_checksum,
        );
        let f = TcpFlags(flags);
        if port == self.peer.port && s.advance && seq == self.peer.nxt {
            let seg_len = payload.len() as u32 + u32::from(f.syn()) + u32::from(f.fin());
            self.peer.nxt = seq.wrapping_add(seg_len);
        }
        self.send(&packet);
    }

    fn connect(&mut self, port: u16, syn: &SynOptions, ack: bool) {
        if port == 0 || port == self.peer.port {
            return;
        }
        let isn = u32::from(port).wrapping_mul(0x9e37_79b9);
        let opts = syn_options(syn, self.peer.tsval);
        let p = tcp_segment(port, isn, 0, TcpFlags::SYN.0, syn.window, &opts, &[], false);
        self.send(&p);
        if !ack {
            return;
        }
        let Some(&(_, _, server_nxt)) = self.syn_acks.iter().find(|s| s.0 == port) else {
            return;
        };
        let mut opts = Vec::new();
        if syn.timestamps {
            opts.extend_from_slice(&[1, 1, 8, 10]);
            opts.extend_from_slice(&self.peer.tsval.wrapping_add(1).to_be_bytes());
            opts.extend_from_slice(&self.peer.ts_recent.to_be_bytes());
        }
        let p = tcp_segment(
            port,
            isn.wrapping_add(1),
            server_nxt,
            TcpFlags::ACK.0,
            syn.window,
            &opts,
            &[],
            false,
        );
        self.send(&p);
    }
}

fuzz_target!(|input: Input| {
    let s = &input.setup;
    let start = Instant::now();
    let mut ec = EndpointConfig::default();
    ec.secret = [7; 32];
    ec.max_connections = MAX_CONNECTIONS;
    ec.max_half_open = MAX_HALF_OPEN;
    ec.max_pending_replies = 16;
    ec.syn_cookies = match s.cookies % 3 {
        0 => SynCookies::Never,
        1 => SynCookies::WhenBacklogFull,
        _ => SynCookies::Always,
    };
    let mut cc = ConnectionConfig::default();
    cc.recv_buffer = 512 + usize::from(s.recv_buffer) % (256 * 1024);
    cc.send_buffer = 512 + usize::from(s.send_buffer) % (256 * 1024);
    cc.max_ooo_ranges = 1 + usize::from(s.max_ooo_ranges) % 64;
    // An endpoint memory budget (squarepeg_tcp::mem) from 2 KiB up, often below what the
    // buffers allow, so that its policy runs; `check_invariants` checks its bound.
    ec.memory = MemoryBudget::new(2048 + usize::from(s.recv_buffer ^ s.send_buffer) * 8)
        .with_pressure(1024 + usize::from(s.send_buffer) * 4)
        .with_floor(256 + usize::from(s.max_ooo_ranges) * 32);
    cc.window_scale = s.window_scale.map(|w| w % 15);
    cc.mss = s.mss.map(|m| m.max(64));
    cc.sack = s.sack;
    cc.timestamps = s.timestamps;
    cc.window_scaling = s.window_scaling;
    cc.delayed_ack = s.delayed_ack.then(|| Duration::from_millis(40));
    cc.nagle = s.nagle;
    cc.unordered_receive = s.unordered;
    cc.congestion = if s.reno {
        CongestionAlgorithm::NewReno
    } else {
        CongestionAlgorithm::Cubic
    };
    cc.rack_tlp = s.rack_tlp;
    cc.consistent_segmentation = s.consistent_segmentation;
    cc.keepalive = s
        .keepalive
        .then(|| KeepaliveConfig::new(Duration::from_secs(5), Duration::from_secs(1), 3));
    cc.user_timeout = s.user_timeout.then(|| Duration::from_secs(30));
    cc.drop_segments_without_timestamps = s.drop_without_timestamps;
    cc.time_wait = Duration::from_secs(2);
    cc.fin_wait2_timeout = Duration::from_secs(3);
    cc.fast_open = s.fast_open;
    cc.fast_open_max_pending = 2;
    cc.short_time_wait = s.short_time_wait.then(|| Duration::from_millis(100));
    let mut ep = Endpoint::new(ec, start);
    let backlog = 1 + usize::from(s.backlog) % 8;
    let listener = ep
        .listen(
            SocketAddr::from((SERVER_IP, SERVER_PORT)),
            backlog,
            cc.clone(),
        )
        .unwrap();
    let port = s.client_port.max(1);
    let mut run = Run {
        ep,
        now: start,
        peer: Peer {
            port,
            isn: s.client_isn,
            nxt: s.client_isn,
            server_high: 0,
            server_isn: None,
            tsval: 1000,
            ts_recent: 0,
            offered_wscale: s.syn.wscale.is_some(),
            server_wscale: 0,
            server_window: 0,
            window_ack: 0,
        },
        listener: Some(listener),
        conns: Vec::new(),
        config: cc,
        audit: Some(WireAudit::new(true)),
        buf: vec![0u8; 1500],
        syn_acks: Vec::new(),
    };

    // The handshake.
    let opts = syn_options(&s.syn, run.peer.tsval);
    let syn = tcp_segment(
        port,
        run.peer.isn,
        0,
        TcpFlags::SYN.0,
        s.syn.window,
        &opts,
        &[],
        false,
    );
    run.send(&syn);
    run.peer.nxt = run.peer.isn.wrapping_add(1);
    assert!(run.peer.server_isn.is_some(), "no SYN-ACK");
    let mut opts = Vec::new();
    if s.syn.timestamps {
        run.peer.tsval += 1;
        opts.extend_from_slice(&[1, 1, 8, 10]);
        opts.extend_from_slice(&run.peer.tsval.to_be_bytes());
        opts.extend_from_slice(&run.peer.ts_recent.to_be_bytes());
    }
    let ack = tcp_segment(
        port,
        run.peer.nxt,
        run.peer.server_high,
        TcpFlags::ACK.0,
        s.syn.window,
        &opts,
        &[],
        false,
    );
    run.send(&ack);
    assert_eq!(run.conns.len(), 1, "the handshake did not complete");
    let main = run.conns[0];
    assert_eq!(run.ep.connection(main).unwrap().state(), State::Established);

    let mut buf = vec![0u8; 70_000];
    for op in input.ops.iter().take(400) {
        match op {
            Op::Segment(seg) => run.segment(seg),
            Op::RawIp(bytes) => run.send(bytes),
            Op::PacketTooBig { mtu, behind } => {
                let seq = run.peer.server_high.wrapping_sub(u32::from(*behind));
                let p = packet_too_big(*mtu, run.peer.port, seq);
                let _ = run.ep.handle_packet(run.now, &p);
                run.step();
            }
            Op::RawTcp(bytes) => {
                let mut t = bytes.clone();
                if t.len() >= 4 {
                    t[..2].copy_from_slice(&run.peer.port.to_be_bytes());
                    t[2..4].copy_from_slice(&SERVER_PORT.to_be_bytes());
                }
                let p = ipv4(&t, true);
                run.send(&p);
            }
            Op::Connect { port, syn, ack } => run.connect(*port, syn, *ack),
            Op::Advance { ms } => {
                run.now += Duration::from_millis(u64::from(*ms));
                run.ep.handle_timeout(run.now);
                run.step();
            }
            Op::NextTimer => {
                if let Some(t) = run.ep.poll_timeout() {
                    run.now = run.now.max(t);
                    run.ep.handle_timeout(run.now);
                }
                run.step();
            }
            Op::Write { conn, len, fill } => {
                if let Some(h) = run.conn(*conn) {
                    let data = vec![*fill; usize::from(*len)];
                    let _ = run.ep.write(h, &data);
                }
                run.step();
            }
            Op::WriteMessage {
                conn,
                len,
                priority,
                squash,
                deadline_ms,
                id,
                depends_on,
            } => {
                if let Some(h) = run.conn(*conn) {
                    let mut tag = WriteTag::default();
                    tag.priority = i32::from(*priority);
                    tag.squash_key = squash.map(u64::from);
                    tag.deadline = deadline_ms.map(|ms| run.now + Duration::from_millis(ms.into()));
                    tag.message_id = id.map(u64::from);
                    tag.depends_on = depends_on.map(u64::from);
                    let data = vec![0x6d; usize::from(*len) % 9000];
                    let _ = run.ep.write_message(h, &data, tag);
                }
                run.step();
            }
            Op::Squash { conn, key } => {
                if let Some(h) = run.conn(*conn) {
                    let now = run.now;
                    let _ = run.ep.send_queue(h, |q| {
                        q.squash(now, u64::from(*key));
                    });
                }
                run.step();
            }
            Op::Read { conn, len } => {
                if let Some(h) = run.conn(*conn) {
                    let n = usize::from(*len).min(buf.len());
                    let _ = run.ep.read(h, &mut buf[..n]);
                }
                run.step();
            }
            Op::ReadSegment { conn, len } => {
                if let Some(h) = run.conn(*conn) {
                    let n = usize::from(*len).min(buf.len());
                    let _ = run.ep.read_segment(h, &mut buf[..n]);
                }
                run.step();
            }
            Op::EnableUnordered { conn } => {
                if let Some(h) = run.conn(*conn) {
                    let _ = run.ep.enable_unordered_receive(h);
                }
                run.step();
            }
            Op::PollReports { conn } => {
                if let Some(h) = run.conn(*conn) {
                    while let Ok(Some(_)) = run.ep.poll_report(h) {}
                }
                run.step();
            }
            Op::Shutdown { conn } => {
                if let Some(h) = run.conn(*conn) {
                    let _ = run.ep.shutdown(run.now, h);
                }
                run.step();
            }
            Op::Close { conn } => {
                if let Some(h) = run.conn(*conn) {
                    let _ = run.ep.close(run.now, h);
                    run.conns.retain(|&c| c != h);
                }
                run.step();
            }
            Op::Abort { conn } => {
                if let Some(h) = run.conn(*conn) {
                    let _ = run.ep.abort(run.now, h);
                    run.conns.retain(|&c| c != h);
                }
                run.step();
            }
            Op::Unlisten => {
                if let Some(l) = run.listener.take() {
                    run.ep.unlisten(run.now, l).unwrap();
                }
                run.step();
            }
        }
    }
});
