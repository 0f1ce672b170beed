//! Test helpers: a small, independent TCP/IP packet crafter and parser (written separately
//! from the crate's `wire` module so that each checks the other), a packetdrill-style harness
//! around one endpoint, and a two-endpoint pump with scripted drops.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use squarepeg_tcp::{
    ConnectionConfig, ConnectionHandle, Endpoint, EndpointConfig, Event, ListenerHandle,
};

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;
pub const ACK: u8 = 0x10;

fn csum_add(mut acc: u32, data: &[u8]) -> u32 {
    let mut i = 0;
    while i + 1 < data.len() {
        acc += ((data[i] as u32) << 8) | data[i + 1] as u32;
        i += 2;
    }
    if i < data.len() {
        acc += (data[i] as u32) << 8;
    }
    acc
}

fn csum_finish(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// A TCP option to put in a crafted packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opt {
    Mss(u16),
    Ws(u8),
    SackOk,
    Ts(u32, u32),
    Sack(Vec<(u32, u32)>),
    Nop,
    Eol,
    Raw(Vec<u8>),
}

/// A TCP segment description, for crafting and for parsed output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pkt {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub win: u16,
    pub opts: Vec<Opt>,
    pub payload: Vec<u8>,
}

impl Pkt {
    pub fn new(src: SocketAddr, dst: SocketAddr, flags: u8, seq: u32, ack: u32) -> Pkt {
        Pkt {
            src,
            dst,
            seq,
            ack,
            flags,
            win: 65535,
            opts: Vec::new(),
            payload: Vec::new(),
        }
    }
    pub fn win(mut self, w: u16) -> Pkt {
        self.win = w;
        self
    }
    pub fn opt(mut self, o: Opt) -> Pkt {
        self.opts.push(o);
        self
    }
    pub fn data(mut self, d: &[u8]) -> Pkt {
        self.payload = d.to_vec();
        self
    }

    pub fn options_bytes(&self) -> Vec<u8> {
        let mut o = Vec::new();
        for opt in &self.opts {
            match opt {
                Opt::Mss(m) => o.extend_from_slice(&[2, 4, (m >> 8) as u8, *m as u8]),
                Opt::Ws(w) => o.extend_from_slice(&[3, 3, *w]),
                Opt::SackOk => o.extend_from_slice(&[4, 2]),
                Opt::Ts(a, b) => {
                    o.extend_from_slice(&[8, 10]);
                    o.extend_from_slice(&a.to_be_bytes());
                    o.extend_from_slice(&b.to_be_bytes());
                }
                Opt::Sack(blocks) => {
                    o.extend_from_slice(&[5, 2 + 8 * blocks.len() as u8]);
                    for (l, r) in blocks {
                        o.extend_from_slice(&l.to_be_bytes());
                        o.extend_from_slice(&r.to_be_bytes());
                    }
                }
                Opt::Nop => o.push(1),
                Opt::Eol => o.push(0),
                Opt::Raw(b) => o.extend_from_slice(b),
            }
        }
        while o.len() % 4 != 0 {
            o.push(1);
        }
        o
    }

