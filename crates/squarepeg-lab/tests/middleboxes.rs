//! Middlebox transforms: each visibly acts, every output packet parses with valid checksums
//! (checked with etherparse, independently of the lab's checksum code), and byte streams are
//! preserved where they must be.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TcpHeader, TransportSlice};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use squarepeg_lab::Direction;
use squarepeg_lab::middlebox::{
    DirectionFilter, Emit, ForgeConfig, Forger, Middlebox, MiddleboxChain, OptionStripper,
    ResegmentConfig, Resegmenter, RetransmitCache, RetransmitCacheConfig, SeqRewriteConfig,
    SeqRewriter, StripMode, StripOptionsConfig, WindowMode, WindowRewriteConfig, WindowRewriter,
};
use squarepeg_lab::pcap::PcapWriter;

const L2R: Direction = Direction::LeftToRight;
const R2L: Direction = Direction::RightToLeft;
const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
const RST: u8 = 0x04;

/// A TCP segment to build.
#[derive(Clone)]
struct Seg {
    v6: bool,
    dir: Direction,
    seq: u32,
    ack: Option<u32>,
    flags: u8,
    window: u16,
    options: Vec<u8>,
    payload: Vec<u8>,
    ip_id: u16,
}

impl Seg {
    fn new(dir: Direction, seq: u32, payload: &[u8]) -> Self {
        Self {
            v6: false,
            dir,
            seq,
            ack: None,
            flags: 0,
            window: 65_535,
            options: Vec::new(),
            payload: payload.to_vec(),
            ip_id: 1,
        }
    }

    fn build(&self) -> Vec<u8> {
        let (client, server) = (40_000u16, 443u16);
        let (sport, dport) = match self.dir {
            Direction::LeftToRight => (client, server),
            Direction::RightToLeft => (server, client),
        };
        let mut tcp = TcpHeader::new(sport, dport, self.seq, self.window);
        tcp.syn = self.flags & SYN != 0;
        tcp.fin = self.flags & FIN != 0;
        tcp.psh = self.flags & PSH != 0;
        tcp.rst = self.flags & RST != 0;
        if let Some(ack) = self.ack {
            tcp.ack = true;
            tcp.acknowledgment_number = ack;
        }
        tcp.set_options_raw(&self.options).expect("options fit");
        let mut out = Vec::new();
        if self.v6 {
            let a = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
            let b = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
            let (src, dst) = if self.dir == L2R { (a, b) } else { (b, a) };
            PacketBuilder::ipv6(src, dst, 64)
                .tcp_header(tcp)
                .write(&mut out, &self.payload)
                .expect("build");
        } else {
            let (a, b) = ([10, 0, 0, 1], [10, 0, 0, 2]);
            let (src, dst) = if self.dir == L2R { (a, b) } else { (b, a) };
            let mut ip = etherparse::Ipv4Header::new(0, 64, etherparse::IpNumber::TCP, src, dst)
                .expect("header");
            ip.identification = self.ip_id;
            ip.dont_fragment = true;
            PacketBuilder::ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
                .tcp_header(tcp)
                .write(&mut out, &self.payload)
                .expect("build");
        }
        out
    }
}

/// A segment as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parsed {
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    options: Vec<u8>,
    payload: Vec<u8>,
    ip_id: Option<u16>,
    from_client: bool,
}

/// Parses a packet with etherparse and asserts that it is a well-formed TCP/IP packet whose
/// IPv4 header checksum and TCP checksum are right.
fn valid(packet: &[u8]) -> Parsed {
    let sliced = SlicedPacket::from_ip(packet).expect("parses as IP");
    let Some(TransportSlice::Tcp(tcp)) = &sliced.transport else {
        panic!("not TCP");
    };
    let (expected, ip_id) = match &sliced.net {
        Some(NetSlice::Ipv4(ip)) => {
            let header = ip.header();
            assert_eq!(
                header.to_header().calc_header_checksum(),
                header.header_checksum(),
                "IPv4 header checksum"
            );
            assert_eq!(
                usize::from(header.total_len()),
                packet.len(),
                "IPv4 total length"
            );
            (
                tcp.calc_checksum_ipv4(header.source(), header.destination())
                    .expect("sum"),
                Some(header.identification()),
            )
        }
        Some(NetSlice::Ipv6(ip)) => {
            let header = ip.header();
            assert_eq!(
                usize::from(header.payload_length()) + 40,
                packet.len(),
                "IPv6 length"
            );
            (
                tcp.calc_checksum_ipv6(header.source(), header.destination())
                    .expect("sum"),
                None,
            )
        }
        _ => panic!("no IP header"),
    };
    assert_eq!(tcp.checksum(), expected, "TCP checksum");
    let flags = packet[packet.len() - tcp.slice().len() + 13];
    Parsed {
        seq: tcp.sequence_number(),
        ack: tcp.acknowledgment_number(),
        flags,
        window: tcp.window_size(),
        options: tcp.options().to_vec(),
        payload: tcp.payload().to_vec(),
        ip_id,
        from_client: tcp.source_port() == 40_000,
    }
}

/// A packet offered to a middlebox: when, which way, the bytes.
type Input = (Instant, Direction, Vec<u8>);

