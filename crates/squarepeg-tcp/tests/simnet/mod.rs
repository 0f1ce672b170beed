//! Two squarepeg endpoints in the lab's deterministic simulator (virtual time).
//!
//! [`TcpHost`] wraps an [`Endpoint`] and a small application per connection (write a seeded
//! byte stream, read and verify the peer's, shut down, record how the connection ended) and
//! implements [`squarepeg_lab::sim::Host`]. [`World`] puts a client host on the left and a
//! server host on the right of the simulator's bottleneck and runs them until every
//! application has finished, failing on stalls.
//!
//! Shared by the seeded scenario suite (`tests/sim.rs`), the RFC behaviour tests
//! (`tests/sim_rfc.rs`) and the trace example (`examples/trace.rs`, which includes this file).
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use squarepeg_lab::Direction;
use squarepeg_lab::middlebox::{Emit, Middlebox};
use squarepeg_lab::model::Bottleneck;
use squarepeg_lab::sim::{Host, HostId, SimConfig, Simulator, TraceKind};
use squarepeg_lab::{Side, sim::Tap};
use squarepeg_tcp::wire::{Segment, parse_packet};
use squarepeg_tcp::{
    CloseReason, ConnectionConfig, ConnectionHandle, ConnectionStats, Endpoint, EndpointConfig,
    Error, Event, ListenerHandle, State,
};

// ------------------------------------------------------------------ test data

