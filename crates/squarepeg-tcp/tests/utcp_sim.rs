//! uTCP in the simulator: the unordered receive path leaves every acknowledgment as it was,
//! and the wire invariants hold on the captures of seeded lossy scenarios.
//!
//! `cargo test -p squarepeg-tcp --test utcp_sim`

mod simnet;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use simnet::*;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_lab::sim::TraceKind;
use squarepeg_tcp::ConnectionConfig;
use squarepeg_tcp::audit::WireAudit;

/// Scenarios per test (each a short upload over a lossy, reordering path).
const SEEDS: u64 = 24;

fn path(seed: u64) -> Bottleneck {
    let mut d = Dice::new(seed);
    let delay = Duration::from_micros(d.range(1_000, 60_000));
    let mut l = LinkConfig::new()
        .with_delay(delay)
        .with_rate(d.range(2, 50) * 1_000_000)
        .with_queue(None, Some(d.range(16, 200)))
        .with_loss(d.unit() * 0.05);
    if d.chance(0.4) {
        l = l.with_reorder(0.05, delay / 2);
    }
    Bottleneck::symmetric(l)
}

/// What the receiver (server) put on the wire, field by field: the ACK number, SACK blocks,
/// window, flags and sequence number of every packet, in order.
type AckRecord = (u32, u32, u16, u8, Vec<(u32, u32)>);

/// Runs one upload with the server's unordered receive on or off; returns the server's
/// packets, the audit of both directions, and the server's unordered stats.
fn upload(seed: u64, unordered: bool) -> (Vec<AckRecord>, WireAudit, u64) {
    let mut d = Dice::new(seed ^ 0xA5);
    let bytes = d.range(20_000, 400_000);
    let mut client_cfg = ConnectionConfig::default();
    client_cfg.sack = d.chance(0.8);
    let mut server_cfg = ConnectionConfig::default();
    server_cfg.unordered_receive = unordered;
    server_cfg.sack = client_cfg.sack;
    let mut w = World::pair(
        seed,
        path(seed),
        client_cfg,
        server_cfg,
        Plan::new(bytes, seed, 0, 0),
        Plan::new(0, 0, bytes, seed),
        0,
    );
    let acks: Rc<RefCell<Vec<AckRecord>>> = Rc::default();
    let audit: Rc<RefCell<WireAudit>> = Rc::new(RefCell::new(WireAudit::new(true)));
    let (a, au, server) = (acks.clone(), audit.clone(), w.server);
    w.sim.on_trace(move |ev| {
        let TraceKind::Sent { host } = ev.kind else {
            return;
        };
        au.borrow_mut().packet(ev.packet);
        if host == server
            && let Some(s) = tcp_segment(ev.packet)
        {
            a.borrow_mut()
                .push((s.seq, s.ack, s.window, s.flags.0, s.options.sack().to_vec()));
        }
    });
    let limits = Limits {
        deadline: Duration::from_secs(120),
        watchdog: Duration::from_secs(120),
    };
    w.run(&limits)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", w.describe()));
    w.check_connections()
        .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", w.describe()));
    let segments = w.server().conns[0].segments_read;
    drop(w);
    let acks = Rc::try_unwrap(acks).expect("one owner").into_inner();
    let audit = Rc::try_unwrap(audit).expect("one owner").into_inner();
    (acks, audit, segments)
}

#[test]
fn unordered_receive_emits_exactly_the_acks_sacks_and_windows_of_standard_receive() {
    let mut reordered = 0;
    for seed in 1..=SEEDS {
        let (standard, _, _) = upload(seed, false);
        let (unordered, _, segments) = upload(seed, true);
        assert!(segments > 0, "seed {seed}: unordered reads were not used");
        assert_eq!(
            standard.len(),
            unordered.len(),
            "seed {seed}: different packet counts"
        );
        for (i, (s, u)) in standard.iter().zip(&unordered).enumerate() {
            assert_eq!(s, u, "seed {seed}: packet {i} of the receiver differs");
        }
        reordered += usize::from(standard.iter().any(|r| !r.4.is_empty()));
    }
    // The scenarios exercise out-of-order arrivals (SACK blocks were sent).
    assert!(reordered >= SEEDS as usize / 4, "{reordered}");
}

#[test]
fn simulator_captures_keep_the_wire_invariants() {
    let mut retransmissions = 0;
    for seed in 100..100 + SEEDS {
        let (_, audit, _) = upload(seed, true);
        let stats = audit
            .result()
            .unwrap_or_else(|v| panic!("seed {seed}: wire invariants broken:\n{v}"));
        assert_eq!(stats.shortened_retransmissions, 0, "seed {seed}");
        assert_eq!(stats.inconsistent_retransmissions, 0, "seed {seed}");
        retransmissions += stats.retransmissions;
    }
    eprintln!("retransmissions: {retransmissions}");
    assert!(retransmissions > 0, "the scenarios must retransmit");
}
