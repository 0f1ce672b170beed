//! Speed of the lab: the simulator against real time, the link model per packet, and the
//! middlebox chain per segment.
//!
//! `cargo bench -p squarepeg-lab --bench sim`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etherparse::{PacketBuilder, TcpHeader};
use squarepeg_lab::middlebox::{
    Middlebox, MiddleboxChain, OptionStripper, ResegmentConfig, Resegmenter, RetransmitCache,
    RetransmitCacheConfig, SeqRewriteConfig, SeqRewriter, StripOptionsConfig,
};
use squarepeg_lab::model::{Bottleneck, LinkConfig, LinkDirection, presets};
use squarepeg_lab::sim::{PeriodicFlow, SimConfig, Simulator, UdpHost};
use squarepeg_lab::{Direction, Side};

fn addr(last: u8, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)), port)
}

/// Hollywood §5.1.2: one minute of VoIP both ways over ADSL, RTT 70 ms, 0.1 % loss.
fn voip_minute() -> usize {
    let mut sim = Simulator::new(SimConfig::new(1, presets::hollywood_adsl_70ms())).expect("sim");
    let (a, b) = (addr(1, 4000), addr(2, 4000));
    let mut left = UdpHost::new(a.ip(), sim.start());
    left.add_flow(PeriodicFlow::voip(b, a.port()))
        .expect("flow");
    let mut right = UdpHost::new(b.ip(), sim.start());
    right
        .add_flow(PeriodicFlow::voip(a, b.port()))
        .expect("flow");
    let left = sim.add_host(Side::Left, left).expect("add");
    sim.add_host(Side::Right, right).expect("add");
    sim.run_for(Duration::from_secs(61)).expect("run");
    sim.host::<UdpHost>(left).expect("host").received().len()
}

/// 64 MiB in 1472-byte datagrams through a 1 Gbit/s, 1 ms bottleneck.
fn bulk_64mib() -> usize {
    let link = LinkConfig::new()
        .with_delay(Duration::from_millis(1))
        .with_rate(1_000_000_000);
    let mut sim = Simulator::new(SimConfig::new(1, Bottleneck::symmetric(link))).expect("sim");
    let (a, b) = (addr(1, 5000), addr(2, 5000));
    let mut sender = UdpHost::new(a.ip(), sim.start());
    sender
        .add_flow(PeriodicFlow {
            dest: b,
            src_port: a.port(),
            payload_len: 1472,
            // 1500 bytes every 12 µs: 1 Gbit/s minus a little.
            interval: Duration::from_micros(12),
            count: (64 << 20) / 1472 + 1,
            start: Duration::ZERO,
        })
        .expect("flow");
    sim.add_host(Side::Left, sender).expect("add");
    let receiver = sim
        .add_host(Side::Right, UdpHost::new(b.ip(), sim.start()))
        .expect("add");
    sim.run_for(Duration::from_secs(2)).expect("run");
    sim.host::<UdpHost>(receiver)
        .expect("host")
        .received()
        .len()
}

fn simulator(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulator");
    group.sample_size(10);
    group.throughput(Throughput::Elements(6000));
    group.bench_function("voip_60s_both_ways_adsl_70ms", |b| {
        b.iter(|| black_box(voip_minute()))
    });
    group.throughput(Throughput::Bytes(64 << 20));
    group.bench_function("bulk_64MiB_udp_1gbit", |b| {
        b.iter(|| black_box(bulk_64mib()))
    });
    group.finish();
}

fn link_model(c: &mut Criterion) {
    let config: LinkConfig = "delay=35ms jitter=2ms,normal rate=8mbit queue=64kb loss=0.1% ge=p:1%,r:30% reorder=1%,3ms dup=0.1%"
        .parse()
        .expect("spec");
    let mut group = c.benchmark_group("link_model");
    group.throughput(Throughput::Elements(10_000));
    group.bench_function("offer_every_impairment", |b| {
        b.iter(|| {
            let t0 = Instant::now();
            let mut link = LinkDirection::new(config.clone(), 1).expect("config");
            for i in 0..10_000u32 {
                black_box(link.offer(t0 + Duration::from_micros(500) * i, 1000));
            }
        })
    });
    group.finish();
}

fn middleboxes(c: &mut Criterion) {
    let segments: Vec<Vec<u8>> = (0..10_000u32)
        .map(|i| {
            let mut tcp = TcpHeader::new(40_000, 443, 1 + 1448 * i, 65_535);
            tcp.ack = true;
            tcp.acknowledgment_number = 1;
            let mut out = Vec::new();
            PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
                .tcp_header(tcp)
                .write(&mut out, &[i as u8; 1448])
                .expect("build");
            out
        })
        .collect();
    let mut group = c.benchmark_group("middleboxes");
    group.sample_size(20);
    group.throughput(Throughput::Bytes(10_000 * 1448));
    group.bench_function("chain_of_four_10k_segments", |b| {
        b.iter(|| {
            let mut chain = MiddleboxChain::new();
            chain.push(Box::new(SeqRewriter::new(SeqRewriteConfig::default())));
            chain.push(Box::new(OptionStripper::new(StripOptionsConfig::default())));
            chain.push(Box::new(RetransmitCache::new(
                RetransmitCacheConfig::default(),
            )));
            chain.push(Box::new(Resegmenter::new(ResegmentConfig::default())));
            let t0 = Instant::now();
            let mut out = Vec::new();
            for (i, segment) in segments.iter().enumerate() {
                let now = t0 + Duration::from_micros(100) * i as u32;
                while chain.poll_timeout().is_some_and(|t| t <= now) {
                    chain.handle_timeout(now, &mut out);
                }
                chain.process(now, Direction::LeftToRight, segment.clone(), &mut out);
                out.clear();
            }
        })
    });
    group.finish();
}

criterion_group!(benches, simulator, link_model, middleboxes);
criterion_main!(benches);