fn mix(mut z: u64) -> u64 {
    // SplitMix64 finaliser.
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `out` with bytes `offset..` of the deterministic stream `seed`, so that a receiver
/// can check every byte at its offset without keeping a copy of what was sent.
pub fn fill_pattern(seed: u64, offset: u64, out: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < out.len() {
        let word = mix(seed ^ (pos >> 3).wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes();
        let from = (pos & 7) as usize;
        let n = (8 - from).min(out.len() - i);
        out[i..i + n].copy_from_slice(&word[from..from + n]);
        i += n;
        pos += n as u64;
    }
}

/// A small deterministic random source for building scenarios (SplitMix64).
#[derive(Clone, Debug)]
pub struct Dice(u64);

impl Dice {
    pub fn new(seed: u64) -> Dice {
        Dice(mix(seed ^ 0x5EED_5EED_5EED_5EED))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-uniform in `[lo, hi]`.
    pub fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp()
    }
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

// ------------------------------------------------------------------ applications

/// How an application reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reader {
    /// Reads everything as soon as it is readable.
    Fast,
    /// Reads at most `chunk` bytes every `interval` (a slow consumer: the window closes).
    Slow { chunk: usize, interval: Duration },
    /// Reads nothing until `after` (since the start), then reads fast.
    Paused { after: Duration },
}

/// What the application on one side of one connection does.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Bytes this side sends (stream `send_seed`), then shuts down its direction.
    pub send: u64,
    pub send_seed: u64,
    /// Bytes this side expects from the peer (stream `recv_seed`).
    pub recv: u64,
    pub recv_seed: u64,
    /// Largest single `write` call.
    pub write_size: usize,
    pub reader: Reader,
    /// Request/response: start sending only after the peer's FIN (the whole request) arrived.
    pub respond_after_eof: bool,
    /// Abort (RST) once this many bytes have been read.
    pub abort_after: Option<u64>,
    /// The peer aborts: this side must end with `CloseReason::Reset`.
    pub expect_reset: bool,
}

impl Plan {
    pub fn new(send: u64, send_seed: u64, recv: u64, recv_seed: u64) -> Plan {
        Plan {
            send,
            send_seed,
            recv,
            recv_seed,
            write_size: 64 * 1024,
            reader: Reader::Fast,
            respond_after_eof: false,
            abort_after: None,
            expect_reset: false,
        }
    }
}

/// One side of one connection and what happened to it.
#[derive(Debug)]
pub struct AppConn {
    pub plan: Plan,
    /// Client: local address, peer, config and when to connect.
    pub local: SocketAddr,
    pub remote: SocketAddr,
    connect: Option<(Duration, ConnectionConfig)>,
    pub handle: Option<ConnectionHandle>,
    pub sent: u64,
    pub shut: bool,
    pub received: u64,
    recv_hash: Sha256,
    pub recv_digest: Option<[u8; 32]>,
    /// SHA-256 of everything written (final once all is written).
    send_hash: Sha256,
    /// Successful `write` calls.
    pub writes: u64,
    /// A write was short or refused; waiting for `Writable`.
    write_blocked: bool,
    /// First offset whose byte differed from the expected stream.
    pub first_mismatch: Option<u64>,
    pub eof: bool,
    pub aborted: bool,
    pub connected_at: Option<Instant>,
    pub eof_at: Option<Instant>,
    /// How the connection ended and the state it was in when it did (TIME-WAIT or CLOSED).
    pub closed: Option<(CloseReason, State, Instant)>,
    pub errors: Vec<String>,
    next_read: Option<Instant>,
    /// Stats taken when the connection closed or was aborted (and at the end of the run).
    pub stats: Option<ConnectionStats>,
    /// Unordered receive: stream ranges delivered so far (merged, start to end).
    pub covered: std::collections::BTreeMap<u64, u64>,
    /// Unordered receive: segments read, and bytes read that had been read before.
    pub segments_read: u64,
    pub duplicate_bytes_read: u64,
}

impl AppConn {
    fn new(plan: Plan, local: SocketAddr, remote: SocketAddr) -> AppConn {
        AppConn {
            plan,
            local,
            remote,
            connect: None,
            handle: None,
            sent: 0,
            shut: false,
            received: 0,
            recv_hash: Sha256::new(),
            recv_digest: None,
            send_hash: Sha256::new(),
            writes: 0,
            write_blocked: false,
            first_mismatch: None,
            eof: false,
            aborted: false,
            connected_at: None,
            eof_at: None,
            closed: None,
            errors: Vec::new(),
            next_read: None,
            stats: None,
            covered: std::collections::BTreeMap::new(),
            segments_read: 0,
            duplicate_bytes_read: 0,
        }
    }

    /// Whether this side has done everything its plan asks.
    pub fn finished(&self) -> bool {
        if self.aborted {
            return true;
        }
        if self.plan.expect_reset {
            return self.closed.is_some();
        }
        self.sent == self.plan.send && self.shut && self.eof && self.closed.is_some()
    }

    fn may_read(&self, now: Instant, start: Instant) -> bool {
        match self.plan.reader {
            Reader::Fast => true,
            Reader::Slow { .. } => self.next_read.is_none_or(|t| t <= now),
            Reader::Paused { after } => now >= start + after,
        }
    }
}

/// Adds `[start, end)` to a set of merged ranges; returns how many of its bytes were in it
/// already.
pub fn cover(set: &mut std::collections::BTreeMap<u64, u64>, start: u64, end: u64) -> u64 {
    let mut overlap = 0;
    let (mut s, mut e) = (start, end);
    let touching: Vec<(u64, u64)> = set
        .range(..=end)
        .rev()
        .take_while(|&(_, &re)| re >= start)
        .map(|(&rs, &re)| (rs, re))
        .collect();
    for (rs, re) in touching {
        overlap += re.min(end).saturating_sub(rs.max(start));
        set.remove(&rs);
        s = s.min(rs);
        e = e.max(re);
    }
    set.insert(s, e);
    overlap
}

/// Counters of one host.
#[derive(Clone, Debug, Default)]
pub struct HostCounters {
    /// `handle_timeout` calls with an endpoint timer due.
    pub timer_wakeups: u64,
    /// Wake-ups for the application alone (connect times, slow reads).
    pub app_wakeups: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    /// Packets the endpoint dropped (any reason).
    pub packets_dropped: u64,
}

/// An endpoint plus its applications, as a simulator host.
pub struct TcpHost {
    pub name: &'static str,
    pub ep: Endpoint,
    addr: IpAddr,
    start: Instant,
    pub conns: Vec<AppConn>,
    by_handle: HashMap<ConnectionHandle, usize>,
    listener: Option<ListenerHandle>,
    pub counters: HostCounters,
    /// Last time any application made progress (bytes read, connected, EOF, closed).
    pub last_progress: Instant,
    /// The latest time the host was called at.
    now_hint: Instant,
    /// Trace records collected from the connections (when their config asks for a trace),
    /// oldest first, up to `trace_limit`.
    pub traces: Vec<(usize, squarepeg_tcp::TraceRecord)>,
    pub trace_limit: usize,
    buf: Vec<u8>,
    scratch: Vec<u8>,
}

/// Whether `SQUAREPEG_SIM_MEMORY` puts the hosts under a memory budget.
fn memory_budget_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SQUAREPEG_SIM_MEMORY").is_some())
}

