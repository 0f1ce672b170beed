//! The simulator end to end with the UDP test hosts.

mod common;

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use squarepeg_lab::middlebox::{Emit, Middlebox};
use squarepeg_lab::model::{Bottleneck, DropReason, LinkConfig, presets};
use squarepeg_lab::pcap::read_pcap;
use squarepeg_lab::sim::{
    DropCause, Host, PeriodicFlow, SimConfig, SimError, Simulator, Stop, Tap, TraceKind, UdpHost,
};
use squarepeg_lab::{Direction, Side};

const MS: Duration = Duration::from_millis(1);

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

fn v6(last: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last))
}

fn flow(dest: SocketAddr, src_port: u16, count: u64, interval: Duration) -> PeriodicFlow {
    PeriodicFlow {
        dest,
        src_port,
        payload_len: 160,
        interval,
        count,
        start: Duration::ZERO,
    }
}

#[test]
fn measured_rtt_equals_configured_delay() {
    // 25 ms each way, 1 Mbit/s: a 188-byte datagram (160 + UDP 8 + IPv4 20) takes 1.504 ms to
    // serialise, each way.
    let link = LinkConfig::new().with_delay(25 * MS).with_rate(1_000_000);
    let mut sim = Simulator::new(SimConfig::new(1, Bottleneck::symmetric(link))).expect("sim");
    let server_addr = SocketAddr::new(v4(2), 7);
    let mut client = UdpHost::new(v4(1), sim.start());
    client
        .add_flow(flow(server_addr, 5000, 50, 100 * MS))
        .expect("flow");
    let client = sim.add_host(Side::Left, client).expect("add");
    let server = sim
        .add_host(
            Side::Right,
            UdpHost::new(v4(2), sim.start()).with_echo(true),
        )
        .expect("add");
    sim.run_for(Duration::from_secs(10)).expect("run");

    let client = sim.host::<UdpHost>(client).expect("client");
    assert_eq!(client.rtts().len(), 50);
    assert!(
        client
            .rtts()
            .iter()
            .all(|s| s.rtt == 50 * MS + 2 * Duration::from_micros(1504))
    );
    let server = sim.host::<UdpHost>(server).expect("server");
    assert_eq!(server.received().len(), 50);
    assert!(
        server
            .received()
            .iter()
            .all(|a| a.one_way_delay() == 25 * MS + Duration::from_micros(1504))
    );
    assert_eq!(server.echoes_sent(), 50);
    let stats = sim.stats();
    assert_eq!((stats.sent, stats.delivered), (100, 100));
    assert_eq!(stats.left_to_right.delivered, 50);
    assert_eq!(stats.right_to_left.delivered, 50);
}

#[test]
fn routing_between_several_hosts_v4_and_v6() {
    let mut sim = Simulator::new(SimConfig::new(
        2,
        Bottleneck::symmetric(LinkConfig::new().with_delay(10 * MS)),
    ))
    .expect("sim");
    let start = sim.start();
    let rights = [SocketAddr::new(v4(100), 9), SocketAddr::new(v4(101), 9)];
    let right6 = SocketAddr::new(v6(100), 9);

    let mut a = UdpHost::new(v4(1), start);
    a.add_flow(flow(rights[0], 1, 3, MS)).expect("flow");
    a.add_flow(flow(rights[1], 2, 4, MS)).expect("flow");
    // To nobody: dropped and counted.
    a.add_flow(flow(SocketAddr::new(v4(222), 9), 3, 2, MS))
        .expect("flow");
    // To a neighbour on the same side: delivered at once.
    a.add_flow(flow(SocketAddr::new(v4(2), 9), 4, 5, MS))
        .expect("flow");
    let mut b = UdpHost::new(v4(2), start);
    b.add_flow(flow(rights[1], 1, 6, MS)).expect("flow");
    let mut c = UdpHost::new(v6(1), start);
    c.add_flow(flow(right6, 1, 7, MS)).expect("flow");
    assert!(
        c.add_flow(flow(rights[0], 1, 1, MS)).is_err(),
        "address family is checked"
    );

    let a = sim.add_host(Side::Left, a).expect("add");
    let b = sim.add_host(Side::Left, b).expect("add");
    sim.add_host(Side::Left, c).expect("add");
    let r0 = sim
        .add_host(Side::Right, UdpHost::new(rights[0].ip(), start))
        .expect("add");
    let r1 = sim
        .add_host(Side::Right, UdpHost::new(rights[1].ip(), start))
        .expect("add");
    let r6 = sim
        .add_host(Side::Right, UdpHost::new(right6.ip(), start))
        .expect("add");
    assert!(matches!(
        sim.add_host(Side::Right, UdpHost::new(v4(100), start)),
        Err(SimError::DuplicateAddress(_))
    ));
    assert_eq!(sim.run_while(|_| true).expect("run"), Stop::Idle);

    let from = |id, addr: IpAddr| -> usize {
        let host = sim.host::<UdpHost>(id).expect("host");
        host.received()
            .iter()
            .filter(|a| a.from.ip() == addr)
            .count()
    };
    assert_eq!(from(r0, v4(1)), 3);
    assert_eq!(from(r1, v4(1)), 4);
    assert_eq!(from(r1, v4(2)), 6);
    assert_eq!(from(r6, v6(1)), 7);
    assert_eq!(from(b, v4(1)), 5);
    let local = sim.host::<UdpHost>(b).expect("b");
    assert!(
        local
            .received()
            .iter()
            .all(|a| a.one_way_delay() == Duration::ZERO)
    );
    let stats = sim.stats();
    assert_eq!(stats.unroutable, 2);
    assert_eq!(stats.local, 5);
    assert_eq!(stats.left_to_right.delivered, 3 + 4 + 6 + 7);
    assert_eq!(sim.host::<UdpHost>(a).expect("a").datagrams_sent(), 14);
    assert!(sim.host::<Stuck>(a).is_none(), "downcast checks the type");
}