    /// Encodes the whole IP packet.
    pub fn build(&self) -> Vec<u8> {
        let opts = self.options_bytes();
        let tcp_len = 20 + opts.len() + self.payload.len();
        let mut tcp = Vec::with_capacity(tcp_len);
        tcp.extend_from_slice(&self.src.port().to_be_bytes());
        tcp.extend_from_slice(&self.dst.port().to_be_bytes());
        tcp.extend_from_slice(&self.seq.to_be_bytes());
        tcp.extend_from_slice(&self.ack.to_be_bytes());
        tcp.push((((20 + opts.len()) / 4) as u8) << 4);
        tcp.push(self.flags);
        tcp.extend_from_slice(&self.win.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0]);
        tcp.extend_from_slice(&opts);
        tcp.extend_from_slice(&self.payload);
        let mut pseudo = Vec::new();
        match (self.src.ip(), self.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                pseudo.extend_from_slice(&s.octets());
                pseudo.extend_from_slice(&d.octets());
                pseudo.extend_from_slice(&[0, 6]);
                pseudo.extend_from_slice(&(tcp_len as u16).to_be_bytes());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                pseudo.extend_from_slice(&s.octets());
                pseudo.extend_from_slice(&d.octets());
                pseudo.extend_from_slice(&(tcp_len as u32).to_be_bytes());
                pseudo.extend_from_slice(&[0, 0, 0, 6]);
            }
            _ => panic!("mixed families"),
        }
        let c = csum_finish(csum_add(csum_add(0, &pseudo), &tcp));
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        let mut ip = Vec::new();
        match (self.src.ip(), self.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let total = 20 + tcp_len;
                ip.extend_from_slice(&[0x45, 0]);
                ip.extend_from_slice(&(total as u16).to_be_bytes());
                ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
                let c = csum_finish(csum_add(0, &ip));
                ip[10..12].copy_from_slice(&c.to_be_bytes());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                ip.extend_from_slice(&[0x60, 0, 0, 0]);
                ip.extend_from_slice(&(tcp_len as u16).to_be_bytes());
                ip.extend_from_slice(&[6, 64]);
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
            }
            _ => unreachable!(),
        }
        ip.extend_from_slice(&tcp);
        ip
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub fn ts(&self) -> Option<(u32, u32)> {
        self.opts.iter().find_map(|o| match o {
            Opt::Ts(a, b) => Some((*a, *b)),
            _ => None,
        })
    }
    pub fn mss(&self) -> Option<u16> {
        self.opts.iter().find_map(|o| match o {
            Opt::Mss(m) => Some(*m),
            _ => None,
        })
    }
    pub fn ws(&self) -> Option<u8> {
        self.opts.iter().find_map(|o| match o {
            Opt::Ws(m) => Some(*m),
            _ => None,
        })
    }
    pub fn sack_ok(&self) -> bool {
        self.opts.contains(&Opt::SackOk)
    }
    pub fn sack(&self) -> Vec<(u32, u32)> {
        self.opts
            .iter()
            .find_map(|o| match o {
                Opt::Sack(b) => Some(b.clone()),
                _ => None,
            })
            .unwrap_or_default()
    }
    pub fn flag_str(&self) -> String {
        let mut s = String::new();
        for (bit, c) in [(SYN, 'S'), (FIN, 'F'), (RST, 'R'), (PSH, 'P'), (ACK, '.')] {
            if self.flags & bit != 0 {
                s.push(c);
            }
        }
        s
    }
}

/// Independent parser; verifies both checksums and panics on anything malformed (the endpoint
/// must never emit such a packet).
pub fn parse(p: &[u8]) -> Pkt {
    let (src_ip, dst_ip, tcp, pseudo): (IpAddr, IpAddr, &[u8], Vec<u8>) = match p[0] >> 4 {
        4 => {
            let ihl = (p[0] & 15) as usize * 4;
            let total = u16::from_be_bytes([p[2], p[3]]) as usize;
            assert_eq!(total, p.len(), "IPv4 total length");
            assert_eq!(
                csum_finish(csum_add(0, &p[..ihl])),
                0,
                "IPv4 header checksum"
            );
            assert_eq!(p[9], 6);
            assert_eq!(p[6] & 0x40, 0x40, "DF set");
            let s: [u8; 4] = p[12..16].try_into().unwrap();
            let d: [u8; 4] = p[16..20].try_into().unwrap();
            let tcp = &p[ihl..total];
            let mut ps = Vec::new();
            ps.extend_from_slice(&s);
            ps.extend_from_slice(&d);
            ps.extend_from_slice(&[0, 6]);
            ps.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
            (IpAddr::from(s), IpAddr::from(d), tcp, ps)
        }
        6 => {
            let plen = u16::from_be_bytes([p[4], p[5]]) as usize;
            assert_eq!(plen + 40, p.len(), "IPv6 payload length");
            assert_eq!(p[6], 6);
            let s: [u8; 16] = p[8..24].try_into().unwrap();
            let d: [u8; 16] = p[24..40].try_into().unwrap();
            let tcp = &p[40..];
            let mut ps = Vec::new();
            ps.extend_from_slice(&s);
            ps.extend_from_slice(&d);
            ps.extend_from_slice(&(tcp.len() as u32).to_be_bytes());
            ps.extend_from_slice(&[0, 0, 0, 6]);
            (IpAddr::from(s), IpAddr::from(d), tcp, ps)
        }
        v => panic!("IP version {v}"),
    };
    assert_eq!(
        csum_finish(csum_add(csum_add(0, &pseudo), tcp)),
        0,
        "TCP checksum"
    );
    let off = (tcp[12] >> 4) as usize * 4;
    let mut opts = Vec::new();
    let mut o = &tcp[20..off];
    while !o.is_empty() {
        match o[0] {
            0 => {
                opts.push(Opt::Eol);
                break;
            }
            1 => {
                opts.push(Opt::Nop);
                o = &o[1..];
                continue;
            }
            k => {
                let len = o[1] as usize;
                let b = &o[2..len];
                match k {
                    2 => opts.push(Opt::Mss(u16::from_be_bytes([b[0], b[1]]))),
                    3 => opts.push(Opt::Ws(b[0])),
                    4 => opts.push(Opt::SackOk),
                    8 => opts.push(Opt::Ts(
                        u32::from_be_bytes(b[0..4].try_into().unwrap()),
                        u32::from_be_bytes(b[4..8].try_into().unwrap()),
                    )),
                    5 => opts.push(Opt::Sack(
                        b.chunks(8)
                            .map(|c| {
                                (
                                    u32::from_be_bytes(c[0..4].try_into().unwrap()),
                                    u32::from_be_bytes(c[4..8].try_into().unwrap()),
                                )
                            })
                            .collect(),
                    )),
                    _ => opts.push(Opt::Raw(o[..len].to_vec())),
                }
                o = &o[len..];
            }
        }
    }
    Pkt {
        src: SocketAddr::new(src_ip, u16::from_be_bytes([tcp[0], tcp[1]])),
        dst: SocketAddr::new(dst_ip, u16::from_be_bytes([tcp[2], tcp[3]])),
        seq: u32::from_be_bytes(tcp[4..8].try_into().unwrap()),
        ack: u32::from_be_bytes(tcp[8..12].try_into().unwrap()),
        flags: tcp[13],
        win: u16::from_be_bytes([tcp[14], tcp[15]]),
        opts,
        payload: tcp[off..].to_vec(),
    }
}