impl TcpHost {
    pub fn new(name: &'static str, addr: IpAddr, secret: u8, start: Instant) -> TcpHost {
        let mut config = EndpointConfig::default();
        config.secret = [secret; 32];
        config.local_addresses = vec![addr];
        // SQUAREPEG_SIM_MEMORY=<bytes>: run every host under that memory budget (crate::mem),
        // floor 4 KiB, to exercise the budget's policy on every scenario.
        if let Some(limit) = std::env::var("SQUAREPEG_SIM_MEMORY")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            config.memory = squarepeg_tcp::MemoryBudget::new(limit).with_floor(4096);
        }
        TcpHost {
            name,
            ep: Endpoint::new(config, start),
            addr,
            start,
            conns: Vec::new(),
            by_handle: HashMap::new(),
            listener: None,
            counters: HostCounters::default(),
            last_progress: start,
            now_hint: start,
            traces: Vec::new(),
            trace_limit: 0,
            buf: vec![0u8; 65535],
            scratch: Vec::new(),
        }
    }

    /// Client side: connect from `local_port` to `remote` after `after`, then run `plan`.
    pub fn add_client(
        &mut self,
        local_port: u16,
        remote: SocketAddr,
        config: ConnectionConfig,
        after: Duration,
        plan: Plan,
    ) {
        let mut c = AppConn::new(plan, SocketAddr::new(self.addr, local_port), remote);
        c.connect = Some((after, config));
        self.conns.push(c);
    }

    /// Server side: listen on `port` with `config`.
    pub fn listen(&mut self, port: u16, config: ConnectionConfig) {
        let l = self
            .ep
            .listen(SocketAddr::new(self.addr, port), 64, config)
            .expect("listen");
        self.listener = Some(l);
    }

    /// Server side: the connection from `remote` runs `plan`.
    pub fn expect_client(&mut self, local_port: u16, remote: SocketAddr, plan: Plan) {
        self.conns.push(AppConn::new(
            plan,
            SocketAddr::new(self.addr, local_port),
            remote,
        ));
    }

    pub fn unfinished(&self) -> usize {
        self.conns.iter().filter(|c| !c.finished()).count()
    }

    /// Refreshes the stats of every connection still held.
    pub fn snapshot_stats(&mut self) {
        for c in &mut self.conns {
            if let Some(h) = c.handle
                && let Ok(s) = self.ep.stats_of(h)
            {
                c.stats = Some(s);
            }
        }
    }

    fn next_app_timer(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut consider = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        for c in &self.conns {
            if c.handle.is_none()
                && !c.aborted
                && let Some((after, _)) = &c.connect
            {
                consider(self.start + *after);
            }
            if c.handle.is_some() && !c.eof && !c.aborted {
                match c.plan.reader {
                    Reader::Slow { .. } => {
                        if let Some(n) = c.next_read {
                            consider(n);
                        }
                    }
                    Reader::Paused { after } => {
                        // One wake-up at the resume time; afterwards reads follow events.
                        let at = self.start + after;
                        if at > self.now_hint {
                            consider(at);
                        }
                    }
                    Reader::Fast => {}
                }
            }
        }
        t
    }

    /// Moves trace records from the endpoint into [`traces`](TcpHost::traces).
    pub fn collect_traces(&mut self) {
        if self.traces.len() >= self.trace_limit {
            return;
        }
        for (i, c) in self.conns.iter().enumerate() {
            if let Some(h) = c.handle
                && let Ok(records) = self.ep.take_trace(h)
            {
                let room = self.trace_limit - self.traces.len();
                self.traces
                    .extend(records.into_iter().take(room).map(|r| (i, r)));
            }
        }
    }

    /// Runs the applications until nothing changes.
    fn drive(&mut self, now: Instant) {
        self.now_hint = now;
        if self.trace_limit > 0 {
            self.collect_traces();
        }
        for _ in 0..1000 {
            let mut changed = false;
            while let Some(ev) = self.ep.poll_event() {
                changed = true;
                self.on_event(now, ev);
            }
            for i in 0..self.conns.len() {
                changed |= self.pump(now, i);
            }
            if !changed {
                return;
            }
        }
        panic!("{}: application loop does not settle", self.name);
    }

    fn on_event(&mut self, now: Instant, ev: Event) {
        match ev {
            Event::Connected(h) => {
                if let Some(&i) = self.by_handle.get(&h) {
                    self.conns[i].connected_at = Some(now);
                    self.last_progress = now;
                }
            }
            Event::Incoming(l) => {
                while let Some(h) = self.ep.accept(l) {
                    let Some(remote) = self.ep.connection(h).map(|c| c.remote_addr()) else {
                        continue;
                    };
                    match self
                        .conns
                        .iter()
                        .position(|c| c.remote == remote && c.handle.is_none())
                    {
                        Some(i) => {
                            self.conns[i].handle = Some(h);
                            self.conns[i].connected_at = Some(now);
                            self.by_handle.insert(h, i);
                            self.last_progress = now;
                        }
                        None => panic!("{}: unexpected connection from {remote}", self.name),
                    }
                }
            }
            Event::Closed(h, reason) => {
                if let Some(&i) = self.by_handle.get(&h) {
                    let state = self
                        .ep
                        .connection(h)
                        .map_or(State::Closed(reason), |c| c.state());
                    let c = &mut self.conns[i];
                    if c.closed.is_none() {
                        c.closed = Some((reason, state, now));
                    }
                    c.stats = self.ep.stats_of(h).ok();
                    self.last_progress = now;
                }
            }
            Event::Writable(h) => {
                if let Some(&i) = self.by_handle.get(&h) {
                    self.conns[i].write_blocked = false;
                }
            }
            Event::Readable(_) | Event::PeerFin(_) => {}
        }
    }

    /// One application step for connection `i`; returns whether anything happened.
    fn pump(&mut self, now: Instant, i: usize) -> bool {
        let start = self.start;
        let mut changed = false;
        // Connect when due.
        if self.conns[i].handle.is_none() && !self.conns[i].aborted {
            let Some((after, cfg)) = self.conns[i].connect.clone() else {
                return false;
            };
            if now < start + after {
                return false;
            }
            let (local, remote) = (self.conns[i].local, self.conns[i].remote);
            match self.ep.connect(now, local, remote, cfg) {
                Ok(h) => {
                    self.conns[i].handle = Some(h);
                    self.by_handle.insert(h, i);
                }
                Err(e) => {
                    self.conns[i].errors.push(format!("connect: {e}"));
                    self.conns[i].aborted = true;
                }
            }
            return true;
        }
        let Some(h) = self.conns[i].handle else {
            return false;
        };
        if self.conns[i].aborted {
            return false;
        }
        let c = &mut self.conns[i];
        // Write.
        let may_write = !c.plan.respond_after_eof || c.eof;
        if may_write && c.closed.is_none() {
            // An event-driven writer: after a short or refused write it waits for `Writable`.
            while c.sent < c.plan.send && !c.write_blocked {
                let want = (c.plan.send - c.sent).min(c.plan.write_size as u64) as usize;
                // Generate only what the send buffer can take, plus one byte so that a write
                // that does not fit is short (which arms the `Writable` event).
                let room = self.ep.connection(h).map_or(0, |conn| conn.writable());
                let n = want.min(room + 1);
                self.scratch.resize(n, 0);
                fill_pattern(c.plan.send_seed, c.sent, &mut self.scratch);
                match self.ep.write(h, &self.scratch) {
                    Ok(k) => {
                        c.send_hash.update(&self.scratch[..k]);
                        c.sent += k as u64;
                        c.writes += u64::from(k > 0);
                        changed |= k > 0;
                        if k < n {
                            c.write_blocked = true;
                        }
                    }
                    Err(Error::WouldBlock) => c.write_blocked = true,
                    Err(e) => {
                        c.errors.push(format!("write at {}: {e}", c.sent));
                        break;
                    }
                }
            }
            if c.sent == c.plan.send && !c.shut && c.plan.abort_after.is_none() {
                match self.ep.shutdown(now, h) {
                    Ok(()) => {
                        c.shut = true;
                        changed = true;
                    }
                    Err(e) => c.errors.push(format!("shutdown: {e}")),
                }
            }
        }
        // Read.
        if !c.eof && c.may_read(now, start) {
            let budget = match c.plan.reader {
                Reader::Slow { chunk, interval } => {
                    c.next_read = Some(now + interval);
                    chunk
                }
                _ => usize::MAX,
            };
            let unordered = self
                .ep
                .connection(h)
                .is_some_and(|conn| conn.unordered_receive());
            let mut got = 0usize;
            while unordered && got < budget {
                let want = (budget - got).min(self.buf.len());
                match self.ep.read_segment(h, &mut self.buf[..want]) {
                    Ok(seg) if seg.len == 0 => {
                        c.eof = true;
                        c.eof_at = Some(now);
                        c.recv_digest = Some(std::mem::take(&mut c.recv_hash).finalize().into());
                        changed = true;
                        self.last_progress = now;
                        break;
                    }
                    Ok(seg) => {
                        let data = &self.buf[..seg.len];
                        self.scratch.resize(seg.len, 0);
                        fill_pattern(c.plan.recv_seed, seg.offset, &mut self.scratch);
                        if c.first_mismatch.is_none()
                            && let Some(k) = (0..seg.len).find(|&k| data[k] != self.scratch[k])
                        {
                            c.first_mismatch = Some(seg.offset + k as u64);
                        }
                        c.segments_read += 1;
                        c.duplicate_bytes_read +=
                            cover(&mut c.covered, seg.offset, seg.offset + seg.len as u64);
                        // Every byte matched the pattern at its offset, so the stream up to the
                        // first gap is the pattern: hash it in order as it becomes contiguous.
                        let contiguous = c.covered.get(&0).copied().unwrap_or(0);
                        if contiguous > c.received {
                            self.scratch.resize((contiguous - c.received) as usize, 0);
                            fill_pattern(c.plan.recv_seed, c.received, &mut self.scratch);
                            c.recv_hash.update(&self.scratch);
                            c.received = contiguous;
                        }
                        got += seg.len;
                        changed = true;
                        self.last_progress = now;
                    }
                    Err(Error::WouldBlock) => break,
                    Err(e) => {
                        if c.closed.is_none() || !c.plan.expect_reset {
                            c.errors.push(format!("read at {}: {e}", c.received));
                        }
                        c.eof = true;
                        c.eof_at = Some(now);
                        break;
                    }
                }
            }
            while !unordered && got < budget {
                let want = (budget - got).min(self.buf.len());
                match self.ep.read(h, &mut self.buf[..want]) {
                    Ok(0) => {
                        c.eof = true;
                        c.eof_at = Some(now);
                        c.recv_digest = Some(std::mem::take(&mut c.recv_hash).finalize().into());
                        changed = true;
                        self.last_progress = now;
                        break;
                    }
                    Ok(n) => {
                        let data = &self.buf[..n];
                        if c.first_mismatch.is_none() {
                            self.scratch.resize(n, 0);
                            fill_pattern(c.plan.recv_seed, c.received, &mut self.scratch);
                            if let Some(k) = (0..n).find(|&k| data[k] != self.scratch[k]) {
                                c.first_mismatch = Some(c.received + k as u64);
                            }
                        }
                        c.recv_hash.update(data);
                        c.received += n as u64;
                        got += n;
                        changed = true;
                        self.last_progress = now;
                    }
                    Err(Error::WouldBlock) => break,
                    Err(e) => {
                        if c.closed.is_none() || !c.plan.expect_reset {
                            c.errors.push(format!("read at {}: {e}", c.received));
                        }
                        c.eof = true;
                        c.eof_at = Some(now);
                        break;
                    }
                }
            }
        }
        // Abort when the plan says so.
        if let Some(limit) = c.plan.abort_after
            && c.received >= limit
        {
            c.stats = self.ep.stats_of(h).ok();
            match self.ep.abort(now, h) {
                Ok(()) => {
                    c.aborted = true;
                    c.handle = None;
                    self.by_handle.remove(&h);
                    self.last_progress = now;
                    changed = true;
                }
                Err(e) => c.errors.push(format!("abort: {e}")),
            }
        }
        changed
    }
}