/// A host that claims no address: as a side's default host it stands for a whole network
/// (the real-time emulator's ports are such hosts).
#[derive(Default)]
struct Catchall {
    got: Vec<(Instant, Vec<u8>)>,
}

impl Host for Catchall {
    fn addresses(&self) -> Vec<IpAddr> {
        Vec::new()
    }
    fn handle_packet(&mut self, now: Instant, packet: Vec<u8>) {
        self.got.push((now, packet));
    }
    fn poll_transmit(&mut self, _: Instant) -> Option<Vec<u8>> {
        None
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _: Instant) {}
}

#[test]
fn default_hosts_take_unclaimed_addresses_across_the_bottleneck() {
    let mut sim = Simulator::new(SimConfig::new(
        3,
        Bottleneck::symmetric(LinkConfig::new().with_delay(10 * MS)),
    ))
    .expect("sim");
    let start = sim.start();
    let mut left = UdpHost::new(v4(1), start);
    // To a claimed address, an unclaimed one, and a same-side neighbour.
    left.add_flow(flow(SocketAddr::new(v4(100), 9), 1, 2, MS))
        .expect("flow");
    left.add_flow(flow(SocketAddr::new(v4(222), 9), 2, 3, MS))
        .expect("flow");
    left.add_flow(flow(SocketAddr::new(v4(2), 9), 3, 4, MS))
        .expect("flow");
    let mut right = UdpHost::new(v4(100), start);
    right
        .add_flow(flow(SocketAddr::new(v4(77), 9), 1, 5, MS))
        .expect("flow");
    sim.add_host(Side::Left, left).expect("add");
    let neighbour = sim
        .add_host(Side::Left, UdpHost::new(v4(2), start))
        .expect("add");
    let claimed = sim.add_host(Side::Right, right).expect("add");
    let far = sim.add_host(Side::Right, Catchall::default()).expect("add");
    let near = sim.add_host(Side::Left, Catchall::default()).expect("add");
    sim.set_default_host(far);
    sim.set_default_host(near);
    assert_eq!(sim.run_while(|_| true).expect("run"), Stop::Idle);

    assert_eq!(
        sim.host::<UdpHost>(claimed).expect("host").received().len(),
        2
    );
    assert_eq!(
        sim.host::<UdpHost>(neighbour)
            .expect("host")
            .received()
            .len(),
        4
    );
    let far = sim.host::<Catchall>(far).expect("catchall");
    assert_eq!(
        far.got.len(),
        3,
        "unclaimed addresses cross to the far default host"
    );
    assert!(far.got.iter().all(|(at, _)| *at >= start + 10 * MS));
    let near = sim.host::<Catchall>(near).expect("catchall");
    assert_eq!(near.got.len(), 5);
    let stats = sim.stats();
    assert_eq!(stats.unroutable, 0);
    assert_eq!(stats.left_to_right.delivered, 2 + 3);
    assert_eq!(stats.right_to_left.delivered, 5);
    assert_eq!(sim.pending_events(), 0);
}

