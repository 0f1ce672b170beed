//! The endpoint-wide memory budget (`EndpointConfig::memory`, `squarepeg_tcp::mem`): many
//! stalled connections stay within it while a new connection is served, and everything they
//! held comes back once they are read or closed.
//!
//! Endpoint A (the clients, unlimited) opens 200 connections to endpoint B (under test, a
//! 4 MiB budget). They stall three ways, a third each:
//! - A sends 100 kB that B's application never reads (B's receive side fills);
//! - B sends 100 kB that A's application never reads (B's send queue fills);
//! - A sends 100 kB whose first segment the network always loses (B holds out-of-order data
//!   above a hole that is never filled).

mod common;

use std::cell::Cell;
use std::collections::HashMap;
use std::time::Duration;

use common::*;
use squarepeg_tcp::{
    ConnectionConfig, ConnectionHandle, Endpoint, EndpointConfig, Event, ListenerHandle,
    MemoryBudget, State,
};

const STALLED: usize = 200;
const STALL_BYTES: usize = 100_000;
const LIMIT: usize = 4 << 20;
const FLOOR: usize = 8 << 10;
const FRESH_BYTES: usize = 200_000;

fn pattern(seed: usize, i: usize) -> u8 {
    ((i.wrapping_mul(2654435761) >> 11) as u8) ^ (seed as u8).wrapping_mul(31)
}

fn data(seed: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| pattern(seed, i)).collect()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stall {
    /// A writes, B's application does not read.
    BDoesNotRead,
    /// B writes, A's application does not read.
    ADoesNotRead,
    /// A writes, its first segment is always lost.
    Hole,
}

fn stall_of(i: usize) -> Stall {
    match i % 3 {
        0 => Stall::BDoesNotRead,
        1 => Stall::ADoesNotRead,
        _ => Stall::Hole,
    }
}

/// One connection of the test, as both applications see it.
struct Conn {
    port: u16,
    stall: Stall,
    a: ConnectionHandle,
    b: Option<ConnectionHandle>,
    /// What A sends and B sends.
    a_data: Vec<u8>,
    b_data: Vec<u8>,
    a_sent: usize,
    b_sent: usize,
    a_got: Vec<u8>,
    b_got: Vec<u8>,
    /// Whether the stalled side's application reads.
    reading: bool,
}

impl Conn {
    fn write(ep: &mut Endpoint, h: ConnectionHandle, src: &[u8], sent: &mut usize) {
        while *sent < src.len() {
            match ep.write(h, &src[*sent..]) {
                Ok(n) => *sent += n,
                Err(_) => break,
            }
        }
    }