impl Host for TcpHost {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.addr]
    }

    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>) {
        self.counters.packets_received += 1;
        if self.ep.handle_packet(now, &packet).is_err() {
            self.counters.packets_dropped += 1;
        }
        self.drive(now);
        if memory_budget_on() {
            // The budget's bound after every packet (Endpoint::check_invariants).
            self.ep.check_invariants();
        }
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        let n = match self.ep.poll_transmit(now, &mut self.buf) {
            Some(n) => n,
            None => {
                // Sending may have produced events (e.g. a connection closing).
                self.drive(now);
                self.ep.poll_transmit(now, &mut self.buf)?
            }
        };
        self.counters.packets_sent += 1;
        Some(self.buf[..n].to_vec())
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        match (self.ep.poll_timeout(), self.next_app_timer()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            self.counters.timer_wakeups += 1;
            self.ep.handle_timeout(now);
        } else {
            self.counters.app_wakeups += 1;
        }
        self.drive(now);
    }
}

// ------------------------------------------------------------------ the world

/// A RST some host sent.
#[derive(Clone, Copy, Debug)]
pub struct RstSeen {
    pub at: Instant,
    pub host: HostId,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// Bounds of a run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Virtual time by which every application must have finished, not counting the time the
    /// connections spent waiting for retransmission timeouts (that time is the path's doing,
    /// and RFC 6298 back-off is checked on its own).
    pub deadline: Duration,
    /// Longest virtual time without application progress.
    pub watchdog: Duration,
}

