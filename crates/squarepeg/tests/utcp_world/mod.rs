//! Squarepeg connections over the userspace TCP in the lab's deterministic simulator.
//!
//! [`PegHost`] is a simulator host with one squarepeg connection — the library's connection
//! core (`squarepeg_connection::Connection`, driven by its `EndpointLink`) — over uTCP or over
//! a standard, in-order TCP (what the kernel substrate does: the stock-TCP peer of Minion §3.3
//! and Hollywood §4.4), with an [`App`] on top. The default one, [`PlanApp`], sends a seeded
//! plan of messages (some with lifetimes, priorities, sub-streams) and one stream, and checks
//! everything it receives against the peer's plan: every message byte-identical to the one
//! sent under its number, none twice, the stream's SHA-256.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use squarepeg::{MessageProps, MessageStatus, Priority};
use squarepeg_connection::{
    Config, Connection, EndpointLink, Substrate, UtcpStats, tcp_config as core_tcp_config,
};
use squarepeg_lab::sim::Host;
use squarepeg_session::{Event, MessageNumber, ReadOutcome, Role, StreamId};
use squarepeg_tcp::{ConnectionConfig, ConnectionHandle, Endpoint, EndpointConfig};

pub const CLIENT: &str = "10.0.0.1:40000";
pub const SERVER: &str = "10.0.1.1:443";

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The peer's stream being read (`current`), or else the next one it opened, which becomes
/// the current one.
pub fn stream_to_read(
    s: &mut squarepeg_session::Session,
    current: &mut Option<StreamId>,
) -> Option<StreamId> {
    if current.is_none() {
        *current = s.accept_stream();
    }
    *current
}

/// Deterministic bytes: `len` bytes of stream `seed` from `offset`.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (mix(seed ^ ((offset + i) >> 3)) >> (((offset + i) & 7) * 8)) as u8)
        .collect()
}

/// One planned message.
#[derive(Clone, Debug)]
pub struct PlannedMessage {
    pub at: Duration,
    pub len: usize,
    pub props: MessageProps,
}

/// What one side sends.
#[derive(Clone, Debug)]
pub struct SendPlan {
    pub seed: u64,
    pub messages: Vec<PlannedMessage>,
    pub stream_bytes: u64,
}

impl SendPlan {
    /// `count` messages over `span`, of 1..max_len bytes; `timed` of them (a fraction) with a
    /// lifetime, priorities and sub-streams at random.
    pub fn seeded(
        seed: u64,
        count: usize,
        span: Duration,
        max_len: usize,
        timed: f64,
        lifetime: Duration,
        stream_bytes: u64,
    ) -> SendPlan {
        let mut z = mix(seed);
        let mut next = || {
            z = mix(z);
            z
        };
        let messages = (0..count)
            .map(|i| {
                let at = span.mul_f64(i as f64 / count.max(1) as f64);
                let len = 1 + (next() % max_len as u64) as usize;
                let timed_one = (next() % 1000) as f64 / 1000.0 < timed;
                let props = MessageProps {
                    substream: next() % 3,
                    priority: Priority::new((next() % 8) as u8).unwrap_or_default(),
                    lifetime: timed_one.then_some(lifetime),
                    ..Default::default()
                };
                PlannedMessage { at, len, props }
            })
            .collect();
        SendPlan {
            seed,
            messages,
            stream_bytes,
        }
    }

    /// The payload of message `i`: its index, then pattern bytes.
    pub fn payload(&self, i: usize) -> Vec<u8> {
        let mut p = (i as u64).to_le_bytes().to_vec();
        p.extend(pattern(
            self.seed ^ 0xF00D,
            (i as u64) << 24,
            self.messages[i].len,
        ));
        p
    }

    pub fn stream_digest(&self) -> [u8; 32] {
        Sha256::digest(pattern(self.seed, 0, self.stream_bytes as usize)).into()
    }
}

/// The connection core on one connection of the simulated endpoint.
struct Glue {
    conn: Connection,
    link: EndpointLink,
}