/// Feeds packets through a middlebox at their times, running its timers in between and at the
/// end, and returns everything it emitted in order.
fn drive(middlebox: &mut dyn Middlebox, inputs: Vec<Input>) -> Vec<Emit> {
    let mut out = Vec::new();
    for (at, dir, packet) in inputs {
        while let Some(t) = middlebox.poll_timeout().filter(|&t| t <= at) {
            middlebox.handle_timeout(t, &mut out);
        }
        middlebox.process(at, dir, packet, &mut out);
    }
    while let Some(t) = middlebox.poll_timeout() {
        middlebox.handle_timeout(t, &mut out);
    }
    out
}

/// One packet through a box that emits exactly one packet at once; the output, validated.
fn through(box_: &mut dyn Middlebox, dir: Direction, packet: Vec<u8>) -> Parsed {
    let mut out = Vec::new();
    box_.process(Instant::now(), dir, packet, &mut out);
    assert_eq!(out.len(), 1, "{}", box_.name());
    assert_eq!(out[0].dir, dir);
    valid(&out[0].packet)
}

/// Reassembles the payload of one direction by sequence number, asserting that overlapping
/// bytes agree; returns the bytes from `first_seq` on.
fn reassemble(segments: &[Parsed], first_seq: u32) -> Vec<u8> {
    let mut bytes: BTreeMap<u32, u8> = BTreeMap::new();
    for s in segments {
        let data_seq = s.seq.wrapping_add(u32::from(s.flags & SYN != 0));
        for (i, b) in s.payload.iter().enumerate() {
            let offset = data_seq.wrapping_sub(first_seq).wrapping_add(i as u32);
            if let Some(old) = bytes.insert(offset, *b) {
                assert_eq!(
                    old,
                    *b,
                    "conflicting bytes at offset {offset} (segment seq {}, {} bytes)",
                    s.seq,
                    s.payload.len()
                );
            }
        }
    }
    assert!(
        bytes.keys().copied().eq(0..bytes.len() as u32),
        "gap in the stream"
    );
    bytes.into_values().collect()
}

fn random_bytes(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// Timestamps option, aligned with two NOPs: 12 bytes.
fn timestamps(tsval: u32, tsecr: u32) -> Vec<u8> {
    let mut o = vec![1, 1, 8, 10];
    o.extend_from_slice(&tsval.to_be_bytes());
    o.extend_from_slice(&tsecr.to_be_bytes());
    o
}

/// A one-way stream of `n` data segments of random sizes, 1 ms apart, ending with FIN.
fn stream(v6: bool, n: usize, seed: u64) -> (Vec<Input>, Vec<u8>, u32) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let t0 = Instant::now();
    let isn = 0xFFFF_F000; // wraps during the stream
    let mut seq = isn;
    let mut data = Vec::new();
    let mut packets = Vec::new();
    for i in 0..n {
        let len = 1 + (rng.next_u32() % 1200) as usize;
        let payload = random_bytes(&mut rng, len);
        let mut seg = Seg::new(L2R, seq, &payload);
        seg.v6 = v6;
        seg.ack = Some(7);
        seg.flags = if i + 1 == n { PSH | FIN } else { 0 };
        seg.options = timestamps(i as u32, 3);
        seg.ip_id = i as u16;
        packets.push((t0 + Duration::from_millis(i as u64), L2R, seg.build()));
        data.extend_from_slice(&payload);
        seq = seq.wrapping_add(len as u32);
    }
    (packets, data, isn)
}

#[test]
fn splitting_keeps_the_stream_and_every_packet_valid() {
    for v6 in [false, true] {
        let (inputs, data, isn) = stream(v6, 300, 1);
        let mut box_ = Resegmenter::new(ResegmentConfig {
            seed: 5,
            split_probability: 1.0,
            max_pieces: 4,
            coalesce: false,
            ..ResegmentConfig::default()
        });
        let out = drive(&mut box_, inputs);
        let parsed: Vec<Parsed> = out.iter().map(|e| valid(&e.packet)).collect();
        let stats = box_.stats();
        assert_eq!(stats.segments_split, 300, "every segment of 2+ bytes split");
        assert_eq!(parsed.len() as u64, stats.pieces);
        assert!(stats.pieces >= 600 && stats.pieces <= 1200);
        assert_eq!(reassemble(&parsed, isn), data);
        // Pieces come out in stream order, each with the original's options; FIN and PSH only
        // on the very last piece.
        assert!(
            parsed
                .windows(2)
                .all(|w| w[1].seq == w[0].seq.wrapping_add(w[0].payload.len() as u32))
        );
        assert!(
            parsed
                .iter()
                .all(|p| p.options.len() == 12 && p.options[2] == 8)
        );
        let with_fin: Vec<usize> = (0..parsed.len())
            .filter(|&i| parsed[i].flags & FIN != 0)
            .collect();
        assert_eq!(with_fin, vec![parsed.len() - 1]);
        assert_eq!(parsed.iter().filter(|p| p.flags & PSH != 0).count(), 1);
        if !v6 {
            // Pieces after the first take the next IP identifications.
            assert_eq!(parsed[1].ip_id, parsed[0].ip_id.map(|id| id + 1));
        }
    }
}