pub fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// An ICMP "packet too big" from `router` to the sender of `original` (an IP packet it
/// sent), as a router before a link of `mtu` bytes would send it: ICMPv4 type 3 code 4 with
/// the next-hop MTU (RFC 1191 §4), quoting the original's IP header and 8 bytes, or ICMPv6
/// type 2 (RFC 4443 §3.2) quoting as much as fits in 1280 bytes.
pub fn icmp_too_big(router: IpAddr, mtu: u32, original: &[u8]) -> Vec<u8> {
    let to_v4 = |b: &[u8]| std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    match router {
        IpAddr::V4(r) => {
            let ihl = ((original[0] & 0x0f) as usize) * 4;
            let quoted = &original[..(ihl + 8).min(original.len())];
            let mut icmp = vec![3, 4, 0, 0, 0, 0];
            icmp.extend_from_slice(&(mtu as u16).to_be_bytes());
            icmp.extend_from_slice(quoted);
            let c = csum_finish(csum_add(0, &icmp));
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let total = 20 + icmp.len();
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&(total as u16).to_be_bytes());
            ip.extend_from_slice(&[0, 0, 0, 0, 64, 1, 0, 0]);
            ip.extend_from_slice(&r.octets());
            ip.extend_from_slice(&to_v4(&original[12..16]).octets());
            let c = csum_finish(csum_add(0, &ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            ip.extend_from_slice(&icmp);
            ip
        }
        IpAddr::V6(r) => {
            let quoted = &original[..original.len().min(1280 - 48)];
            let mut icmp = vec![2, 0, 0, 0];
            icmp.extend_from_slice(&mtu.to_be_bytes());
            icmp.extend_from_slice(quoted);
            let dst = &original[8..24];
            let mut pseudo = Vec::new();
            pseudo.extend_from_slice(&r.octets());
            pseudo.extend_from_slice(dst);
            pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 58]);
            let c = csum_finish(csum_add(csum_add(0, &pseudo), &icmp));
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut ip = vec![0x60, 0, 0, 0];
            ip.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
            ip.extend_from_slice(&[58, 64]);
            ip.extend_from_slice(&r.octets());
            ip.extend_from_slice(dst);
            ip.extend_from_slice(&icmp);
            ip
        }
    }
}

/// A packetdrill-style harness around one endpoint under test, with virtual time.
pub struct Harness {
    pub ep: Endpoint,
    pub t0: Instant,
    pub now: Instant,
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

impl Harness {
    pub fn new(local: &str, remote: &str) -> Harness {
        Harness::with_config(local, remote, EndpointConfig::default())
    }