    fn read(ep: &mut Endpoint, h: ConnectionHandle, got: &mut Vec<u8>) {
        let mut buf = [0u8; 16384];
        while let Ok(n) = ep.read(h, &mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    }

    fn step(&mut self, a: &mut Endpoint, b: &mut Endpoint) {
        Self::write(a, self.a, &self.a_data, &mut self.a_sent);
        if self.stall != Stall::ADoesNotRead || self.reading {
            Self::read(a, self.a, &mut self.a_got);
        }
        let Some(hb) = self.b else { return };
        Self::write(b, hb, &self.b_data, &mut self.b_sent);
        if self.stall != Stall::BDoesNotRead || self.reading {
            Self::read(b, hb, &mut self.b_got);
        }
    }

    fn done(&self) -> bool {
        self.a_got == self.b_data && self.b_got == self.a_data
    }
}

struct Lab {
    pump: Pump,
    listener: ListenerHandle,
    conns: Vec<Conn>,
    /// B's accepted handles by client port.
    accepted: HashMap<u16, ConnectionHandle>,
    /// A's initial sequence numbers by client port (to lose a connection's first segment).
    isn: HashMap<u16, u32>,
    /// Most memory B held, measured after every step.
    max_seen: usize,
    budget: MemoryBudget,
}

fn server_addr() -> std::net::SocketAddr {
    addr("10.1.0.2:443")
}

fn budget() -> MemoryBudget {
    MemoryBudget::new(LIMIT)
        .with_pressure(LIMIT / 4 * 3)
        .with_floor(FLOOR)
}

/// The coarse bound: the limit plus both floors of every connection (the exact bound, the
/// limit plus the floors actually held, is checked by `check_invariants`).
fn bound(connections: usize) -> usize {
    LIMIT + 2 * FLOOR * connections
}

fn lab(budget: MemoryBudget) -> Lab {
    let mut pump = Pump::new(Duration::from_millis(5));
    let t0 = pump.t0;
    let mut ca = EndpointConfig::default();
    ca.secret = [1; 32];
    ca.memory = MemoryBudget::unlimited();
    let mut cb = EndpointConfig::default();
    cb.secret = [2; 32];
    cb.memory = budget;
    pump.a = Endpoint::new(ca, t0);
    pump.b = Endpoint::new(cb, t0);
    let listener = pump
        .b
        .listen(server_addr(), 1024, ConnectionConfig::default())
        .unwrap();
    Lab {
        pump,
        listener,
        conns: Vec::new(),
        accepted: HashMap::new(),
        isn: HashMap::new(),
        max_seen: 0,
        budget,
    }
}

impl Lab {
    fn open(&mut self, port: u16, stall: Stall, a_bytes: usize, b_bytes: usize) {
        // A small receive buffer at A, so that B's data to a non-reading A piles up at B.
        let mut cfg = ConnectionConfig::default();
        cfg.recv_buffer = 16 << 10;
        let h = self
            .pump
            .a
            .connect(
                self.pump.now,
                addr(&format!("10.1.0.1:{port}")),
                server_addr(),
                cfg,
            )
            .unwrap();
        self.conns.push(Conn {
            port,
            stall,
            a: h,
            b: None,
            a_data: data(port as usize, a_bytes),
            b_data: data(port as usize + 1, b_bytes),
            a_sent: 0,
            b_sent: 0,
            a_got: Vec::new(),
            b_got: Vec::new(),
            reading: false,
        });
    }

    fn elapsed(&self) -> Duration {
        self.pump.now - self.pump.t0
    }