#[test]
fn coalescing_merges_adjacent_segments_and_never_reorders() {
    let t0 = Instant::now();
    let mut box_ = Resegmenter::new(ResegmentConfig {
        split_probability: 0.0,
        coalesce: true,
        coalesce_hold: Duration::from_millis(5),
        coalesce_max_packet: 1500,
        ..ResegmentConfig::default()
    });
    let mut inputs = Vec::new();
    let mut data = Vec::new();
    for i in 0..10u32 {
        let payload = vec![b'a' + i as u8; 100];
        let mut seg = Seg::new(L2R, 1000 + 100 * i, &payload);
        seg.ack = Some(50 + i);
        seg.flags = if i == 3 { PSH } else { 0 };
        inputs.push((
            t0 + Duration::from_micros(100 * u64::from(i)),
            L2R,
            seg.build(),
        ));
        data.extend_from_slice(&payload);
    }
    // The other direction is not held back by this flow.
    let reverse = Seg {
        ack: Some(1000),
        ..Seg::new(R2L, 50, b"")
    }
    .build();
    inputs.push((t0 + Duration::from_micros(1000), R2L, reverse.clone()));
    let out = drive(&mut box_, inputs);
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].packet, reverse);
    let merged = valid(&out[1].packet);
    assert_eq!(
        out[1].at,
        t0 + Duration::from_millis(5),
        "released when the hold expires"
    );
    assert_eq!(merged.seq, 1000);
    assert_eq!(merged.payload, data);
    assert_eq!(merged.ack, 59, "the latest acknowledgment");
    assert_ne!(merged.flags & PSH, 0, "PSH kept");
    assert_eq!(box_.stats().segments_coalesced, 9);

    // A gap, a size limit and a pure ACK each release what is held, in order.
    let mut box_ = Resegmenter::new(ResegmentConfig {
        split_probability: 0.0,
        coalesce_hold: Duration::from_millis(5),
        coalesce_max_packet: 300,
        ..ResegmentConfig::default()
    });
    let seg = |seq: u32, len: usize| {
        (
            t0,
            L2R,
            Seg {
                ack: Some(1),
                ..Seg::new(L2R, seq, &vec![7u8; len])
            }
            .build(),
        )
    };
    let pure_ack = (
        t0,
        L2R,
        Seg {
            ack: Some(2),
            ..Seg::new(L2R, 600, b"")
        }
        .build(),
    );
    let out = drive(
        &mut box_,
        vec![
            seg(0, 100),
            seg(200, 100),
            seg(300, 100),
            seg(400, 200),
            pure_ack,
        ],
    );
    let parsed: Vec<(u32, usize)> = out
        .iter()
        .map(|e| valid(&e.packet))
        .map(|p| (p.seq, p.payload.len()))
        .collect();
    assert_eq!(parsed, vec![(0, 100), (200, 200), (400, 200), (600, 0)]);
    assert!(out.iter().all(|e| e.at == t0));
}

#[test]
fn resegmenting_both_ways_preserves_the_stream() {
    for v6 in [false, true] {
        let (inputs, data, isn) = stream(v6, 400, 2);
        let mut box_ = Resegmenter::new(ResegmentConfig {
            seed: 9,
            split_probability: 0.4,
            max_pieces: 5,
            coalesce: true,
            coalesce_hold: Duration::from_millis(3),
            coalesce_max_packet: 1500,
            ..ResegmentConfig::default()
        });
        let out = drive(&mut box_, inputs);
        let parsed: Vec<Parsed> = out.iter().map(|e| valid(&e.packet)).collect();
        assert_eq!(reassemble(&parsed, isn), data);
        assert!(
            parsed
                .windows(2)
                .all(|w| w[1].seq == w[0].seq.wrapping_add(w[0].payload.len() as u32))
        );
        let stats = box_.stats();
        assert!(
            stats.segments_split > 50 && stats.segments_coalesced > 50,
            "{stats:?}"
        );
        assert!(
            parsed
                .iter()
                .all(|p| p.payload.len() + if v6 { 72 } else { 52 } <= 1500)
        );
    }
}

#[test]
fn corrupt_and_non_tcp_packets_pass_unchanged() {
    let t0 = Instant::now();
    let mut corrupt = Seg::new(L2R, 1, b"payload").build();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xFF;
    let mut udp = Vec::new();
    PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .udp(1, 2)
        .write(&mut udp, b"datagram")
        .expect("build");
    let mut boxes: Vec<Box<dyn Middlebox>> = vec![
        Box::new(Resegmenter::new(ResegmentConfig {
            split_probability: 1.0,
            ..ResegmentConfig::default()
        })),
        Box::new(RetransmitCache::new(RetransmitCacheConfig::default())),
        Box::new(OptionStripper::new(StripOptionsConfig::default())),
        Box::new(SeqRewriter::new(SeqRewriteConfig::default())),
        Box::new(WindowRewriter::new(WindowRewriteConfig {
            directions: DirectionFilter::Both,
            mode: WindowMode::Fixed(1),
        })),
    ];
    for box_ in &mut boxes {
        for packet in [&udp, &b"\x45garbage".to_vec()] {
            let mut out = Vec::new();
            box_.process(t0, L2R, packet.clone(), &mut out);
            assert_eq!(
                out,
                vec![Emit {
                    at: t0,
                    dir: L2R,
                    packet: packet.clone()
                }],
                "{}",
                box_.name()
            );
        }
    }
    let mut out = Vec::new();
    boxes[0].process(t0, L2R, corrupt.clone(), &mut out);
    assert_eq!(out[0].packet, corrupt, "a corrupt segment is not laundered");
}

