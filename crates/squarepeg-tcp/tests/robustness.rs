//! Malformed packets: typed drop reasons, counted, never a panic; proptests of random and
//! mutated packets.

mod common;

use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;
use squarepeg_tcp::{ConnectionConfig, DropReason, Endpoint, EndpointConfig};

fn server() -> Harness {
    let mut h = Harness::new("192.0.2.1:80", "198.51.100.7:50000");
    h.listen(8, ConnectionConfig::default());
    h
}

#[test]
fn truncated_packets_have_typed_reasons() {
    let mut h = server();
    let full = h.pkt(SYN, 1, 0).opt(Opt::Mss(1460)).data(b"abc").build();
    for len in 0..full.len() {
        let r = h.ep.handle_packet(h.now, &full[..len]);
        let reason = r.unwrap_err();
        let expected = match len {
            0..20 => DropReason::Truncated,
            // The IPv4 total length now exceeds the bytes present.
            _ => DropReason::BadIpHeader,
        };
        assert_eq!(reason, expected, "len {len}");
    }
    assert_eq!(h.ep.stats().dropped_total(), full.len() as u64);
    h.none();
}

fn set_ipv4_total(p: &mut [u8]) {
    let n = p.len() as u16;
    p[2..4].copy_from_slice(&n.to_be_bytes());
    p[10] = 0;
    p[11] = 0;
    let mut acc = 0u32;
    for c in p[..20].chunks(2) {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    p[10..12].copy_from_slice(&(!(acc as u16)).to_be_bytes());
}

#[test]
fn short_tcp_header_bad_offsets_and_options() {
    let mut h = server();
    let good = h.pkt(SYN, 1, 0).opt(Opt::Mss(1460)).build();
    // IP says 30 bytes: only 10 bytes of TCP header.
    let mut p = good[..30].to_vec();
    set_ipv4_total(&mut p);
    assert_eq!(
        h.ep.handle_packet(h.now, &p),
        Err(DropReason::TruncatedTcpHeader)
    );
    // Data offset below 5 words.
    let mut p = good.clone();
    p[32] = 0x40;
    assert_eq!(
        h.ep.handle_packet(h.now, &p),
        Err(DropReason::BadDataOffset)
    );
    // Data offset beyond the segment.
    let mut p = good.clone();
    p[32] = 0xf0;
    assert_eq!(
        h.ep.handle_packet(h.now, &p),
        Err(DropReason::BadDataOffset)
    );
    // Option length 0, 1 and overrunning the header.
    for raw in [vec![8, 0, 1, 1], vec![2, 1, 1, 1], vec![1, 1, 8, 10]] {
        let p = h.pkt(SYN, 1, 0).opt(Opt::Raw(raw.clone())).build();
        assert_eq!(
            h.ep.handle_packet(h.now, &p),
            Err(DropReason::BadOptionLength),
            "{raw:?}"
        );
    }
    // Unknown option with a good length: ignored, the SYN is answered.
    let p = h
        .pkt(SYN, 1, 0)
        .opt(Opt::Raw(vec![254, 4, 0, 0]))
        .opt(Opt::Mss(1000))
        .build();
    assert_eq!(h.ep.handle_packet(h.now, &p), Ok(()));
    assert_eq!(h.out1().flag_str(), "S.");
    assert_eq!(h.ep.stats().dropped(DropReason::BadOptionLength), 3);
}

#[test]
fn checksums_verified_unless_offloaded() {
    let mut h = server();
    let mut p = h.pkt(SYN, 1, 0).build();
    let last = p.len() - 1;
    p[last] ^= 0x01; // inside the TCP header (urgent pointer)
    assert_eq!(
        h.ep.handle_packet(h.now, &p),
        Err(DropReason::BadTcpChecksum)
    );
    let mut q = h.pkt(SYN, 1, 0).build();
    q[8] ^= 1; // TTL: IPv4 header checksum
    assert_eq!(
        h.ep.handle_packet(h.now, &q),
        Err(DropReason::BadIpChecksum)
    );
    h.none();
    // Offload path: verification switched off.
    let mut h = Harness::with_config("192.0.2.1:80", "198.51.100.7:50000", {
        let mut config = EndpointConfig::default();
        config.verify_checksums = false;
        config
    });
    h.listen(8, ConnectionConfig::default());
    assert_eq!(h.ep.handle_packet(h.now, &p), Ok(()));
}

#[test]
fn not_tcp_fragments_and_versions() {
    let mut h = server();
    let mut p = h.pkt(SYN, 1, 0).build();
    p[9] = 17; // UDP
    set_ipv4_total(&mut p);
    assert_eq!(h.ep.handle_packet(h.now, &p), Err(DropReason::NotTcp));
    let mut p = h.pkt(SYN, 1, 0).build();
    p[6] = 0x20; // more fragments
    set_ipv4_total(&mut p);
    assert_eq!(h.ep.handle_packet(h.now, &p), Err(DropReason::Fragment));
    let mut p = h.pkt(SYN, 1, 0).build();
    p[0] = 0x55;
    assert_eq!(
        h.ep.handle_packet(h.now, &p),
        Err(DropReason::UnsupportedIpVersion)
    );
    // IPv6 with a destination-options extension header before TCP is accepted.
    let mut h6 = Harness::new("[fd00::1]:80", "[fd00::2]:5000");
    h6.listen(8, ConnectionConfig::default());
    let p = h6.pkt(SYN, 1, 0).build();
    let mut q = p[..40].to_vec();
    q[6] = 60;
    q.extend_from_slice(&[6, 0, 1, 4, 0, 0, 0, 0]);
    q.extend_from_slice(&p[40..]);
    let plen = (q.len() - 40) as u16;
    q[4..6].copy_from_slice(&plen.to_be_bytes());
    assert_eq!(h6.ep.handle_packet(h6.now, &q), Ok(()));
    assert_eq!(h6.out1().flag_str(), "S.");
    // Fragment header: dropped.
    q[6] = 44;
    assert_eq!(h6.ep.handle_packet(h6.now, &q), Err(DropReason::Fragment));
}

#[test]
fn out_of_order_memory_is_bounded() {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = ConnectionConfig::default();
        config.timestamps = false;
        config.max_ooo_ranges = 2;
        config
    });
    let iss = h.out1().seq;
    h.inject(&h.pkt(SYN | ACK, 100, iss + 1).opt(Opt::SackOk))
        .unwrap();
    h.out();
    h.inject(&h.pkt(ACK, 1101, iss + 1).data(&[1; 10])).unwrap();
    h.inject(&h.pkt(ACK, 2101, iss + 1).data(&[1; 10])).unwrap();
    assert_eq!(
        h.inject(&h.pkt(ACK, 3101, iss + 1).data(&[1; 10])),
        Err(DropReason::OutOfOrderQueueFull)
    );
    assert_eq!(h.ep.stats_of(c).unwrap().ooo_bytes, 20);
}