/// The application on a [`PegHost`]'s connection.
pub trait App: 'static {
    /// One round: take the connection's events and received data, and act on it. Called
    /// after anything happened to the host, and between the link's moves of data.
    fn round(&mut self, now: Instant, conn: &mut Connection);
    /// When the application wants a round although nothing happens (a planned send).
    fn poll_timeout(&self) -> Option<Instant>;
}

/// Sends a [`SendPlan`] and checks what arrives against the peer's; closes once both are
/// complete.
#[derive(Debug)]
pub struct PlanApp {
    start: Instant,
    pub plan: SendPlan,
    pub peer_plan: SendPlan,
    send_stream: Option<StreamId>,
    recv_stream: Option<StreamId>,
    buf: Vec<u8>,
    pub next_message: usize,
    pub statuses: BTreeMap<MessageNumber, MessageStatus>,
    pub stream_written: u64,
    pub stream_finished: bool,
    pub received: HashMap<MessageNumber, usize>,
    pub received_stream: u64,
    pub stream_hash: Sha256,
    pub stream_digest: Option<[u8; 32]>,
    pub errors: Vec<String>,
    pub closing: bool,
    pub lost: Option<String>,
    /// Messages delivered before every message with a lower number had been delivered.
    pub out_of_order: u64,
}

impl PlanApp {
    pub fn new(plan: SendPlan, peer_plan: SendPlan, start: Instant) -> Self {
        Self {
            start,
            plan,
            peer_plan,
            send_stream: None,
            recv_stream: None,
            buf: vec![0; 64 * 1024],
            next_message: 0,
            statuses: BTreeMap::new(),
            stream_written: 0,
            stream_finished: false,
            received: HashMap::new(),
            received_stream: 0,
            stream_hash: Sha256::new(),
            stream_digest: None,
            errors: Vec::new(),
            closing: false,
            lost: None,
            out_of_order: 0,
        }
    }

    /// Our sends are all queued and settled, and we have everything the peer sends reliably.
    pub fn complete(&self) -> bool {
        self.next_message == self.plan.messages.len()
            && self.statuses.len() == self.plan.messages.len()
            && self.stream_finished
            && self.stream_digest.is_some()
            && self
                .peer_plan
                .messages
                .iter()
                .enumerate()
                .all(|(i, m)| m.props.lifetime.is_some() || self.received.contains_key(&(i as u64)))
    }
}

/// A simulator host with one squarepeg connection and application `A` on it.
pub struct PegHost<A: App = PlanApp> {
    pub ep: Endpoint,
    addr: IpAddr,
    role: Role,
    substrate: Substrate,
    glue: Option<Glue>,
    pub app: A,
    /// The TCP connection's counters, as last seen while it existed.
    pub tcp_stats: Option<squarepeg_tcp::ConnectionStats>,
}

impl PegHost<PlanApp> {
    /// A client (connecting at once) or a server (listening), over uTCP or standard TCP,
    /// sending `plan` and expecting `peer_plan`.
    pub fn new(
        role: Role,
        utcp: bool,
        tcp_config: ConnectionConfig,
        plan: SendPlan,
        peer_plan: SendPlan,
        start: Instant,
    ) -> PegHost {
        PegHost::with_app(
            role,
            utcp,
            tcp_config,
            PlanApp::new(plan, peer_plan, start),
            start,
        )
    }

    /// Our sends are all queued and settled, and we have everything the peer sends reliably.
    pub fn complete(&self) -> bool {
        self.app.complete()
    }
}