#[test]
fn retransmission_cache_returns_the_original_bytes() {
    let mut cache = RetransmitCache::new(RetransmitCacheConfig::default());
    let data = |seq: u32, payload: &[u8]| {
        let mut s = Seg::new(L2R, seq, payload);
        s.ack = Some(1);
        s.build()
    };
    let run = |cache: &mut RetransmitCache, packet: Vec<u8>, dir| through(cache, dir, packet);
    assert_eq!(
        run(&mut cache, data(1000, b"hello world"), L2R).payload,
        b"hello world"
    );
    // A consistent retransmission passes as it is.
    assert_eq!(
        run(&mut cache, data(1000, b"hello world"), L2R).payload,
        b"hello world"
    );
    // An inconsistent retransmission (Hollywood §4) gets the original bytes back.
    assert_eq!(
        run(&mut cache, data(1000, b"HELLO WORLD"), L2R).payload,
        b"hello world"
    );
    // Partly overlapping: the seen part restored, the new part kept (and remembered).
    assert_eq!(
        run(&mut cache, data(1005, b"XXXXXXXXXXXXXXX"), L2R).payload,
        b" worldXXXXXXXXX"
    );
    assert_eq!(
        run(&mut cache, data(1011, b"yyyyyyyyy"), L2R).payload,
        b"XXXXXXXXX"
    );
    let stats = cache.stats();
    assert_eq!(stats.segments_rewritten, 3);
    assert_eq!(stats.bytes_restored, 10 + 6 + 9);
    // The receiver acknowledges up to 1015: that part is forgotten, the rest is not.
    let ack = Seg {
        ack: Some(1015),
        ..Seg::new(R2L, 1, b"")
    }
    .build();
    run(&mut cache, ack, R2L);
    assert_eq!(cache.stats().bytes_evicted_acked, 15);
    assert_eq!(
        run(&mut cache, data(1000, b"HELLO WORLD"), L2R).payload,
        b"HELLO WORLD"
    );
    assert_eq!(run(&mut cache, data(1015, b"zzzzz"), L2R).payload, b"XXXXX");
    // Data on a SYN (TFO) starts one after the SYN's sequence number.
    let mut syn = Seg::new(R2L, 5000, b"early");
    syn.flags = SYN;
    run(&mut cache, syn.build(), R2L);
    assert_eq!(
        run(&mut cache, Seg::new(R2L, 5001, b"EARLY").build(), R2L).payload,
        b"early"
    );
    // A RST forgets the connection.
    run(
        &mut cache,
        Seg {
            flags: RST,
            ..Seg::new(R2L, 5006, b"")
        }
        .build(),
        R2L,
    );
    assert_eq!(
        run(&mut cache, Seg::new(R2L, 5001, b"EARLY").build(), R2L).payload,
        b"EARLY"
    );
}

#[test]
fn forger_injects_flips_and_splices_valid_packets() {
    // Records of a TLS stream: header 17 03 03 len, then the body.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut stream = Vec::new();
    for _ in 0..40 {
        let len = 30 + (rng.next_u32() % 500) as usize;
        stream.extend_from_slice(&[0x17, 0x03, 0x03]);
        stream.extend_from_slice(&(len as u16).to_be_bytes());
        stream.extend(random_bytes(&mut rng, len));
    }
    let mut forger = Forger::new(ForgeConfig {
        seed: 5,
        directions: DirectionFilter::LeftToRight,
        inject: 0.3,
        flip: 1.0,
        splice: 0.2,
        span: 2000,
        ..ForgeConfig::default()
    });
    let isn = 10_000u32;
    let segs: Vec<(u32, &[u8])> = stream
        .chunks(700)
        .enumerate()
        .map(|(i, c)| (isn.wrapping_add(700 * i as u32), c))
        .collect();
    let mut out = Vec::new();
    // Everything once, then everything again (retransmissions).
    for (seq, payload) in segs.iter().chain(segs.iter()) {
        forger.process(
            Instant::now(),
            L2R,
            Seg::new(L2R, *seq, payload).build(),
            &mut out,
        );
    }
    // The other direction passes untouched.
    let back = Seg::new(R2L, 77, b"reply").build();
    forger.process(Instant::now(), R2L, back.clone(), &mut out);
    assert_eq!(out.last().unwrap().packet, back);
    let stats = forger.stats();
    assert!(
        stats.injected > 0 && stats.spliced > 0 && stats.flipped > 0,
        "{stats:?}"
    );
    let (mut genuine, mut injected, mut spliced, mut flipped) = (0u64, 0u64, 0u64, 0u64);
    let is_record_copy = |payload: &[u8]| {
        payload.starts_with(&[0x17, 0x03, 0x03])
            && stream.windows(payload.len()).any(|w| w == payload)
    };
    for emit in &out[..out.len() - 1] {
        let p = valid(&emit.packet);
        let offset = p.seq.wrapping_sub(isn) as usize;
        let original = stream.get(offset..offset + p.payload.len());
        let bits = original.map(|o| {
            o.iter()
                .zip(&p.payload)
                .map(|(a, b)| (a ^ b).count_ones())
                .sum::<u32>()
        });
        if bits == Some(0) {
            genuine += 1;
        } else if bits == Some(1) {
            flipped += 1;
        } else if offset.is_multiple_of(700) && is_record_copy(&p.payload) {
            // An earlier record at a segment's place.
            spliced += 1;
        } else {
            assert!(
                p.payload.starts_with(&[0x17, 0x03, 0x03]),
                "a fake record header"
            );
            injected += 1;
        }
    }
    assert_eq!(injected, stats.injected);
    assert_eq!(flipped, stats.flipped);
    // A spliced record may be the one that was there (a retransmission of the same range).
    assert!(spliced <= stats.spliced);
    assert_eq!(genuine + flipped + spliced, 2 * segs.len() as u64);
    assert!(
        stats.flipped as usize <= segs.len(),
        "only retransmissions are flipped"
    );
}