    pub fn with_config(local: &str, remote: &str, cfg: EndpointConfig) -> Harness {
        let t0 = Instant::now();
        Harness {
            ep: Endpoint::new(cfg, t0),
            t0,
            now: t0,
            local: addr(local),
            remote: addr(remote),
        }
    }

    /// Milliseconds of virtual time since the start.
    pub fn ms(&self) -> u128 {
        (self.now - self.t0).as_millis()
    }

    /// A packet from the scripted peer to the endpoint.
    pub fn pkt(&self, flags: u8, seq: u32, ack: u32) -> Pkt {
        Pkt::new(self.remote, self.local, flags, seq, ack)
    }

    pub fn inject(&mut self, p: &Pkt) -> Result<(), squarepeg_tcp::DropReason> {
        self.ep.handle_packet(self.now, &p.build())
    }

    /// All packets the endpoint wants to send now.
    pub fn out(&mut self) -> Vec<Pkt> {
        let mut v = Vec::new();
        let mut buf = vec![0u8; 9000];
        for _ in 0..10_000 {
            match self.ep.poll_transmit(self.now, &mut buf) {
                Some(n) => v.push(parse(&buf[..n])),
                None => break,
            }
        }
        v
    }

    /// Exactly one packet.
    pub fn out1(&mut self) -> Pkt {
        let v = self.out();
        assert_eq!(v.len(), 1, "expected one packet, got {v:#?}");
        v.into_iter().next().unwrap()
    }

    pub fn none(&mut self) {
        let v = self.out();
        assert!(v.is_empty(), "expected no packet, got {v:#?}");
    }

    pub fn advance(&mut self, d: Duration) {
        let target = self.now + d;
        while let Some(t) = self.ep.poll_timeout() {
            if t > target {
                break;
            }
            self.now = self.now.max(t);
            self.ep.handle_timeout(self.now);
        }
        self.now = target;
        self.ep.handle_timeout(self.now);
    }

    /// Advances to the next timer and fires it; returns the time advanced.
    pub fn fire_next_timer(&mut self) -> Duration {
        let t = self.ep.poll_timeout().expect("a timer is armed");
        let d = t.saturating_duration_since(self.now);
        self.now = self.now.max(t);
        self.ep.handle_timeout(self.now);
        d
    }

    pub fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.ep.poll_event()).collect()
    }

    pub fn connect(&mut self, cfg: ConnectionConfig) -> ConnectionHandle {
        self.ep
            .connect(self.now, self.local, self.remote, cfg)
            .unwrap()
    }

    pub fn listen(&mut self, backlog: usize, cfg: ConnectionConfig) -> ListenerHandle {
        self.ep.listen(self.local, backlog, cfg).unwrap()
    }

    pub fn read_all(&mut self, h: ConnectionHandle) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = self.ep.read(h, &mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    }
}

/// Two endpoints joined by a scripted link: packets move directly from one to the other with a
/// fixed one-way delay; the test's `drop` closure decides which packets are lost.
pub struct Pump {
    pub a: Endpoint,
    pub b: Endpoint,
    pub now: Instant,
    pub t0: Instant,
    pub delay: Duration,
    /// In flight: (arrival time, to_a, packet).
    pub wire: Vec<(Instant, bool, Vec<u8>)>,
    pub sent_a: u64,
    pub sent_b: u64,
    pub log: bool,
    /// Deliver every n-th packet (by sender index) twice; 0 = never.
    pub duplicate_every: u64,
}

impl Pump {
    pub fn new(delay: Duration) -> Pump {
        let t0 = Instant::now();
        let mut ca = EndpointConfig::default();
        ca.secret = [1; 32];
        let mut cb = EndpointConfig::default();
        cb.secret = [2; 32];
        Pump {
            a: Endpoint::new(ca, t0),
            b: Endpoint::new(cb, t0),
            now: t0,
            t0,
            delay,
            wire: Vec::new(),
            sent_a: 0,
            sent_b: 0,
            log: false,
            duplicate_every: 0,
        }
    }

    /// Moves packets and fires timers until `done` holds or the virtual time limit passes.
    /// `drop(from_a, index, packet)` returns true for packets the link loses. `app` runs after
    /// every step to read/write.
    pub fn run(
        &mut self,
        limit: Duration,
        mut drop: impl FnMut(bool, u64, &Pkt) -> bool,
        app: impl FnMut(&mut Endpoint, &mut Endpoint, Instant) -> bool,
    ) -> bool {
        self.run_with(
            limit,
            move |from_a, i, p| (!drop(from_a, i, p)).then_some(Duration::ZERO),
            app,
        )
    }