/// A host whose timer is always due and never moves: a timer storm.
struct Stuck {
    at: Instant,
}

impl Host for Stuck {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![v4(50)]
    }
    fn handle_packet(&mut self, _: Instant, _: Vec<u8>) {}
    fn poll_transmit(&mut self, _: Instant) -> Option<Vec<u8>> {
        None
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        Some(self.at)
    }
    fn handle_timeout(&mut self, _: Instant) {}
}

#[test]
fn livelock_is_reported() {
    let config = SimConfig {
        max_events_per_instant: 10_000,
        ..SimConfig::default()
    };
    let mut sim = Simulator::new(config.clone()).expect("sim");
    let at = sim.start() + 3 * MS;
    sim.add_host(Side::Left, Stuck { at }).expect("add");
    match sim.run_for(Duration::from_secs(1)) {
        Err(SimError::Livelock { at: when, limit }) => {
            assert_eq!(when, 3 * MS);
            assert_eq!(limit, 10_000);
        }
        other => panic!("expected a livelock, got {other:?}"),
    }

    // Two echoing hosts with an ideal link answer each other forever at one instant.
    let mut sim = Simulator::new(config).expect("sim");
    let mut a = UdpHost::new(v4(1), sim.start()).with_echo(true);
    a.send(sim.start(), SocketAddr::new(v4(2), 9), 9, 64)
        .expect("send");
    sim.add_host(Side::Left, EchoForever(a)).expect("add");
    let b = EchoForever(UdpHost::new(v4(2), sim.start()).with_echo(true));
    sim.add_host(Side::Right, b).expect("add");
    assert!(matches!(sim.run_for(MS), Err(SimError::Livelock { .. })));
}

/// Echoes echoes too (the plain test host does not), so two of them never stop.
struct EchoForever(UdpHost);

impl Host for EchoForever {
    fn addresses(&self) -> Vec<IpAddr> {
        self.0.addresses()
    }
    fn handle_packet(&mut self, now: Instant, mut packet: Vec<u8>) {
        // Turn an echo (kind 1) back into data so it is echoed again.
        if packet.len() > 28 + 4 {
            packet[28 + 4] = 0;
            // Fix the UDP checksum by zeroing it (IPv4 allows "no checksum").
            packet[26..28].fill(0);
        }
        self.0.handle_packet(now, packet);
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        self.0.poll_transmit(now)
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        self.0.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.0.handle_timeout(now);
    }
}

#[test]
fn voip_over_hollywood_adsl_both_ways() {
    // Hollywood §5.1.2: 160-byte messages every 20 ms for a minute over ADSL 8/1 Mbit/s with
    // RTT 70 ms and 0.1 % loss each way.
    let mut sim =
        Simulator::new(SimConfig::new(2024, presets::hollywood_adsl_70ms())).expect("sim");
    let start = sim.start();
    let home = SocketAddr::new(v4(1), 4000);
    let far = SocketAddr::new(v4(200), 4000);
    let mut caller = UdpHost::new(home.ip(), start);
    caller
        .add_flow(PeriodicFlow::voip(far, home.port()))
        .expect("flow");
    let mut callee = UdpHost::new(far.ip(), start);
    callee
        .add_flow(PeriodicFlow::voip(home, far.port()))
        .expect("flow");
    let caller = sim.add_host(Side::Left, caller).expect("add");
    let callee = sim.add_host(Side::Right, callee).expect("add");
    sim.run_for(Duration::from_secs(61)).expect("run");

    let stats = sim.stats();
    for (receiver, from, serialization, link) in [
        (
            callee,
            home,
            Duration::from_micros(1504),
            &stats.left_to_right,
        ),
        (
            caller,
            far,
            Duration::from_micros(188),
            &stats.right_to_left,
        ),
    ] {
        let host = sim.host::<UdpHost>(receiver).expect("host");
        let missing = host.missing(from, 3000);
        assert_eq!(host.received().len() + missing.len(), 3000);
        assert_eq!(missing.len() as u64, link.dropped_random_loss);
        assert_eq!(link.dropped(), link.dropped_random_loss);
        // 0.1 % of 3000: 3 expected, 4σ = 6.9.
        assert!(missing.len() <= 9, "{missing:?}");
        // No jitter and no queueing at 64 kbit/s: every delay is propagation + serialisation.
        assert!(
            host.received()
                .iter()
                .all(|a| a.one_way_delay() == 35 * MS + serialization)
        );
        assert!(
            host.received()
                .iter()
                .all(|a| a.payload_len == 160 && !a.duplicate)
        );
    }
    assert!(
        stats.left_to_right.dropped() + stats.right_to_left.dropped() > 0,
        "seed 2024 loses some"
    );
}

