//! The hooks later uTCP/Hollywood tasks build on: consistent segmentation, priority insertion
//! at write boundaries, squash, stream offsets.

mod common;

use common::*;
use squarepeg_tcp::{ConnectionConfig, ConnectionHandle, WriteTag};

const IRS: u32 = 500;

/// Client with writes queued before the handshake completes, so that they are sent together.
fn open_with_writes(cfg: ConnectionConfig, writes: &[&[u8]]) -> (Harness, ConnectionHandle, u32) {
    let mut h = Harness::new("192.0.2.1:40000", "198.51.100.7:80");
    let c = h.connect({
        let mut config = cfg;
        config.timestamps = false;
        config
    });
    let iss = h.out1().seq;
    for w in writes {
        assert_eq!(h.ep.write(c, w).unwrap(), w.len());
    }
    h.inject(&h.pkt(SYN | ACK, IRS, iss + 1).opt(Opt::Mss(1000)))
        .unwrap();
    (h, c, iss)
}

#[test]
fn standard_mode_packs_writes_into_full_segments() {
    let (mut h, _c, _) = open_with_writes(
        ConnectionConfig::default(),
        &[&[1; 100], &[2; 300], &[3; 1200]],
    );
    let lens: Vec<usize> = h
        .out()
        .iter()
        .map(|p| p.payload.len())
        .filter(|&n| n > 0)
        .collect();
    assert_eq!(lens, vec![1000, 600]);
}

#[test]
fn nagle_with_consistent_segmentation_sends_queued_writes_once_a_segment_is_queued() {
    // Found by the simulator (seeds 83 and 173): Nagle held every small write behind the
    // previous one, so a stream of 500-byte writes went at one write per round trip.
    let mut cfg = ConnectionConfig::default();
    cfg.consistent_segmentation = true;
    cfg.nagle = true;
    let (mut h, c, iss) = open_with_writes(cfg, &[&[1; 500]]);
    let first: Vec<usize> = h.out().iter().map(|p| p.payload.len()).collect();
    assert!(first.contains(&500), "{first:?}");
    // One small write behind unacknowledged data waits (it may still be joined by more)...
    h.ep.write(c, &[2; 400]).unwrap();
    h.none();
    // ...but once a segment's worth is queued, writes go (each in its own segment) until
    // less than a segment's worth waits, as Nagle would send the full segments.
    h.ep.write(c, &[3; 400]).unwrap();
    h.ep.write(c, &[4; 400]).unwrap();
    let sent: Vec<Pkt> = h.out();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].payload, vec![2; 400]);
    // Less than a segment's worth left: plain Nagle, one small segment per acknowledgment.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1 + 900)).unwrap();
    assert_eq!(h.out1().payload, vec![3; 400]);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1 + 1300)).unwrap();
    assert_eq!(h.out1().payload, vec![4; 400]);
}

#[test]
fn consistent_segmentation_starts_each_write_in_a_new_segment() {
    let mut cfg = ConnectionConfig::default();
    cfg.consistent_segmentation = true;
    let (mut h, _c, _) = open_with_writes(cfg, &[&[1; 100], &[2; 300], &[3; 1200]]);
    let segs: Vec<Pkt> = h
        .out()
        .into_iter()
        .filter(|p| !p.payload.is_empty())
        .collect();
    let lens: Vec<usize> = segs.iter().map(|p| p.payload.len()).collect();
    assert_eq!(lens, vec![100, 300, 1000, 200]);
    assert!(segs[1].payload.iter().all(|&b| b == 2));
}

#[test]
fn priority_writes_overtake_unsent_writes_only_at_boundaries() {
    let (mut h, c, iss) = open_with_writes(ConnectionConfig::default(), &[]);
    h.out();
    // The peer closes its window so that writes queue up.
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1).win(0)).unwrap();
    h.ep.write_tagged(c, b"low-1 ", WriteTag::default())
        .unwrap();
    h.ep.write_tagged(
        c,
        b"low-2 ",
        WriteTag {
            squash_key: Some(9),
            ..Default::default()
        },
    )
    .unwrap();
    h.ep.write_message(
        c,
        b"HIGH ",
        WriteTag {
            priority: 10,
            ..Default::default()
        },
    )
    .unwrap();
    // Squash the stale update (Minion §4.2).
    let now = h.now;
    h.ep.send_queue(c, |q| {
        assert_eq!(q.squash(now, 9), 6);
    })
    .unwrap();
    h.inject(&h.pkt(ACK, IRS + 1, iss + 1).win(1000)).unwrap();
    let data: Vec<u8> = h.out().into_iter().flat_map(|p| p.payload).collect();
    assert_eq!(data, b"HIGH low-1 ");
}

#[test]
fn stream_offsets_are_isn_relative() {
    let (mut h, c, iss) = open_with_writes(ConnectionConfig::default(), &[b"abc"]);
    h.out();
    let conn = h.ep.connection(c).unwrap();
    assert_eq!(conn.write_offset(), 3);
    assert_eq!(conn.acked_offset(), 0);
    h.inject(&h.pkt(ACK, IRS + 1, iss + 4).data(b"0123456789"))
        .unwrap();
    let mut buf = [0u8; 4];
    h.ep.read(c, &mut buf).unwrap();
    let conn = h.ep.connection(c).unwrap();
    assert_eq!(conn.read_offset(), 4);
    assert_eq!(conn.acked_offset(), 3);
    assert!(conn.srtt().is_some());
}