/// A client host (left) and a server host (right) around the simulator's bottleneck.
pub struct World {
    pub sim: Simulator,
    pub start: Instant,
    pub client: HostId,
    pub server: HostId,
    pub rsts: Rc<RefCell<Vec<RstSeen>>>,
}

/// Parses a TCP packet as the endpoints see it (checksums not verified: the lab keeps them).
pub fn tcp_segment(packet: &[u8]) -> Option<Segment<'_>> {
    parse_packet(packet, false).ok()
}

impl World {
    pub fn new(
        seed: u64,
        bottleneck: Bottleneck,
        start: Instant,
        client: TcpHost,
        server: TcpHost,
    ) -> World {
        let config = SimConfig {
            // A flight of a few thousand segments leaves at one instant; a host whose timer is
            // always due would pass this many events at one instant within milliseconds.
            max_events_per_instant: 200_000,
            ..SimConfig::new(seed, bottleneck)
        };
        let mut sim = Simulator::with_start(config, start).expect("valid bottleneck");
        let client = sim.add_host(Side::Left, client).expect("client host");
        let server = sim.add_host(Side::Right, server).expect("server host");
        let rsts = Rc::new(RefCell::new(Vec::new()));
        let seen = rsts.clone();
        sim.on_trace(move |ev| {
            if let TraceKind::Sent { host } = ev.kind
                && let Some(seg) = tcp_segment(ev.packet)
                && seg.flags.rst()
            {
                seen.borrow_mut().push(RstSeen {
                    at: ev.time,
                    host,
                    src: seg.src,
                    dst: seg.dst,
                });
            }
        });
        World {
            sim,
            start,
            client,
            server,
            rsts,
        }
    }