impl<A: App> PegHost<A> {
    /// A client (connecting at once) or a server (listening), over uTCP or standard TCP,
    /// with `app` on its connection.
    pub fn with_app(
        role: Role,
        utcp: bool,
        tcp_config: ConnectionConfig,
        app: A,
        start: Instant,
    ) -> Self {
        let (local, remote): (SocketAddr, SocketAddr) = match role {
            Role::Client => (CLIENT.parse().unwrap(), SERVER.parse().unwrap()),
            Role::Server => (SERVER.parse().unwrap(), CLIENT.parse().unwrap()),
        };
        let substrate = if utcp {
            Substrate::utcp(tcp_config.recv_buffer)
        } else {
            Substrate::byte_stream()
        };
        let tcp_config = core_tcp_config(tcp_config, substrate, true);
        let mut endpoint_config = EndpointConfig::default();
        endpoint_config.secret = [role as u8 + 1; 32];
        endpoint_config.local_addresses = vec![local.ip()];
        let ep = Endpoint::new(endpoint_config, start);
        let mut host = PegHost {
            ep,
            addr: local.ip(),
            role,
            substrate,
            glue: None,
            app,
            tcp_stats: None,
        };
        match role {
            Role::Client => {
                let h = host
                    .ep
                    .connect(start, local, remote, tcp_config)
                    .expect("connect");
                host.attach(h);
            }
            Role::Server => {
                host.ep.listen(local, 8, tcp_config).expect("listen");
            }
        }
        host
    }

    fn attach(&mut self, h: ConnectionHandle) {
        let conn = Connection::new(self.role, Config::default(), self.substrate).expect("core");
        self.glue = Some(Glue {
            conn,
            link: EndpointLink::new(h),
        });
    }

    /// The connection core, once the TCP connection exists.
    pub fn conn(&self) -> Option<&Connection> {
        Some(&self.glue.as_ref()?.conn)
    }

    pub fn utcp_stats(&self) -> Option<UtcpStats> {
        self.glue.as_ref()?.conn.stats().utcp
    }

    pub fn drained(&self) -> bool {
        self.glue.as_ref().is_some_and(|g| g.conn.is_drained())
    }

    fn step(&mut self, now: Instant) {
        if self.glue.is_none() {
            while let Some(ev) = self.ep.poll_event() {
                if let squarepeg_tcp::Event::Incoming(l) = ev
                    && let Some(h) = self.ep.accept(l)
                {
                    self.attach(h);
                }
            }
            if self.glue.is_none() {
                return;
            }
        }
        while self.ep.poll_event().is_some() {}
        let handle = self.glue.as_ref().map(|g| g.link.handle());
        if let Some(stats) = handle.and_then(|h| self.ep.stats_of(h).ok()) {
            self.tcp_stats = Some(stats);
        }
        let Some(g) = self.glue.as_mut() else { return };
        for _ in 0..4 {
            self.app.round(now, &mut g.conn);
            g.link.drive(now, &mut g.conn, &mut self.ep);
        }
        self.app.round(now, &mut g.conn);
    }
}

impl App for PlanApp {
    fn poll_timeout(&self) -> Option<Instant> {
        self.plan
            .messages
            .get(self.next_message)
            .map(|m| self.start + m.at)
    }

