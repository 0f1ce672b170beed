//! Harder two-endpoint scenarios: both directions at once, reordering, ACK loss, burst loss,
//! slow readers with small buffers. Every byte must arrive intact and both sides close cleanly.

mod common;

use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};
use squarepeg_tcp::{CloseReason, ConnectionConfig, ConnectionHandle, Endpoint, Event};

fn pattern(seed: u8, i: usize) -> u8 {
    ((i.wrapping_mul(2654435761) >> 11) as u8) ^ seed
}

struct Side {
    h: Option<ConnectionHandle>,
    to_send: Vec<u8>,
    sent: usize,
    shut: bool,
    got: Vec<u8>,
    eof: bool,
    closed: Option<CloseReason>,
    read_budget: usize,
}

impl Side {
    fn new(seed: u8, n: usize, read_budget: usize) -> Side {
        Side {
            h: None,
            to_send: (0..n).map(|i| pattern(seed, i)).collect(),
            sent: 0,
            shut: false,
            got: Vec::new(),
            eof: false,
            closed: None,
            read_budget,
        }
    }

    fn step(
        &mut self,
        ep: &mut Endpoint,
        now: std::time::Instant,
        listener: Option<squarepeg_tcp::ListenerHandle>,
    ) {
        while let Some(ev) = ep.poll_event() {
            match ev {
                Event::Incoming(l) => self.h = ep.accept(l),
                Event::Closed(_, r) => self.closed = Some(r),
                _ => {}
            }
        }
        let _ = listener;
        let Some(h) = self.h else { return };
        while self.sent < self.to_send.len() {
            let end = (self.sent + 100_000).min(self.to_send.len());
            match ep.write(h, &self.to_send[self.sent..end]) {
                Ok(n) => self.sent += n,
                Err(_) => break,
            }
        }
        if self.sent == self.to_send.len() && !self.shut && ep.shutdown(now, h).is_ok() {
            self.shut = true;
        }
        let mut buf = vec![0u8; self.read_budget];
        if !self.eof {
            match ep.read(h, &mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
    }
}

struct Outcome {
    a: Side,
    b: Side,
    pump: Pump,
}

fn exchange(
    a_bytes: usize,
    b_bytes: usize,
    cfg: ConnectionConfig,
    read_budget: usize,
    action: impl FnMut(bool, u64, &Pkt) -> Option<Duration>,
) -> Outcome {
    exchange_with(
        Duration::from_millis(10),
        0,
        a_bytes,
        b_bytes,
        cfg,
        read_budget,
        action,
    )
}

#[allow(clippy::too_many_arguments)]
fn exchange_with(
    delay: Duration,
    duplicate_every: u64,
    a_bytes: usize,
    b_bytes: usize,
    cfg: ConnectionConfig,
    read_budget: usize,
    action: impl FnMut(bool, u64, &Pkt) -> Option<Duration>,
) -> Outcome {
    let mut pump = Pump::new(delay);
    pump.duplicate_every = duplicate_every;
    pump.log = std::env::var("PUMP_LOG").is_ok();
    let sa = addr("10.1.0.2:443");
    let l = pump.b.listen(sa, 4, cfg.clone()).unwrap();
    let mut a = Side::new(1, a_bytes, read_budget);
    let mut b = Side::new(2, b_bytes, read_budget);
    a.h = Some(
        pump.a
            .connect(pump.now, addr("10.1.0.1:1234"), sa, cfg)
            .unwrap(),
    );
    let limit = std::env::var("LIMIT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(900);
    let ok = pump.run_with(Duration::from_secs(limit), action, |ea, eb, now| {
        a.step(ea, now, None);
        b.step(eb, now, Some(l));
        a.eof && b.eof && a.closed.is_some() && b.closed.is_some()
    });
    if !ok {
        for (name, ep, side) in [("a", &pump.a, &a), ("b", &pump.b, &b)] {
            if let Some(h) = side.h {
                eprintln!("{name}: {:#?}", ep.connection(h).map(|c| c.stats()));
            }
        }
        eprintln!(
            "now {:?} timers {:?} {:?} wire {}",
            pump.now - pump.t0,
            pump.a.poll_timeout().map(|t| t - pump.t0),
            pump.b.poll_timeout().map(|t| t - pump.t0),
            pump.wire.len()
        );
    }
    assert!(
        ok,
        "did not finish: a got {}/{} eof {} closed {:?}; b got {}/{} eof {} closed {:?}",
        a.got.len(),
        b_bytes,
        a.eof,
        a.closed,
        b.got.len(),
        a_bytes,
        b.eof,
        b.closed
    );
    Outcome { a, b, pump }
}

fn check(o: &Outcome) {
    let sha = |v: &[u8]| -> [u8; 32] { Sha256::digest(v).into() };
    assert_eq!(o.b.got.len(), o.a.to_send.len());
    assert_eq!(sha(&o.b.got), sha(&o.a.to_send), "A->B stream differs");
    assert_eq!(o.a.got.len(), o.b.to_send.len());
    assert_eq!(sha(&o.a.got), sha(&o.b.to_send), "B->A stream differs");
    assert_eq!(o.a.closed, Some(CloseReason::Normal));
    assert_eq!(o.b.closed, Some(CloseReason::Normal));
}

#[test]
fn both_directions_with_periodic_loss() {
    let o = exchange(
        3 << 20,
        2 << 20,
        ConnectionConfig::default(),
        65536,
        |_, i, _| (i % 53 != 17).then_some(Duration::ZERO),
    );
    check(&o);
    let st = o.pump.a.stats_of(o.a.h.unwrap()).unwrap();
    assert!(st.packets_retransmitted > 0);
}

#[test]
fn reordering_is_survived() {
    // Every 7th packet A sends is overtaken by the next ones (4 ms extra on a 10 ms link).
    let o = exchange(
        2 << 20,
        0,
        ConnectionConfig::default(),
        65536,
        |from_a, i, _| {
            Some(if from_a && i % 7 == 3 {
                Duration::from_millis(4)
            } else {
                Duration::ZERO
            })
        },
    );
    check(&o);
}

#[test]
fn ack_loss_and_burst_loss() {
    let o = exchange(
        2 << 20,
        0,
        ConnectionConfig::default(),
        65536,
        |from_a, i, _| {
            let lost = if from_a {
                (500..530).contains(&i)
            } else {
                i % 3 == 1
            };
            (!lost).then_some(Duration::ZERO)
        },
    );
    check(&o);
}

#[test]
fn slow_reader_small_buffer_newreno_no_sack_no_timestamps() {
    let mut cfg = ConnectionConfig::default();
    cfg.recv_buffer = 20_000;
    cfg.send_buffer = 50_000;
    cfg.sack = false;
    cfg.timestamps = false;
    cfg.congestion = squarepeg_tcp::CongestionAlgorithm::NewReno;
    let o = exchange(1 << 20, 300_000, cfg, 3000, |_, i, _| {
        (i % 101 != 50).then_some(Duration::ZERO)
    });
    check(&o);
}

#[test]
fn mss_536_ipv4_with_losses_both_ways() {
    let mut cfg = ConnectionConfig::default();
    cfg.mss = Some(536);
    let o = exchange(1 << 20, 1 << 20, cfg, 65536, |_, i, _| {
        (i % 37 != 5 && i % 41 != 7).then_some(Duration::ZERO)
    });
    check(&o);
}

/// Deterministic xorshift for scripted pseudo-random impairments (not a link model: each
/// decision is a fixed function of the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[test]
fn seeded_impairment_scenarios() {
    let seeds: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let first: u64 = std::env::var("FIRST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    for seed in first..=seeds {
        if std::env::var("SEED_LOG").is_ok() {
            eprintln!("seed {seed}");
        }
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut cfg = ConnectionConfig::default();
        cfg.sack = r.below(4) != 0;
        cfg.timestamps = r.below(3) != 0;
        cfg.window_scaling = r.below(4) != 0;
        cfg.congestion = if r.below(2) == 0 {
            squarepeg_tcp::CongestionAlgorithm::Cubic
        } else {
            squarepeg_tcp::CongestionAlgorithm::NewReno
        };
        cfg.mss = if r.below(3) == 0 { Some(536) } else { None };
        cfg.recv_buffer = [16_384, 65_536, 1 << 20][r.below(3) as usize];
        let loss_per_mille = r.below(
            std::env::var("MAXLOSS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(60),
        );
        let reorder_per_mille = r.below(100);
        let delay = Duration::from_millis(1 + r.below(40));
        let dup = [0, 0, 13, 29][r.below(4) as usize];
        let a_bytes = 10_000 + r.below(300_000) as usize;
        let b_bytes = r.below(200_000) as usize;
        let read_budget = [1000, 8192, 65536][r.below(3) as usize];
        let mut lr = Rng(seed ^ 0xdead_beef);
        let o = exchange_with(
            delay,
            dup,
            a_bytes,
            b_bytes,
            cfg.clone(),
            read_budget,
            move |_, _, _| {
                if lr.below(1000) < loss_per_mille {
                    None
                } else if lr.below(1000) < reorder_per_mille {
                    Some(Duration::from_micros(lr.below(8000)))
                } else {
                    Some(Duration::ZERO)
                }
            },
        );
        check(&o);
        let _ = (seed, cfg);
    }
}

#[test]
fn lost_syn_syn_ack_and_fins_are_retransmitted() {
    let mut dropped_syn = false;
    let mut dropped_synack = false;
    let mut fins_dropped = 0;
    let o = exchange(
        50_000,
        20_000,
        ConnectionConfig::default(),
        65536,
        move |from_a, _, p| {
            if p.has(SYN) && !p.has(ACK) && !dropped_syn {
                dropped_syn = true;
                return None;
            }
            if p.has(SYN) && p.has(ACK) && !dropped_synack {
                dropped_synack = true;
                return None;
            }
            // The first FIN of each side is lost.
            if p.has(FIN) && fins_dropped < 2 {
                let _ = from_a;
                fins_dropped += 1;
                return None;
            }
            Some(Duration::ZERO)
        },
    );
    check(&o);
    let st = o.pump.a.stats_of(o.a.h.unwrap()).unwrap();
    assert!(st.rto_timeouts >= 1, "{st:#?}");
}

#[test]
fn many_short_connections_are_served_and_freed() {
    let mut pump = Pump::new(Duration::from_millis(2));
    let mut cfg = ConnectionConfig::default();
    cfg.time_wait = Duration::from_secs(2);
    let sa = addr("10.2.0.2:8080");
    let l = pump.b.listen(sa, 64, cfg.clone()).unwrap();
    let n = 300;
    let mut clients = Vec::new();
    for _ in 0..n {
        let c = pump
            .a
            .connect(pump.now, addr("10.2.0.1:0"), sa, cfg.clone())
            .unwrap();
        pump.a.write(c, &[7u8; 1000]).unwrap();
        pump.a.shutdown(pump.now, c).unwrap();
        clients.push(c);
    }
    let mut served = 0;
    let mut bytes = 0;
    let mut open: Vec<ConnectionHandle> = Vec::new();
    let mut closed_clients = 0;
    let ok = pump.run(
        Duration::from_secs(60),
        |_, _, _| false,
        |a, b, now| {
            while let Some(ev) = a.poll_event() {
                if let Event::Closed(h, r) = ev {
                    assert_eq!(r, CloseReason::Normal);
                    a.close(now, h).unwrap();
                    closed_clients += 1;
                }
            }
            while let Some(ev) = b.poll_event() {
                if let Event::Incoming(_) = ev {
                    while let Some(h) = b.accept(l) {
                        open.push(h);
                    }
                }
            }
            let mut buf = [0u8; 4096];
            open.retain(|&h| {
                loop {
                    match b.read(h, &mut buf) {
                        Ok(0) => {
                            b.close(now, h).unwrap();
                            served += 1;
                            break false;
                        }
                        Ok(k) => bytes += k,
                        Err(_) => break true,
                    }
                }
            });
            served == n
                && closed_clients == n
                && a.connection_count() == 0
                && b.connection_count() == 0
        },
    );
    assert!(
        ok,
        "served {served}, client closes {closed_clients}, a {} b {}",
        pump.a.connection_count(),
        pump.b.connection_count()
    );
    assert_eq!(bytes, n * 1000);
}