    /// Runs both applications until `stop` holds or `limit` of virtual time passes, checking
    /// B's memory against the bound after every step (when B has a budget). Connections
    /// whose stall is a hole lose their first segment while `holes` is set.
    fn run(
        &mut self,
        limit: Duration,
        holes: bool,
        stop: impl Fn(&[Conn], &Endpoint, Duration) -> bool,
    ) -> bool {
        let Lab {
            pump,
            listener,
            conns,
            accepted,
            isn,
            max_seen,
            budget,
        } = self;
        let listener = *listener;
        let strict = budget.limit != usize::MAX;
        let t0 = pump.t0;
        let hole_ports: Vec<u16> = conns
            .iter()
            .filter(|c| c.stall == Stall::Hole && !c.reading)
            .map(|c| c.port)
            .collect();
        let lossy = |port: u16| holes && hole_ports.contains(&port);
        let checked = Cell::new(0u64);
        let log = std::env::var("MEM_LOG").is_ok();
        let ok = pump.run(
            limit,
            |from_a, _, p| {
                if !from_a {
                    return false;
                }
                if p.has(SYN) {
                    isn.insert(p.src.port(), p.seq);
                    return false;
                }
                !p.payload.is_empty()
                    && lossy(p.src.port())
                    && isn.get(&p.src.port()) == Some(&p.seq.wrapping_sub(1))
            },
            |ea, eb, now| {
                while let Some(ev) = eb.poll_event() {
                    if let Event::Incoming(l) = ev {
                        assert_eq!(l, listener);
                        while let Some(h) = eb.accept(l) {
                            let port = eb.connection(h).unwrap().remote_addr().port();
                            accepted.insert(port, h);
                        }
                    }
                }
                while ea.poll_event().is_some() {}
                for c in conns.iter_mut() {
                    if c.b.is_none() {
                        c.b = accepted.get(&c.port).copied();
                    }
                    c.step(ea, eb);
                }
                let in_use = eb.stats().memory_in_use;
                *max_seen = (*max_seen).max(in_use);
                if log && checked.get().is_multiple_of(20_000) {
                    eprintln!(
                        "{:?} in use {in_use} packets b {} a {}",
                        now - t0,
                        eb.stats().packets_received,
                        ea.stats().packets_received
                    );
                }
                if strict {
                    // The exact bound inside, the coarse one here.
                    eb.check_invariants();
                    let coarse = bound(eb.connection_count());
                    assert!(in_use <= coarse, "B holds {in_use} bytes, bound {coarse}");
                    checked.set(checked.get() + 1);
                }
                stop(conns, eb, now - t0)
            },
        );
        assert!(!strict || checked.get() > 0);
        ok
    }
}

/// 200 connections, stalled a third each way, run for 30 s of virtual time.
fn stalled(budget: MemoryBudget) -> Lab {
    let mut lab = lab(budget);
    for i in 0..STALLED {
        let stall = stall_of(i);
        let (a_bytes, b_bytes) = match stall {
            Stall::BDoesNotRead | Stall::Hole => (STALL_BYTES, 0),
            Stall::ADoesNotRead => (0, STALL_BYTES),
        };
        lab.open(10_000 + i as u16, stall, a_bytes, b_bytes);
    }
    let stop_at = Duration::from_secs(30);
    lab.run(Duration::from_secs(60), true, |_, _, t| t >= stop_at);
    assert!(
        lab.elapsed() >= stop_at,
        "stalled before 30 s: {:?}",
        lab.elapsed()
    );
    assert_eq!(
        lab.accepted.len(),
        STALLED,
        "not every connection was accepted"
    );
    lab
}

#[test]
fn unbudgeted_stalled_connections_exceed_the_budget() {
    // What the budget is for: without it B holds what every stalled connection pins.
    let lab = stalled(MemoryBudget::unlimited());
    let held = lab.pump.b.stats().memory_in_use;
    eprintln!("unbudgeted: B holds {held} bytes (peak {})", lab.max_seen);
    assert!(
        lab.max_seen > bound(STALLED + 1),
        "unbudgeted peak {} within the bound {}",
        lab.max_seen,
        bound(STALLED + 1)
    );
}

#[test]
fn stalled_connections_stay_within_the_budget_and_a_new_one_is_served() {
    let mut lab = stalled(budget());
    let s = lab.pump.b.stats().clone();
    eprintln!(
        "budgeted: in use {} peak {} drops {} limited writes {} pressure events {}",
        s.memory_in_use,
        s.memory_peak,
        s.memory_pressure_drops,
        s.memory_limited_writes,
        s.memory_pressure_events
    );
    assert!(lab.max_seen <= bound(STALLED));
    assert_eq!(s.memory_peak, lab.max_seen.max(s.memory_peak));
    assert!(s.memory_peak <= bound(STALLED));
    // The budget bit: the stalled connections fill it and were held back.
    assert!(
        s.memory_in_use > LIMIT / 2,
        "only {} in use",
        s.memory_in_use
    );
    assert!(s.memory_pressure_drops > 0);
    assert!(s.memory_limited_writes > 0);
    assert!(s.memory_pressure_events > 0);

    // A new connection, reading on both sides (`reading` overrides the stall), moves 200 kB
    // each way.
    lab.open(20_000, Stall::BDoesNotRead, FRESH_BYTES, FRESH_BYTES);
    lab.conns.last_mut().unwrap().reading = true;
    let ok = lab.run(Duration::from_secs(600), true, |conns, _, _| {
        conns.last().unwrap().done()
    });
    let fresh = lab.conns.last().unwrap();
    assert!(
        ok && fresh.done(),
        "new connection got {} of {} at B, {} of {} at A by {:?}",
        fresh.b_got.len(),
        FRESH_BYTES,
        fresh.a_got.len(),
        FRESH_BYTES,
        lab.elapsed()
    );
    eprintln!("new connection done at {:?}", lab.elapsed());
    // The stalled ones are still there, still stalled, still holding memory.
    for c in &lab.conns[..STALLED] {
        assert!(!c.done());
        let state = lab.pump.b.connection(c.b.unwrap()).unwrap().state();
        assert!(
            matches!(state, State::Established | State::CloseWait),
            "{state:?}"
        );
    }
    assert!(lab.pump.b.stats().memory_in_use > LIMIT / 2);
    assert!(lab.max_seen <= bound(STALLED + 1));

    // B's application gives up on the stalled ones (abort: RST, RFC 9293 §3.10.4): what they
    // held is returned at once.
    let now = lab.pump.now;
    for c in &lab.conns[..STALLED] {
        lab.pump.b.abort(now, c.b.unwrap()).unwrap();
    }
    lab.run(Duration::from_secs(60), true, |_, b, _| {
        b.connection_count() == 1 && b.stats().memory_in_use == 0
    });
    assert_eq!(lab.pump.b.connection_count(), 1);
    assert_eq!(lab.pump.b.stats().memory_in_use, 0);
}

#[test]
fn memory_returns_and_windows_reopen_when_stalled_connections_are_read() {
    let mut lab = stalled(budget());
    assert!(lab.pump.b.stats().memory_in_use > LIMIT / 2);
    // Every application reads now, and the holes are filled by the next retransmission.
    for c in lab.conns.iter_mut() {
        c.reading = true;
    }
    let ok = lab.run(Duration::from_secs(1200), false, |conns, _, _| {
        conns.iter().all(|c| c.done())
    });
    let behind: Vec<_> = lab
        .conns
        .iter()
        .filter(|c| !c.done())
        .map(|c| (c.port, c.stall, c.a_got.len(), c.b_got.len()))
        .collect();
    assert!(ok && behind.is_empty(), "still throttled: {behind:?}");
    eprintln!("all stalled connections done at {:?}", lab.elapsed());
    // Everything read: B holds nothing.
    assert_eq!(lab.pump.b.stats().memory_in_use, 0);
    // Closed on both sides: the connections go, and their charges with them.
    let now = lab.pump.now;
    for c in &lab.conns {
        lab.pump.a.close(now, c.a).unwrap();
        lab.pump.b.close(now, c.b.unwrap()).unwrap();
    }
    lab.run(Duration::from_secs(600), false, |_, b, _| {
        b.connection_count() == 0
    });
    assert_eq!(lab.pump.b.connection_count(), 0);
    let s = lab.pump.b.stats();
    assert_eq!(s.memory_in_use, 0);
    assert!(s.memory_peak <= bound(STALLED));
    lab.pump.b.check_invariants();
}

/// A scripted peer against one connection with a tiny budget (limit 8000, pressure 6000,
/// floor 4000): the exact accounting, out-of-order data trimmed at the limit and pruned for
/// in-order data, short writes, the right window edge neither retracted nor opened under
/// pressure, and reopened once the application reads.
#[test]
fn scripted_accounting_prune_and_window() {
    const IRS: u32 = 0xffff_f000; // wraps during the test
    let mut cfg = EndpointConfig::default();
    cfg.memory = MemoryBudget::new(8000).with_pressure(6000).with_floor(4000);
    let mut h = Harness::with_config("192.0.2.1:40000", "198.51.100.7:80", cfg);
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config.delayed_ack = None;
        config
    });
    let iss = h.out1().seq;
    h.inject(
        &h.pkt(SYN | ACK, IRS, iss.wrapping_add(1))
            .opt(Opt::Mss(1460)),
    )
    .unwrap();
    let hs = h.out1();
    let edge = hs.ack.wrapping_add(hs.win as u32);
    h.events();
    let seq = |off: u32| IRS.wrapping_add(1).wrapping_add(off);
    let bytes = |off: usize, n: usize| data(7, off + n)[off..].to_vec();
    let in_use = |h: &Harness| h.ep.stats().memory_in_use;
    let snd = iss.wrapping_add(1);

    // Out of order within the floor, then within the limit.
    h.inject(&h.pkt(ACK, seq(1000), snd).data(&bytes(1000, 3000)))
        .unwrap();
    assert_eq!(in_use(&h), 3000);
    h.inject(&h.pkt(ACK, seq(5000), snd).data(&bytes(5000, 3000)))
        .unwrap();
    assert_eq!(in_use(&h), 6000);
    assert_eq!(h.ep.stats().memory_pressure_drops, 0);
    // At the limit: trimmed to the 2000 bytes that fit.
    h.inject(&h.pkt(ACK, seq(9000), snd).data(&bytes(9000, 3000)))
        .unwrap();
    assert_eq!(in_use(&h), 8000);
    assert_eq!(h.ep.stats_of(c).unwrap().ooo_bytes, 8000);
    assert_eq!(h.ep.stats().memory_pressure_drops, 1);
    h.ep.check_invariants();
    h.out();

    // In-order data that does not fit: the highest out-of-order range goes first.
    h.inject(&h.pkt(ACK, seq(0), snd).data(&bytes(0, 1000)))
        .unwrap();
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.recv_buffered, 7000);
    assert_eq!(st.ooo_bytes, 3000);
    assert_eq!(in_use(&h), 7000);
    assert_eq!(h.ep.stats().memory_pressure_drops, 2);
    let ack = h.out().pop().unwrap();
    assert_eq!(ack.ack, seq(4000));
    // Above pressure: the edge advertised stays where it was (not retracted, not opened).
    assert_eq!(ack.ack.wrapping_add(ack.win as u32), edge);
    h.ep.check_invariants();

    // Writes: the send side gets its floor (the limit is reached).
    assert_eq!(h.ep.write(c, &[1u8; 10_000]), Ok(4000));
    assert_eq!(h.ep.stats().memory_limited_writes, 1);
    assert_eq!(
        h.ep.write(c, &[1u8; 10]),
        Err(squarepeg_tcp::Error::WouldBlock)
    );
    assert_eq!(in_use(&h), 11_000);
    h.ep.check_invariants();

    // The hole's data does not fit (the receive side holds its floor, the endpoint is at the
    // limit): dropped, nothing pruned for nothing.
    h.out();
    h.inject(&h.pkt(ACK, seq(4000), snd).data(&bytes(4000, 1000)))
        .unwrap();
    assert_eq!(h.ep.stats_of(c).unwrap().ooo_bytes, 3000);
    assert_eq!(h.ep.stats().memory_pressure_drops, 3);
    assert_eq!(h.out().pop().unwrap().ack, seq(4000));
    // The application reads, the hole is filled, it reads the rest: the window reopens.
    let mut got = h.read_all(c);
    assert_eq!(in_use(&h), 7000);
    h.inject(&h.pkt(ACK, seq(4000), snd).data(&bytes(4000, 1000)))
        .unwrap();
    assert_eq!(h.ep.stats_of(c).unwrap().ooo_bytes, 0);
    got.extend(h.read_all(c));
    let first_diff = got.iter().zip(bytes(0, 8000)).position(|(a, b)| *a != b);
    assert!(
        got == bytes(0, 8000),
        "read {} bytes, first difference at {first_diff:?}",
        got.len()
    );
    assert_eq!(in_use(&h), 4000);
    let last = h.out().pop().unwrap();
    assert_eq!(last.ack, seq(8000));
    let reopened = last.ack.wrapping_add(last.win as u32);
    assert!(
        reopened.wrapping_sub(edge) as i32 > 0,
        "edge {reopened} not beyond {edge}"
    );
    // The peer acknowledges our data: nothing held.
    h.inject(&h.pkt(ACK, seq(8000), snd.wrapping_add(4000)))
        .unwrap();
    assert_eq!(in_use(&h), 0);
    h.ep.check_invariants();
}