#[test]
fn retransmission_cache_is_bounded() {
    let mut cache = RetransmitCache::new(RetransmitCacheConfig {
        max_bytes_per_flow: 150,
        max_flows: 1,
        idle_timeout: Duration::from_secs(60),
        ..RetransmitCacheConfig::default()
    });
    let run = |cache: &mut RetransmitCache, seg: Seg| through(cache, seg.dir, seg.build()).payload;
    for i in 0..3u32 {
        run(&mut cache, Seg::new(L2R, 100 * i, &[b'a' + i as u8; 100]));
    }
    // Only the last 150 bytes are remembered.
    assert_eq!(
        run(&mut cache, Seg::new(L2R, 0, &[b'X'; 100])),
        vec![b'X'; 100]
    );
    assert_eq!(
        run(&mut cache, Seg::new(L2R, 200, &[b'X'; 100])),
        vec![b'c'; 100]
    );
    let stats = cache.stats();
    assert_eq!(stats.bytes_evicted_overflow, 250, "{stats:?}");
    // A second flow does not fit in a table of one.
    run(&mut cache, Seg::new(R2L, 0, b"other"));
    assert_eq!(cache.stats().flows_untracked, 1);
}

fn syn_options_with_unknown() -> Vec<u8> {
    let mut o = vec![2, 4, 0x05, 0xb4]; // MSS 1460
    o.extend_from_slice(&[4, 2]); // SACK permitted
    o.extend_from_slice(&[8, 10, 0, 0, 0, 1, 0, 0, 0, 0]); // timestamps
    o.extend_from_slice(&[3, 3, 7]); // window scale
    o.extend_from_slice(&[30, 12, 0, 0x81, 1, 2, 3, 4, 5, 6, 7, 8]); // MPTCP MP_CAPABLE
    o.push(1); // NOP to 32 bytes
    o
}

#[test]
fn option_stripping_with_nops() {
    let t0 = Instant::now();
    let mut syn = Seg::new(L2R, 1, b"");
    syn.flags = SYN;
    syn.options = syn_options_with_unknown();
    let mut stripper = OptionStripper::new(StripOptionsConfig::default());
    let mut out = Vec::new();
    stripper.process(t0, L2R, syn.build(), &mut out);
    let p = valid(&out[0].packet);
    assert_eq!(p.options.len(), 32, "header size kept");
    assert_eq!(
        &p.options[..19],
        &syn.options[..19],
        "known options untouched"
    );
    assert_eq!(
        &p.options[19..31],
        &[1; 12],
        "MPTCP option replaced by NOPs"
    );
    assert_eq!(option_kinds(&p.options), vec![2, 4, 8, 3]);
    assert_eq!(stripper.stats().options_stripped, 1);

    // Nothing to strip: byte for byte the same packet.
    let mut plain = Seg::new(L2R, 1, b"x");
    plain.options = timestamps(1, 2);
    let before = plain.build();
    out.clear();
    stripper.process(t0, L2R, before.clone(), &mut out);
    assert_eq!(out[0].packet, before);
}

#[test]
fn option_stripping_shrinks_the_header() {
    let t0 = Instant::now();
    let mut stripper = OptionStripper::new(StripOptionsConfig {
        mode: StripMode::Shrink,
        ..StripOptionsConfig::default()
    });
    for v6 in [false, true] {
        let mut seg = Seg::new(L2R, 1, b"data after options");
        seg.v6 = v6;
        seg.flags = SYN;
        seg.options = syn_options_with_unknown();
        let before = seg.build();
        let mut out = Vec::new();
        stripper.process(t0, L2R, before.clone(), &mut out);
        let p = valid(&out[0].packet);
        assert_eq!(out[0].packet.len(), before.len() - 12);
        assert_eq!(&p.options[..19], &seg.options[..19]);
        assert_eq!(p.options.len(), 20);
        assert_eq!(p.options[19], 0, "EOL padding");
        assert_eq!(p.payload, b"data after options");
    }
    // A malformed option (length past the header) is stripped with everything after it.
    let mut bad = Seg::new(L2R, 1, b"");
    bad.options = vec![2, 4, 0x05, 0xb4, 99, 50, 0, 0];
    let mut out = Vec::new();
    stripper.process(t0, L2R, bad.build(), &mut out);
    let p = valid(&out[0].packet);
    assert_eq!(p.options, vec![2, 4, 0x05, 0xb4]);
    assert_eq!(stripper.stats().malformed, 1);
}