    pub fn client(&self) -> &TcpHost {
        self.sim.host::<TcpHost>(self.client).expect("client")
    }
    pub fn server(&self) -> &TcpHost {
        self.sim.host::<TcpHost>(self.server).expect("server")
    }
    pub fn client_mut(&mut self) -> &mut TcpHost {
        self.sim.host_mut::<TcpHost>(self.client).expect("client")
    }
    pub fn server_mut(&mut self) -> &mut TcpHost {
        self.sim.host_mut::<TcpHost>(self.server).expect("server")
    }

    pub fn elapsed(&self) -> Duration {
        self.sim.now() - self.start
    }

    pub fn finished(&self) -> bool {
        self.client().unfinished() == 0 && self.server().unfinished() == 0
    }

    /// Runs until every application has finished.
    pub fn run(&mut self, limits: &Limits) -> Result<(), String> {
        loop {
            if self.finished() {
                return Ok(());
            }
            let Some(t) = self.sim.step().map_err(|e| format!("simulator: {e}"))? else {
                return Err(format!(
                    "stall: nothing left to happen at {:?} but the applications are not done",
                    self.elapsed()
                ));
            };
            let elapsed = t - self.start;
            if elapsed > limits.deadline {
                let waits = self.rto_wait();
                if elapsed > limits.deadline + waits {
                    return Err(format!(
                        "stall: not done within the virtual-time bound of {:?} plus {:?} spent \
                         waiting for retransmission timeouts",
                        limits.deadline, waits
                    ));
                }
            }
            let progress = self.client().last_progress.max(self.server().last_progress);
            // Waiting for a backed-off retransmission timeout is trying, not stalling.
            if t - progress > limits.watchdog && t - progress > limits.watchdog + self.rto_wait() {
                return Err(format!(
                    "stall: no application progress from {:?} to {:?}",
                    progress - self.start,
                    elapsed
                ));
            }
        }
    }

    /// Time every connection (both hosts) spent waiting for retransmission timeouts, plus the
    /// timeout each one with data in flight is waiting for now.
    pub fn rto_wait(&self) -> Duration {
        let mut total = Duration::ZERO;
        for host in [self.client(), self.server()] {
            for c in &host.conns {
                let live = c.handle.and_then(|h| host.ep.stats_of(h).ok());
                if let Some(s) = live.as_ref().or(c.stats.as_ref()) {
                    total += s.rto_wait;
                    if live.is_some() && s.bytes_in_flight > 0 {
                        total += s.rto;
                    }
                }
            }
        }
        total
    }

    /// Runs until nothing is left to happen (TIME-WAIT over, no timers armed).
    pub fn run_until_idle(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = self.sim.now() + limit;
        while let Some(t) = self.sim.step().map_err(|e| format!("simulator: {e}"))? {
            if t > deadline {
                return Err(format!(
                    "timers still armed {limit:?} after the applications finished"
                ));
            }
        }
        Ok(())
    }

    /// Writes pcap captures of what each host sends and receives.
    pub fn capture(&mut self, client_pcap: &std::path::Path, server_pcap: &std::path::Path) {
        for (tap, path) in [
            (Tap::Host(self.client), client_pcap),
            (Tap::Host(self.server), server_pcap),
        ] {
            let file = std::fs::File::create(path).expect("create pcap");
            self.sim
                .capture_pcap(tap, std::io::BufWriter::new(file))
                .expect("pcap header");
        }
    }