#[test]
fn competing_flows_share_the_bottleneck() {
    // Minion §8.2's contention: bulk flows through one 8 Mbit/s downlink with a 50-packet
    // queue. Two senders offer 12 Mbit/s each.
    let down = LinkConfig::new()
        .with_delay(10 * MS)
        .with_rate(8_000_000)
        .with_queue(None, Some(50));
    let bottleneck = Bottleneck {
        left_to_right: LinkConfig::new().with_delay(10 * MS),
        right_to_left: down,
    };
    let mut sim = Simulator::new(SimConfig::new(3, bottleneck)).expect("sim");
    let start = sim.start();
    let receivers = [SocketAddr::new(v4(1), 9), SocketAddr::new(v4(2), 9)];
    let mut senders = Vec::new();
    for (i, to) in receivers.iter().enumerate() {
        let mut host = UdpHost::new(v4(100 + i as u8), start);
        host.add_flow(PeriodicFlow {
            dest: *to,
            src_port: 1000,
            payload_len: 1472,
            interval: MS,
            count: 2000,
            start: Duration::from_micros(500 * i as u64),
        })
        .expect("flow");
        senders.push(sim.add_host(Side::Right, host).expect("add"));
    }
    let ids: Vec<_> = receivers
        .iter()
        .map(|r| {
            sim.add_host(Side::Left, UdpHost::new(r.ip(), start))
                .expect("add")
        })
        .collect();
    sim.run_for(Duration::from_secs(3)).expect("run");
    let stats = sim.stats().right_to_left;
    assert_eq!(stats.offered, 4000);
    // 2 s of 1500-byte packets at 8 Mbit/s (1.5 ms each) plus the queue's 50 at the end.
    let got: Vec<usize> = ids
        .iter()
        .map(|&id| sim.host::<UdpHost>(id).expect("host").received().len())
        .collect();
    assert_eq!(got.iter().sum::<usize>() as u64, stats.delivered);
    assert!(
        stats.delivered.abs_diff(2000 * 2 / 3 + 50) <= 2,
        "{}",
        stats.delivered
    );
    assert_eq!(stats.dropped_queue_full, 4000 - stats.delivered);
    assert!(
        got.iter().all(|&g| g > 500),
        "both flows get through: {got:?}"
    );
    assert_eq!(stats.max_queue_packets, 50);
}

/// Holds every packet for a fixed time and counts packets per direction.
struct Delay {
    delay: Duration,
    held: Vec<Emit>,
    seen: [u64; 2],
}

impl Middlebox for Delay {
    fn name(&self) -> &'static str {
        "delay"
    }
    fn process(&mut self, now: Instant, dir: Direction, packet: Vec<u8>, _out: &mut Vec<Emit>) {
        self.seen[dir.index()] += 1;
        self.held.push(Emit {
            at: now + self.delay,
            dir,
            packet,
        });
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.held.iter().map(|e| e.at).min()
    }
    fn handle_timeout(&mut self, now: Instant, out: &mut Vec<Emit>) {
        let (due, keep): (Vec<Emit>, Vec<Emit>) = self.held.drain(..).partition(|e| e.at <= now);
        self.held = keep;
        out.extend(due);
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("delay_left_to_right", self.seen[0]),
            ("delay_right_to_left", self.seen[1]),
        ]
    }
}

#[test]
fn middleboxes_on_both_sides_see_both_directions() {
    let mut sim = Simulator::new(SimConfig::new(
        4,
        Bottleneck::symmetric(LinkConfig::new().with_delay(10 * MS)),
    ))
    .expect("sim");
    let delay = |ms| Delay {
        delay: ms * MS,
        held: Vec::new(),
        seen: [0; 2],
    };
    sim.add_middlebox(Side::Left, delay(1));
    sim.add_middlebox(Side::Left, delay(2));
    sim.add_middlebox(Side::Right, delay(4));
    let mut client = UdpHost::new(v4(1), sim.start());
    client
        .add_flow(flow(SocketAddr::new(v4(2), 7), 1, 20, 50 * MS))
        .expect("flow");
    let client = sim.add_host(Side::Left, client).expect("add");
    sim.add_host(
        Side::Right,
        UdpHost::new(v4(2), sim.start()).with_echo(true),
    )
    .expect("add");
    sim.run_for(Duration::from_secs(2)).expect("run");
    let rtts = sim.host::<UdpHost>(client).expect("client").rtts().to_vec();
    assert_eq!(rtts.len(), 20);
    // 2 × (10 ms link + 1 + 2 + 4 ms of middleboxes).
    assert!(rtts.iter().all(|s| s.rtt == 34 * MS), "{rtts:?}");
    assert_eq!(
        sim.chain(Side::Left).counters(),
        vec![
            ("delay_left_to_right", 20),
            ("delay_right_to_left", 20),
            ("delay_left_to_right", 20),
            ("delay_right_to_left", 20),
            ("chain_dropped_loops", 0)
        ]
    );
}