/// The kinds of the options in an option area (EOL ends it).
fn option_kinds(options: &[u8]) -> Vec<u8> {
    let mut kinds = Vec::new();
    let mut at = 0;
    while at < options.len() {
        match options[at] {
            0 => break,
            1 => at += 1,
            kind => {
                kinds.push(kind);
                at += usize::from(options[at + 1]).max(2);
            }
        }
    }
    kinds
}

/// SACK option with the given blocks, NOP-aligned.
fn sack(blocks: &[(u32, u32)]) -> Vec<u8> {
    let mut o = vec![1, 1, 5, 2 + 8 * blocks.len() as u8];
    for (l, r) in blocks {
        o.extend_from_slice(&l.to_be_bytes());
        o.extend_from_slice(&r.to_be_bytes());
    }
    o
}

fn sack_blocks(options: &[u8]) -> Vec<(u32, u32)> {
    let at = options.iter().position(|&k| k == 5).expect("SACK option");
    let n = (usize::from(options[at + 1]) - 2) / 8;
    (0..n)
        .map(|i| {
            let b = &options[at + 2 + 8 * i..];
            (
                u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
                u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            )
        })
        .collect()
}

#[test]
fn sequence_rewriting_is_consistent_end_to_end() {
    let t0 = Instant::now();
    for v6 in [false, true] {
        let mut rewriter = SeqRewriter::new(SeqRewriteConfig {
            seed: 3,
            ..SeqRewriteConfig::default()
        });
        let mut pass = |seg: Seg| {
            let mut out = Vec::new();
            rewriter.process(t0, seg.dir, Seg { v6, ..seg }.build(), &mut out);
            valid(&out[0].packet)
        };
        // Client ISN 1000 becomes 1000 + a.
        let syn = pass(Seg {
            flags: SYN,
            ..Seg::new(L2R, 1000, b"")
        });
        let a = syn.seq.wrapping_sub(1000);
        assert_ne!(a, 0);
        // The server answers in the numbers it saw; its ISN 5000 becomes 5000 + b, and the
        // client gets its own numbers back.
        let synack = pass(Seg {
            flags: SYN,
            ack: Some(syn.seq.wrapping_add(1)),
            ..Seg::new(R2L, 5000, b"")
        });
        let b = synack.seq.wrapping_sub(5000);
        assert_ne!(b, 0);
        assert_ne!(a, b);
        assert_eq!(synack.ack, 1001);
        let data = pass(Seg {
            ack: Some(synack.seq.wrapping_add(1)),
            ..Seg::new(L2R, 1001, &[1; 300])
        });
        assert_eq!(data.seq, 1001u32.wrapping_add(a));
        assert_eq!(data.ack, 5001);
        // The server SACKs bytes 100..300 in its numbering; the client sees its own.
        let sacked = pass(Seg {
            ack: Some(data.seq),
            options: sack(&[(data.seq.wrapping_add(100), data.seq.wrapping_add(300))]),
            ..Seg::new(R2L, 5001, b"")
        });
        assert_eq!(sacked.ack, 1001);
        assert_eq!(sack_blocks(&sacked.options), vec![(1101, 1301)]);
        assert_eq!(rewriter.stats().sack_blocks_rewritten, 1);
    }

    // A box that forgets SACK blocks (rewrite_sack = false) hands the client numbers it never
    // sent; a flow whose handshake the box never saw is left alone.
    let mut broken = SeqRewriter::new(SeqRewriteConfig {
        rewrite_sack: false,
        directions: DirectionFilter::LeftToRight,
        ..SeqRewriteConfig::default()
    });
    let mut pass = |seg: Seg| {
        let mut out = Vec::new();
        broken.process(t0, seg.dir, seg.build(), &mut out);
        valid(&out[0].packet)
    };
    let syn = pass(Seg {
        flags: SYN,
        ..Seg::new(L2R, 1000, b"")
    });
    let synack = pass(Seg {
        flags: SYN,
        ack: Some(syn.seq.wrapping_add(1)),
        ..Seg::new(R2L, 5000, b"")
    });
    assert_eq!(synack.seq, 5000, "right-to-left not shifted");
    let sacked = pass(Seg {
        ack: Some(syn.seq.wrapping_add(1)),
        options: sack(&[(syn.seq.wrapping_add(101), syn.seq.wrapping_add(201))]),
        ..Seg::new(R2L, 5001, b"")
    });
    assert_eq!(sacked.ack, 1001);
    assert_eq!(
        sack_blocks(&sacked.options),
        vec![(syn.seq.wrapping_add(101), syn.seq.wrapping_add(201))]
    );
    let mut unknown = Seg::new(L2R, 77, b"mid-connection");
    unknown.ack = Some(5);
    let mut out = Vec::new();
    let mut fresh = SeqRewriter::new(SeqRewriteConfig::default());
    fresh.process(t0, L2R, unknown.build(), &mut out);
    assert_eq!(out[0].packet, unknown.build());
}