    fn round(&mut self, now: Instant, conn: &mut Connection) {
        let elapsed = now - self.start;
        // Messages due.
        while self.next_message < self.plan.messages.len()
            && self.plan.messages[self.next_message].at <= elapsed
        {
            let i = self.next_message;
            let payload = self.plan.payload(i);
            let props = self.plan.messages[i].props.clone();
            match conn.session_mut().send_message(now, payload, props) {
                Ok(n) => {
                    if n != i as u64 {
                        self.errors.push(format!("message {i} got number {n}"));
                    }
                    self.next_message += 1;
                }
                Err(squarepeg::SendError::QueueFull { .. }) => break,
                Err(e) => {
                    self.errors.push(format!("send {i}: {e}"));
                    self.next_message += 1;
                }
            }
        }
        // The stream.
        if !self.stream_finished {
            let (seed, total, written) =
                (self.plan.seed, self.plan.stream_bytes, self.stream_written);
            let s = conn.session_mut();
            let id = match self.send_stream {
                Some(id) => Some(id),
                None => s.open_stream().ok(),
            };
            if let Some(id) = id {
                let mut written = written;
                while written < total {
                    let n = (total - written).min(16 * 1024) as usize;
                    match s.stream_write(id, &pattern(seed, written, n)) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => written += k as u64,
                    }
                }
                let finished = written == total && s.stream_finish(id).is_ok();
                self.send_stream = Some(id);
                self.stream_written = written;
                self.stream_finished = finished;
            }
        }
        // Receiving.
        while let Some(ev) = conn.poll_event() {
            match ev {
                Event::MessageStatus { numbers, status } => {
                    for number in numbers {
                        if self.statuses.insert(number, status).is_some() {
                            self.errors.push(format!("message {number}: two statuses"));
                        }
                    }
                }
                Event::ConnectionLost(e) => self.lost = Some(e.to_string()),
                _ => {}
            }
        }
        while let Some(m) = conn.session_mut().poll_message() {
            let n = m.number as usize;
            let lower_missing = (0..m.number).any(|k| !self.received.contains_key(&k));
            self.out_of_order += u64::from(lower_missing);
            let count = self.received.entry(m.number).or_insert(0);
            *count += 1;
            if *count > 1 {
                self.errors.push(format!("message {n} delivered twice"));
            }
            if n >= self.peer_plan.messages.len() || m.payload[..] != self.peer_plan.payload(n)[..]
            {
                self.errors
                    .push(format!("message {n}: payload differs from the one sent"));
            } else if m.substream != self.peer_plan.messages[n].props.substream {
                self.errors.push(format!("message {n}: wrong substream"));
            }
        }
        loop {
            let s = conn.session_mut();
            let Some(id) = stream_to_read(s, &mut self.recv_stream) else {
                break;
            };
            match s.stream_read(id, &mut self.buf) {
                Ok(ReadOutcome::Data(n)) => {
                    let expect = pattern(self.peer_plan.seed, self.received_stream, n);
                    if self.buf[..n] != expect[..] {
                        self.errors
                            .push(format!("stream bytes differ at {}", self.received_stream));
                    }
                    self.stream_hash.update(&self.buf[..n]);
                    self.received_stream += n as u64;
                }
                Ok(ReadOutcome::Finished) => {
                    if self.stream_digest.is_none() {
                        self.stream_digest =
                            Some(std::mem::take(&mut self.stream_hash).finalize().into());
                    }
                    break;
                }
                Ok(ReadOutcome::Blocked) => break,
                Err(e) => {
                    self.errors.push(format!("stream read: {e}"));
                    break;
                }
            }
        }
        if self.complete() && !self.closing {
            self.closing = true;
            conn.session_mut().close(0, b"done");
        }
    }
}

impl<A: App> Host for PegHost<A> {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.addr]
    }

    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>) {
        let _ = self.ep.handle_packet(now, &packet);
        self.step(now);
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        self.ep.poll_transmit_vec(now)
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        let session = self.glue.as_ref().and_then(|g| g.conn.poll_timeout());
        let app = self.glue.as_ref().and_then(|_| self.app.poll_timeout());
        [self.ep.poll_timeout(), session, app]
            .into_iter()
            .flatten()
            .min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            self.ep.handle_timeout(now);
        }
        if let Some(g) = self.glue.as_mut() {
            g.conn.handle_timeout(now);
        }
        self.step(now);
    }
}

/// Checks one side's findings against what the peer sent and reported.
pub fn check(side: &str, me: &PegHost, peer: &PegHost) -> Result<(), String> {
    let mut problems: Vec<String> = me
        .app
        .errors
        .iter()
        .map(|e| format!("{side}: {e}"))
        .collect();
    if me.app.stream_digest != Some(me.app.peer_plan.stream_digest()) {
        problems.push(format!(
            "{side}: stream digest differs ({} of {} bytes)",
            me.app.received_stream, me.app.peer_plan.stream_bytes
        ));
    }
    for (i, m) in me.app.peer_plan.messages.iter().enumerate() {
        let got = me.app.received.contains_key(&(i as u64));
        let status = peer.app.statuses.get(&(i as u64));
        if m.props.lifetime.is_none() && !got {
            problems.push(format!(
                "{side}: reliable message {i} not delivered ({status:?})"
            ));
        }
        if got && matches!(status, Some(MessageStatus::Squashed)) {
            problems.push(format!("{side}: squashed message {i} delivered"));
        }
    }
    let unique: HashSet<_> = me.app.received.keys().collect();
    if unique.len() != me.app.received.len() {
        problems.push(format!("{side}: duplicate numbers"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}