#[test]
fn link_down_mid_run_and_host_changes_between_runs() {
    let mut sim = Simulator::new(SimConfig::new(
        5,
        Bottleneck::symmetric(LinkConfig::new().with_delay(5 * MS)),
    ))
    .expect("sim");
    let to = SocketAddr::new(v4(2), 7);
    let mut client = UdpHost::new(v4(1), sim.start());
    client.add_flow(flow(to, 1, 30, 10 * MS)).expect("flow");
    let client = sim.add_host(Side::Left, client).expect("add");
    let server = sim
        .add_host(Side::Right, UdpHost::new(v4(2), sim.start()))
        .expect("add");
    sim.run_until(sim.start() + 95 * MS).expect("run");
    sim.link_mut(Direction::LeftToRight).set_up(false);
    sim.run_until(sim.start() + 195 * MS).expect("run");
    sim.link_mut(Direction::LeftToRight).set_up(true);
    sim.run_for(Duration::from_secs(1)).expect("run");
    let server_host = sim.host::<UdpHost>(server).expect("server");
    // Sends at 0..=90 ms get through, 100..=190 ms are dropped, 200..=290 ms get through.
    assert_eq!(
        server_host.missing(SocketAddr::new(v4(1), 1), 30),
        (10..20).collect::<Vec<_>>()
    );
    assert_eq!(
        sim.stats().left_to_right.dropped_by(DropReason::LinkDown),
        10
    );

    // Queue a datagram from outside: picked up at the next event.
    let now = sim.now();
    sim.host_mut::<UdpHost>(client)
        .expect("client")
        .send(now, to, 2, 100)
        .expect("send");
    sim.run_for(Duration::from_secs(1)).expect("run");
    assert_eq!(
        sim.host::<UdpHost>(server)
            .expect("server")
            .received()
            .len(),
        21
    );
}