/// uTCP receive (every segment at once) under the same tiny budget: the segments queued for
/// the application are what is counted, copies of data received before are queued only while
/// they fit, new data is trimmed at the limit, and reading returns everything.
#[test]
fn scripted_unordered_receive_within_the_budget() {
    const IRS: u32 = 1_000_000;
    let mut cfg = EndpointConfig::default();
    cfg.memory = MemoryBudget::new(8000).with_pressure(6000).with_floor(4000);
    let mut h = Harness::with_config("192.0.2.1:40000", "198.51.100.7:80", cfg);
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config.delayed_ack = None;
        config.unordered_receive = true;
        config
    });
    let iss = h.out1().seq;
    h.inject(
        &h.pkt(SYN | ACK, IRS, iss.wrapping_add(1))
            .opt(Opt::Mss(1460)),
    )
    .unwrap();
    h.out1();
    h.events();
    let seq = |off: u32| IRS.wrapping_add(1).wrapping_add(off);
    let bytes = |off: usize, n: usize| data(9, off + n)[off..].to_vec();
    let in_use = |h: &Harness| h.ep.stats().memory_in_use;
    let snd = iss.wrapping_add(1);

    h.inject(&h.pkt(ACK, seq(3000), snd).data(&bytes(3000, 3000)))
        .unwrap();
    assert_eq!(in_use(&h), 3000);
    // A copy fits (5000 left under the limit): queued again, as uTCP does.
    h.inject(&h.pkt(ACK, seq(3000), snd).data(&bytes(3000, 3000)))
        .unwrap();
    assert_eq!(in_use(&h), 6000);
    // Another does not (2000 left): not queued.
    h.inject(&h.pkt(ACK, seq(3000), snd).data(&bytes(3000, 3000)))
        .unwrap();
    assert_eq!(in_use(&h), 6000);
    let st = h.ep.stats_of(c).unwrap();
    assert_eq!(st.unordered.duplicate_bytes_dropped, 3000);
    // New data at the limit: 2000 of 3000 admitted.
    h.inject(&h.pkt(ACK, seq(0), snd).data(&bytes(0, 3000)))
        .unwrap();
    assert_eq!(in_use(&h), 8000);
    assert!(h.ep.stats().memory_pressure_drops >= 2);
    assert_eq!(h.out().pop().unwrap().ack, seq(2000));
    h.ep.check_invariants();

    // Reading every segment returns the memory; then the rest arrives and is read.
    let mut buf = [0u8; 4096];
    let mut got = vec![None; 6000];
    let mut take = |h: &mut Harness, got: &mut Vec<Option<u8>>| {
        while let Ok(seg) = h.ep.read_segment(c, &mut buf) {
            if seg.len == 0 {
                break;
            }
            for (i, &b) in buf[..seg.len].iter().enumerate() {
                got[seg.offset as usize + i] = Some(b);
            }
        }
    };
    take(&mut h, &mut got);
    assert_eq!(in_use(&h), 0);
    h.inject(&h.pkt(ACK, seq(2000), snd).data(&bytes(2000, 1000)))
        .unwrap();
    take(&mut h, &mut got);
    assert_eq!(in_use(&h), 0);
    let got: Vec<u8> = got.into_iter().map(|b| b.expect("every byte")).collect();
    assert!(got == bytes(0, 6000));
    assert_eq!(h.out().pop().unwrap().ack, seq(6000));
    h.ep.check_invariants();
}