    /// A description of every connection, for failure messages.
    pub fn describe(&self) -> String {
        let stats = self.sim.stats();
        let mut out = format!(
            "  links: left-to-right {:?}\n  right-to-left {:?}\n  middleboxes left {:?} right {:?}\n",
            stats.left_to_right,
            stats.right_to_left,
            self.sim.chain(Side::Left).counters(),
            self.sim.chain(Side::Right).counters(),
        );
        for host in [self.client(), self.server()] {
            for c in &host.conns {
                let live = c.handle.and_then(|h| host.ep.stats_of(h).ok());
                let stats = live.as_ref().or(c.stats.as_ref());
                out += &format!(
                    "  {} {} -> {}: sent {}/{} shut {} received {}/{} eof {} aborted {} closed {:?} errors {:?}\n",
                    host.name,
                    c.local,
                    c.remote,
                    c.sent,
                    c.plan.send,
                    c.shut,
                    c.received,
                    c.plan.recv,
                    c.eof,
                    c.aborted,
                    c.closed.map(|(r, s, t)| (r, s, t - self.start)),
                    c.errors
                );
                if let Some(s) = stats {
                    out += &format!(
                        "    state {:?} cwnd {} ssthresh {} flight {} pipe {} srtt {:?} rto {:?} \
                         sent {} retx {} fast-retx {} rtos {} (waited {:?}) tlps {}/{} swnd {} rwnd {} sbuf {} rbuf {} zwp {}\n",
                        s.state,
                        s.cwnd,
                        s.ssthresh,
                        s.bytes_in_flight,
                        s.pipe,
                        s.srtt,
                        s.rto,
                        s.packets_sent,
                        s.packets_retransmitted,
                        s.fast_retransmits,
                        s.rto_timeouts,
                        s.rto_wait,
                        s.tail_loss_repairs,
                        s.tail_loss_probes,
                        s.send_window,
                        s.recv_window,
                        s.send_buffered,
                        s.recv_buffered,
                        s.zero_window_probes
                    );
                }
            }
            let drops: Vec<String> = squarepeg_tcp::DropReason::ALL
                .iter()
                .filter(|r| host.ep.stats().dropped(**r) > 0)
                .map(|r| format!("{r:?} {}", host.ep.stats().dropped(*r)))
                .collect();
            out += &format!(
                "  {} counters {:?}, endpoint timer {:?}, drops [{}]\n",
                host.name,
                host.counters,
                host.ep.poll_timeout().map(|t| t - self.start),
                drops.join(", ")
            );
        }
        out
    }

    /// Checks what every connection delivered and how it ended; see the module documentation.
    pub fn check_connections(&self) -> Result<(), String> {
        let hosts = [(self.client, self.client()), (self.server, self.server())];
        for &(_, host) in &hosts {
            let peer = if std::ptr::eq(host, self.client()) {
                self.server()
            } else {
                self.client()
            };
            for c in &host.conns {
                let who = format!("{} {} -> {}", host.name, c.local, c.remote);
                if !c.errors.is_empty() {
                    return Err(format!("{who}: application errors {:?}", c.errors));
                }
                let p = peer
                    .conns
                    .iter()
                    .find(|p| p.local == c.remote && p.remote == c.local)
                    .ok_or_else(|| format!("{who}: no peer connection"))?;
                if let Some(at) = c.first_mismatch {
                    return Err(format!("{who}: byte {at} differs from what the peer sent"));
                }
                if c.aborted {
                    continue;
                }
                if p.aborted {
                    match c.closed {
                        Some((CloseReason::Reset, _, _)) => continue,
                        other => {
                            return Err(format!(
                                "{who}: the peer aborted but this side ended {other:?}"
                            ));
                        }
                    }
                }
                if c.received != c.plan.recv || p.sent != c.plan.recv {
                    return Err(format!(
                        "{who}: received {} of {} bytes (peer wrote {})",
                        c.received, c.plan.recv, p.sent
                    ));
                }
                if c.recv_digest != Some(p.send_hash.clone().finalize().into()) {
                    return Err(format!("{who}: digest of the received stream differs"));
                }
                match c.closed {
                    Some((CloseReason::Normal, State::TimeWait | State::Closed(_), _)) => {}
                    other => return Err(format!("{who}: ended {other:?}, expected Normal")),
                }
                let both_closed = matches!(c.closed, Some((_, State::Closed(_), _)))
                    && matches!(p.closed, Some((_, State::Closed(_), _)));
                if both_closed {
                    return Err(format!(
                        "{who}: neither side went through TIME-WAIT (RFC 9293 §3.6)"
                    ));
                }
            }
        }
        // RSTs: only from an aborting application, or answering a segment that arrived after
        // the connection on the sending host was gone (RFC 9293 §3.10.7.1).
        for rst in self.rsts.borrow().iter() {
            let host = if rst.host == self.client {
                self.client()
            } else {
                self.server()
            };
            let conn = host
                .conns
                .iter()
                .find(|c| c.local == rst.src && c.remote == rst.dst);
            let explained =
                conn.is_some_and(|c| c.aborted || c.closed.is_some_and(|(_, _, t)| t <= rst.at));
            if !explained {
                return Err(format!(
                    "unexpected RST from {} to {} at {:?}",
                    rst.src,
                    rst.dst,
                    rst.at - self.start
                ));
            }
        }
        Ok(())
    }