#[test]
fn window_rewriting() {
    let t0 = Instant::now();
    let mut cap = WindowRewriter::new(WindowRewriteConfig {
        directions: DirectionFilter::RightToLeft,
        mode: WindowMode::Cap(1000),
    });
    let mut fixed = WindowRewriter::new(WindowRewriteConfig {
        directions: DirectionFilter::Both,
        mode: WindowMode::Fixed(7),
    });
    let window = |box_: &mut WindowRewriter, dir, w: u16| {
        let mut out = Vec::new();
        box_.process(
            t0,
            dir,
            Seg {
                window: w,
                ack: Some(1),
                ..Seg::new(dir, 1, b"abc")
            }
            .build(),
            &mut out,
        );
        valid(&out[0].packet).window
    };
    assert_eq!(window(&mut cap, R2L, 65_535), 1000);
    assert_eq!(window(&mut cap, R2L, 500), 500);
    assert_eq!(
        window(&mut cap, L2R, 65_535),
        65_535,
        "other direction untouched"
    );
    assert_eq!(cap.stats().segments_rewritten, 1);
    assert_eq!(window(&mut fixed, L2R, 65_535), 7);
    assert_eq!(window(&mut fixed, R2L, 3), 7);
}

/// A whole connection through every transform at once: handshake, data both ways with losses
/// retransmitted inconsistently, SACKs, FINs. Every packet out is valid and each receiver's
/// stream is exactly what was first sent.
#[test]
fn chain_of_every_transform_keeps_packets_valid_and_streams_intact() {
    for v6 in [false, true] {
        let mut chain = MiddleboxChain::new();
        chain.push(Box::new(SeqRewriter::new(SeqRewriteConfig {
            seed: 1,
            ..SeqRewriteConfig::default()
        })));
        chain.push(Box::new(OptionStripper::new(StripOptionsConfig {
            mode: StripMode::Shrink,
            ..StripOptionsConfig::default()
        })));
        chain.push(Box::new(RetransmitCache::new(
            RetransmitCacheConfig::default(),
        )));
        chain.push(Box::new(Resegmenter::new(ResegmentConfig {
            seed: 2,
            split_probability: 0.3,
            ..ResegmentConfig::default()
        })));
        chain.push(Box::new(WindowRewriter::new(WindowRewriteConfig {
            directions: DirectionFilter::Both,
            mode: WindowMode::Cap(20_000),
        })));

        let mut rng = ChaCha8Rng::seed_from_u64(v6 as u64);
        let t0 = Instant::now();
        let mut sent = [Vec::new(), Vec::new()];
        let isn = [0x7FFF_FF00u32, 0xFFFF_FFF0u32];
        let mut time = t0;
        let mut tick = |inputs: &mut Vec<_>, dir, seg: Seg| {
            time += Duration::from_micros(300);
            inputs.push((time, dir, Seg { v6, ..seg }.build()));
        };
        // The handshake first, to learn the offsets the rewriter chose: each endpoint then
        // acknowledges (and SACKs) in the numbers it sees.
        let mut inputs = Vec::new();
        tick(
            &mut inputs,
            L2R,
            Seg {
                flags: SYN,
                options: syn_options_with_unknown(),
                ..Seg::new(L2R, isn[0], b"")
            },
        );
        let mut out = drive(&mut chain, inputs);
        let client_syn = valid(&out[0].packet);
        let seen_by_server = client_syn.seq.wrapping_sub(isn[0]);
        let mut inputs = Vec::new();
        tick(
            &mut inputs,
            R2L,
            Seg {
                flags: SYN,
                ack: Some(client_syn.seq.wrapping_add(1)),
                options: timestamps(0, 0),
                ..Seg::new(R2L, isn[1], b"")
            },
        );
        out.extend(drive(&mut chain, inputs));
        let server_syn = valid(&out[1].packet);
        assert_eq!(server_syn.ack, isn[0].wrapping_add(1));
        // How the far end sees each side's sequence numbers.
        let view = [seen_by_server, server_syn.seq.wrapping_sub(isn[1])];
        let mut next = [isn[0].wrapping_add(1), isn[1].wrapping_add(1)];
        // Acknowledgments lag ten rounds behind, so that no range is acknowledged (and
        // forgotten by the cache) before its retransmission has passed.
        let mut history = vec![next];
        let acked = |history: &Vec<[u32; 2]>, round: usize, d: usize| {
            history[round.saturating_sub(10)][d].wrapping_add(view[d])
        };
        let mut inputs = Vec::new();
        for round in 0..200usize {
            let dir = if round % 3 == 0 { R2L } else { L2R };
            let d = dir.index();
            let len = 1 + (rng.next_u32() % 1300) as usize;
            let payload = random_bytes(&mut rng, len);
            let seg = Seg {
                ack: Some(acked(&history, round, 1 - d)),
                options: timestamps(round as u32, round as u32),
                ..Seg::new(dir, next[d], &payload)
            };
            tick(&mut inputs, dir, seg.clone());
            if round % 7 == 0 {
                // An inconsistent retransmission of the same range: the cache must restore it.
                let other = random_bytes(&mut rng, len);
                tick(
                    &mut inputs,
                    dir,
                    Seg {
                        payload: other,
                        ..seg
                    },
                );
            }
            sent[d].extend_from_slice(&payload);
            next[d] = next[d].wrapping_add(len as u32);
            history.push(next);
            if round % 11 == 0 {
                // The receiver SACKs most of the new segment.
                let back = dir.reverse();
                let from = next[d].wrapping_sub(len as u32).wrapping_add(view[d]);
                let to = next[d].wrapping_add(view[d]);
                tick(
                    &mut inputs,
                    back,
                    Seg {
                        ack: Some(acked(&history, round, d)),
                        options: sack(&[(from.wrapping_add(1), to)]),
                        ..Seg::new(back, next[back.index()], b"")
                    },
                );
            }
        }
        for dir in [L2R, R2L] {
            let d = dir.index();
            let ack = next[1 - d].wrapping_add(view[1 - d]);
            tick(
                &mut inputs,
                dir,
                Seg {
                    flags: FIN,
                    ack: Some(ack),
                    ..Seg::new(dir, next[d], b"")
                },
            );
        }
        out.extend(drive(&mut chain, inputs));

        let parsed: Vec<Parsed> = out.iter().map(|e| valid(&e.packet)).collect();
        for dir in [L2R, R2L] {
            let segments: Vec<Parsed> = parsed
                .iter()
                .filter(|p| p.from_client == (dir == L2R))
                .cloned()
                .collect();
            // The receiver's ISN is the (rewritten) one on the SYN it got.
            let syn = segments.iter().find(|p| p.flags & SYN != 0).expect("SYN");
            assert_eq!(
                reassemble(&segments, syn.seq.wrapping_add(1)),
                sent[dir.index()],
                "v6 {v6} {dir:?}"
            );
            assert!(segments.iter().all(|p| p.window <= 20_000));
            assert!(
                segments
                    .iter()
                    .all(|p| !option_kinds(&p.options).contains(&30))
            );
        }
        // tshark agrees: every TCP checksum good, nothing malformed.
        let dir = common::TempDir::new(if v6 { "chain6" } else { "chain4" });
        let path = dir.0.join("chain.pcap");
        let mut writer =
            PcapWriter::new(std::fs::File::create(&path).expect("create")).expect("pcap");
        for emit in &out {
            writer
                .write_packet(emit.at - t0, &emit.packet)
                .expect("write");
        }
        writer.into_inner().expect("flush");
        let fields = [
            "-o",
            "tcp.check_checksum:TRUE",
            "-T",
            "fields",
            "-e",
            "tcp.checksum.status",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
        ];
        if let Some(lines) = common::tshark(&path, &fields) {
            assert_eq!(lines.len(), out.len());
            for line in &lines {
                let mut columns = line.split('\t');
                assert_eq!(columns.next(), Some("1"), "checksum status: {line}");
                assert_eq!(columns.next(), Some(""), "malformed: {line}");
            }
        }
        let counters: BTreeMap<&str, u64> = chain.counters().into_iter().collect();
        for key in [
            "seq_segments_rewritten",
            "strip_options_stripped",
            "cache_segments_rewritten",
            "resegment_segments_split",
            "resegment_segments_coalesced",
            "window_segments_rewritten",
        ] {
            assert!(counters[key] > 0, "{key}: {counters:?}");
        }
    }
}