/// Builds a connected pair of endpoints and returns a list of real packets they exchanged.
fn sample_traffic() -> Vec<Vec<u8>> {
    let mut pump = Pump::new(Duration::from_millis(1));
    let sa = addr("10.0.0.2:443");
    let l = pump.b.listen(sa, 4, ConnectionConfig::default()).unwrap();
    let c = pump
        .a
        .connect(
            pump.now,
            addr("10.0.0.1:1000"),
            sa,
            ConnectionConfig::default(),
        )
        .unwrap();
    let mut packets = Vec::new();
    let mut wrote = false;
    pump.run(
        Duration::from_secs(5),
        |_, _, p| {
            packets.push(p.build());
            false
        },
        |a, b, _| {
            while let Some(ev) = b.poll_event() {
                if let squarepeg_tcp::Event::Incoming(_) = ev {
                    b.accept(l);
                }
            }
            if !wrote && a.write(c, &[7u8; 5000]).is_ok() {
                wrote = true;
            }
            false
        },
    );
    packets
}

fn established_server() -> (Endpoint, Instant) {
    let now = Instant::now();
    let ep = Endpoint::new(
        {
            let mut config = EndpointConfig::default();
            config.verify_checksums = false;
            config
        },
        now,
    );
    (ep, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let (mut ep, now) = established_server();
        ep.listen(addr("10.0.0.2:443"), 4, ConnectionConfig::default()).unwrap();
        let _ = ep.handle_packet(now, &bytes);
        let mut buf = [0u8; 2000];
        while ep.poll_transmit(now, &mut buf).is_some() {}
    }

    #[test]
    fn random_ipv4_tcp_never_panics(
        header in proptest::collection::vec(any::<u8>(), 20..80),
        flags in any::<u8>(),
    ) {
        let (mut ep, now) = established_server();
        ep.listen(addr("10.0.0.2:443"), 4, ConnectionConfig::default()).unwrap();
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        p.extend_from_slice(&header);
        let n = p.len() as u16;
        p[2..4].copy_from_slice(&n.to_be_bytes());
        p[22] = 0x01; p[23] = 0xbb; // dst port 443
        p[33] = flags;
        let _ = ep.handle_packet(now, &p);
        let mut buf = [0u8; 2000];
        while ep.poll_transmit(now, &mut buf).is_some() {}
        ep.handle_timeout(now + Duration::from_secs(100));
    }
}

#[test]
fn mutated_traffic_never_panics() {
    // Replays real traffic into fresh endpoints with bytes mutated (checksums off, so the
    // mutations reach the state machine).
    let packets = sample_traffic();
    assert!(packets.len() > 5);
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..300 {
        let (mut ep, mut now) = established_server();
        ep.listen(addr("10.0.0.2:443"), 4, ConnectionConfig::default())
            .unwrap();
        let mut client = Endpoint::new(
            {
                let mut config = EndpointConfig::default();
                config.verify_checksums = false;
                config
            },
            now,
        );
        let _ = client.connect(
            now,
            addr("10.0.0.1:1000"),
            addr("10.0.0.2:443"),
            ConnectionConfig::default(),
        );
        for p in &packets {
            let mut q = p.clone();
            let flips = (next() % 4) as usize;
            for _ in 0..flips {
                let i = (next() as usize) % q.len();
                q[i] = next() as u8;
            }
            if round % 7 == 0 {
                q.truncate((next() as usize) % (q.len() + 1));
            }
            let _ = ep.handle_packet(now, &q);
            let _ = client.handle_packet(now, &q);
            now += Duration::from_millis(next() % 300);
            ep.handle_timeout(now);
            client.handle_timeout(now);
            let mut buf = [0u8; 2000];
            while ep.poll_transmit(now, &mut buf).is_some() {}
            while client.poll_transmit(now, &mut buf).is_some() {}
        }
    }
}