/// FNV-1a of every trace event (time, kind, bytes).
fn traced_run(seed: u64) -> (u64, usize) {
    let bottleneck: Bottleneck = Bottleneck {
        left_to_right: "delay=20ms jitter=5ms,reorder rate=1mbit queue=20p loss=1% dup=1%"
            .parse()
            .expect("spec"),
        right_to_left: "delay=20ms rate=8mbit ge=p:1%,r:20% reorder=2%,4ms"
            .parse()
            .expect("spec"),
    };
    let mut sim = Simulator::new(SimConfig::new(seed, bottleneck)).expect("sim");
    let state = Rc::new(RefCell::new((0xcbf2_9ce4_8422_2325u64, 0usize)));
    let hook_state = Rc::clone(&state);
    let start = sim.start();
    sim.on_trace(move |event| {
        let mut s = hook_state.borrow_mut();
        let kind = match event.kind {
            TraceKind::Sent { host } => host.index() as u64,
            TraceKind::Delivered { host } => 100 + host.index() as u64,
            TraceKind::Dropped {
                cause: DropCause::Link { reason, .. },
            } => 200 + reason as u64,
            TraceKind::Dropped { .. } => 300,
        };
        let time = (event.time - start).as_nanos() as u64;
        for byte in time
            .to_le_bytes()
            .iter()
            .chain(&kind.to_le_bytes())
            .chain(event.packet)
        {
            s.0 ^= u64::from(*byte);
            s.0 = s.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        s.1 += 1;
    });
    let a = SocketAddr::new(v4(1), 1);
    let b = SocketAddr::new(v4(2), 2);
    let mut left = UdpHost::new(a.ip(), start).with_echo(true);
    left.add_flow(flow(b, a.port(), 2000, 3 * MS))
        .expect("flow");
    let mut right = UdpHost::new(b.ip(), start).with_echo(true);
    right.add_flow(flow(a, b.port(), 2000, MS)).expect("flow");
    sim.add_host(Side::Left, left).expect("add");
    sim.add_host(Side::Right, right).expect("add");
    sim.run_for(Duration::from_secs(10)).expect("run");

    *state.borrow()
}

#[test]
fn same_seed_same_trace_different_seed_different_trace() {
    let (hash, events) = traced_run(77);
    assert!(events > 8000, "{events}");
    assert_eq!(traced_run(77), (hash, events));
    assert_ne!(traced_run(78).0, hash);
}

#[test]
fn pcap_of_a_run_is_read_by_tshark() {
    let dir = common::TempDir::new("sim-pcap");
    let path = dir.0.join("voip.pcap");
    let mut sim = Simulator::new(SimConfig::new(8, presets::hollywood_adsl_15ms())).expect("sim");
    let start = sim.start();
    let (a, b) = (SocketAddr::new(v4(1), 5004), SocketAddr::new(v6(9), 5004));
    let (a6, b4) = (SocketAddr::new(v6(1), 5006), SocketAddr::new(v4(9), 5006));
    let mut left4 = UdpHost::new(a.ip(), start);
    left4
        .add_flow(flow(b4, a.port(), 100, 20 * MS))
        .expect("flow");
    let mut left6 = UdpHost::new(a6.ip(), start);
    left6
        .add_flow(flow(b, a6.port(), 100, 20 * MS))
        .expect("flow");
    sim.add_host(Side::Left, left4).expect("add");
    sim.add_host(Side::Left, left6).expect("add");
    sim.add_host(Side::Right, UdpHost::new(b.ip(), start).with_echo(true))
        .expect("add");
    sim.add_host(Side::Right, UdpHost::new(b4.ip(), start).with_echo(true))
        .expect("add");
    let file = std::fs::File::create(&path).expect("create");
    sim.capture_pcap(Tap::Delivered, std::io::BufWriter::new(file))
        .expect("capture");
    sim.run_for(Duration::from_secs(3)).expect("run");
    sim.flush_captures().expect("flush");
    let delivered = sim.stats().delivered as usize;
    drop(sim);

    let bytes = std::fs::read(&path).expect("read");
    let file = read_pcap(&bytes).expect("our reader");
    assert_eq!(file.records.len(), delivered);
    assert!(
        file.records
            .windows(2)
            .all(|w| w[0].timestamp <= w[1].timestamp)
    );
    // The first delivery: sent at 0, 7.5 ms of propagation plus 1.504 ms at 1 Mbit/s.
    assert_eq!(
        file.records[0].timestamp,
        Duration::from_micros(7500 + 1504)
    );

    let fields = [
        "-o",
        "udp.check_checksum:TRUE",
        "-T",
        "fields",
        "-e",
        "frame.protocols",
        "-e",
        "udp.checksum.status",
    ];
    if let Some(lines) = common::tshark(&path, &fields) {
        assert_eq!(lines.len(), delivered);
        let v4_lines = lines.iter().filter(|l| l.starts_with("raw:ip:udp")).count();
        let v6_lines = lines
            .iter()
            .filter(|l| l.starts_with("raw:ipv6:udp"))
            .count();
        assert_eq!(v4_lines + v6_lines, delivered, "{lines:?}");
        assert!(v4_lines > 0 && v6_lines > 0);
        // Checksum status 1 is "Good" (0 bad, 2 unverified) in Wireshark's enumeration.
        assert!(
            lines.iter().all(|l| l.split('\t').nth(1) == Some("1")),
            "{lines:?}"
        );
    }
}

#[test]
fn sim_config_from_json() {
    let config = SimConfig::new(5, presets::hollywood_adsl_15ms());
    let json = serde_json::to_string(&config).expect("write");
    assert_eq!(
        serde_json::from_str::<SimConfig>(&json).expect("read"),
        config
    );
    let partial: SimConfig = serde_json::from_str(
        r#"{"seed": 3, "bottleneck": {"right_to_left": {"delay": "20ms", "rate_bps": 8000000}}}"#,
    )
    .expect("partial");
    assert_eq!(partial.seed, 3);
    assert_eq!(
        partial.bottleneck.right_to_left,
        "delay=20ms rate=8mbit".parse().expect("spec")
    );
    assert_eq!(partial.bottleneck.left_to_right, LinkConfig::default());
    assert_eq!(
        partial.max_events_per_instant,
        SimConfig::default().max_events_per_instant
    );
}