fn every_box() -> MiddleboxChain {
    let mut chain = MiddleboxChain::new();
    chain.push(Box::new(SeqRewriter::new(SeqRewriteConfig::default())));
    chain.push(Box::new(OptionStripper::new(StripOptionsConfig {
        mode: StripMode::Shrink,
        allowed: vec![2, 8],
        ..StripOptionsConfig::default()
    })));
    chain.push(Box::new(RetransmitCache::new(
        RetransmitCacheConfig::default(),
    )));
    chain.push(Box::new(Resegmenter::new(ResegmentConfig {
        split_probability: 0.7,
        max_pieces: 6,
        ..ResegmentConfig::default()
    })));
    chain.push(Box::new(WindowRewriter::new(WindowRewriteConfig {
        directions: DirectionFilter::Both,
        mode: WindowMode::Cap(100),
    })));
    chain
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// Valid segments of any shape come out valid; mutated and random bytes never panic.
    #[test]
    fn no_input_breaks_a_transform(
        v6 in proptest::bool::ANY,
        to_right in proptest::bool::ANY,
        seq in proptest::num::u32::ANY,
        flags in 0u8..64,
        options in proptest::collection::vec(proptest::num::u8::ANY, 0..10),
        payload in proptest::collection::vec(proptest::num::u8::ANY, 0..1400),
        mutations in proptest::collection::vec((proptest::num::usize::ANY, proptest::num::u8::ANY), 0..6),
        garbage in proptest::collection::vec(proptest::num::u8::ANY, 0..80),
    ) {
        let dir = if to_right { L2R } else { R2L };
        let mut options = options;
        options.resize(options.len().div_ceil(4) * 4, 1);
        let seg = Seg { v6, flags, ack: Some(seq ^ 0x5555), options, ..Seg::new(dir, seq, &payload) };
        let packet = seg.build();
        let t0 = Instant::now();
        let mut chain = every_box();
        let out = drive(&mut chain, vec![(t0, dir, packet.clone())]);
        for emit in &out {
            valid(&emit.packet);
        }
        let mut mutated = packet;
        for (at, byte) in mutations {
            let len = mutated.len();
            mutated[at % len] = byte;
        }
        drive(&mut chain, vec![(t0, dir, mutated), (t0, dir, garbage)]);
    }
}