    /// Like `run`, but `action` returns `None` to drop a packet or `Some(extra)` to deliver it
    /// with `extra` delay on top of the link delay (reordering).
    pub fn run_with(
        &mut self,
        limit: Duration,
        mut action: impl FnMut(bool, u64, &Pkt) -> Option<Duration>,
        mut app: impl FnMut(&mut Endpoint, &mut Endpoint, Instant) -> bool,
    ) -> bool {
        let mut buf = vec![0u8; 65535];
        let deadline = self.now + limit;
        loop {
            if app(&mut self.a, &mut self.b, self.now) {
                return true;
            }
            // Collect output of both sides.
            let mut progressed = false;
            for from_a in [true, false] {
                loop {
                    let ep = if from_a { &mut self.a } else { &mut self.b };
                    let Some(n) = ep.poll_transmit(self.now, &mut buf) else {
                        break;
                    };
                    progressed = true;
                    let p = parse(&buf[..n]);
                    let idx = if from_a {
                        self.sent_a += 1;
                        self.sent_a - 1
                    } else {
                        self.sent_b += 1;
                        self.sent_b - 1
                    };
                    let act = action(from_a, idx, &p);
                    let dropped = act.is_none();
                    if self.log {
                        eprintln!(
                            "{:>8.3} {} {} seq={} ack={} len={} win={} {:?}{}",
                            (self.now - self.t0).as_secs_f64(),
                            if from_a { "A>B" } else { "B>A" },
                            p.flag_str(),
                            p.seq,
                            p.ack,
                            p.payload.len(),
                            p.win,
                            p.sack(),
                            if dropped { " DROPPED" } else { "" }
                        );
                    }
                    if let Some(extra) = act {
                        self.wire
                            .push((self.now + self.delay + extra, !from_a, buf[..n].to_vec()));
                        if self.duplicate_every > 0 && idx % self.duplicate_every == 0 {
                            self.wire.push((
                                self.now + self.delay + extra + Duration::from_micros(300),
                                !from_a,
                                buf[..n].to_vec(),
                            ));
                        }
                    }
                }
            }
            if progressed {
                continue;
            }
            // Next event: a packet arrival or a timer.
            let next_arrival = self.wire.iter().map(|w| w.0).min();
            let next_timer = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = [next_arrival, next_timer].into_iter().flatten().min() else {
                // Network idle: let a slow application drain its buffers (which may open
                // windows and restart the network).
                let mut finished = false;
                for _ in 0..100_000 {
                    if app(&mut self.a, &mut self.b, self.now) {
                        finished = true;
                        break;
                    }
                    let busy = [self.a.poll_timeout(), self.b.poll_timeout()]
                        .iter()
                        .any(|t| t.is_some());
                    let mut probe = vec![0u8; 65535];
                    let pa = self.a.poll_transmit(self.now, &mut probe);
                    if let Some(n) = pa {
                        self.wire
                            .push((self.now + self.delay, false, probe[..n].to_vec()));
                    }
                    let pb = self.b.poll_transmit(self.now, &mut probe);
                    if let Some(n) = pb {
                        self.wire
                            .push((self.now + self.delay, true, probe[..n].to_vec()));
                    }
                    if busy || pa.is_some() || pb.is_some() {
                        break;
                    }
                }
                if finished {
                    return true;
                }
                if self.wire.is_empty()
                    && self.a.poll_timeout().is_none()
                    && self.b.poll_timeout().is_none()
                {
                    return false;
                }
                continue;
            };
            if next > deadline {
                return false;
            }
            self.now = self.now.max(next);
            // Deliver the first packet due now (in order of sending), then let both sides
            // respond before the next one, as a host does between packets.
            let due = self
                .wire
                .iter()
                .enumerate()
                .filter(|(_, w)| w.0 <= self.now)
                .min_by_key(|(i, w)| (w.0, *i))
                .map(|(i, _)| i);
            if let Some(i) = due {
                let (_, to_a, pkt) = self.wire.remove(i);
                let ep = if to_a { &mut self.a } else { &mut self.b };
                let _ = ep.handle_packet(self.now, &pkt);
            }
            self.a.handle_timeout(self.now);
            self.b.handle_timeout(self.now);
        }
    }
}