    /// After [`run_until_idle`](World::run_until_idle): every connection still held is CLOSED.
    pub fn check_all_closed(&self) -> Result<(), String> {
        for host in [self.client(), self.server()] {
            for c in &host.conns {
                if let Some(h) = c.handle
                    && let Some(conn) = host.ep.connection(h)
                    && !conn.state().is_closed()
                {
                    return Err(format!(
                        "{} {} -> {}: still {:?} when the network went idle",
                        host.name,
                        c.local,
                        c.remote,
                        conn.state()
                    ));
                }
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ scripted impairments

/// Decides the fate of a packet crossing a [`Script`] box: `true` drops it.
pub type DropRule = Box<dyn FnMut(Direction, u64, &Segment<'_>) -> bool + Send>;

/// A middlebox that drops the packets a rule picks; the rule sees the direction, the number of
/// TCP packets seen so far in that direction (from 0) and the parsed segment.
pub struct Script {
    rule: DropRule,
    seen: [u64; 2],
    pub dropped: u64,
}

impl Script {
    pub fn new(rule: impl FnMut(Direction, u64, &Segment<'_>) -> bool + Send + 'static) -> Self {
        Script {
            rule: Box::new(rule),
            seen: [0; 2],
            dropped: 0,
        }
    }
}

impl Middlebox for Script {
    fn name(&self) -> &'static str {
        "script"
    }
    fn process(&mut self, now: Instant, dir: Direction, packet: Vec<u8>, out: &mut Vec<Emit>) {
        if let Some(seg) = tcp_segment(&packet) {
            let index = self.seen[dir.index()];
            self.seen[dir.index()] += 1;
            if (self.rule)(dir, index, &seg) {
                self.dropped += 1;
                return;
            }
        }
        out.push(Emit {
            at: now,
            dir,
            packet,
        });
    }
}

// ------------------------------------------------------------------ one connection

/// The client's and the server's address in [`World::pair`].
pub const CLIENT: &str = "10.0.0.1:40000";
pub const SERVER: &str = "10.0.1.1:443";

impl World {
    /// One connection from a client (left) to a server (right) over `bottleneck`, both
    /// endpoints keeping a trace of up to `trace` records per connection (0: none).
    pub fn pair(
        seed: u64,
        bottleneck: Bottleneck,
        client_config: ConnectionConfig,
        server_config: ConnectionConfig,
        client_plan: Plan,
        server_plan: Plan,
        trace: usize,
    ) -> World {
        let start = Instant::now();
        let (ca, sa): (SocketAddr, SocketAddr) = (
            CLIENT.parse().expect("address"),
            SERVER.parse().expect("address"),
        );
        let mut client = TcpHost::new("client", ca.ip(), 1, start);
        let mut server = TcpHost::new("server", sa.ip(), 2, start);
        client.trace_limit = trace;
        server.trace_limit = trace;
        let traced = |c: ConnectionConfig| {
            let mut config = c;
            config.trace_capacity = if trace > 0 { 1 << 16 } else { 0 };
            config
        };
        server.listen(sa.port(), traced(server_config));
        server.expect_client(sa.port(), ca, server_plan);
        client.add_client(
            ca.port(),
            sa,
            traced(client_config),
            Duration::ZERO,
            client_plan,
        );
        World::new(seed, bottleneck, start, client, server)
    }

    /// The trace of the client's (`client` true) or the server's connection.
    pub fn trace_of(&mut self, client: bool) -> Vec<squarepeg_tcp::TraceRecord> {
        let id = if client { self.client } else { self.server };
        let host = self.sim.host_mut::<TcpHost>(id).expect("host");
        host.collect_traces();
        host.traces.iter().map(|(_, r)| *r).collect()
    }

    /// Stats of the client's (`client` true) or the server's connection.
    pub fn stats_of(&self, client: bool) -> ConnectionStats {
        let host = if client { self.client() } else { self.server() };
        let c = &host.conns[0];
        c.handle
            .and_then(|h| host.ep.stats_of(h).ok())
            .or_else(|| c.stats.clone())
            .expect("connection stats")
    }
}
