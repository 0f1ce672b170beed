//! The receive side's cost against plain frame decoding: the same stream
//! of 1 KiB random-payload frames, cut into 1448-byte segments holding
//! whole frames (consistent segmentation, Hollywood §4.2), fed
//!
//! - to `decode_frame`, one frame at a time (the floor: decoding only),
//! - to `StreamDecoder` in order,
//! - to `Reassembler` in order (the fast path),
//! - to `Reassembler` with every pair of segments swapped (half the
//!   segments out of order, each filling the hole before its partner),
//! - to `Reassembler` in order with segments cut at random points instead
//!   (frames split across segments).
//!
//! Run: `cargo bench -p squarepeg-framing --bench reassembly`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use squarepeg_framing::sample::{PayloadKind, payload};
use squarepeg_framing::{FrameHeader, Reassembler, StreamDecoder, decode_frame, encode_frame};

const MSS: usize = 1448;

fn reassembly(c: &mut Criterion) {
    // Segments of whole frames: each frame is as large as fits one MSS.
    let mut frames = Vec::new();
    let mut segments: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut wire = Vec::new();
    for i in 0..256u64 {
        let body = payload(PayloadKind::Random, 1024, i);
        let start = wire.len();
        encode_frame(
            &FrameHeader::Message {
                substream: 0,
                number: i,
            },
            &body,
            &mut wire,
        )
        .unwrap();
        frames.push((start + 1, wire.len() - 1));
        segments.push((start as u64, wire[start..].to_vec()));
        assert!(wire.len() - start <= MSS);
    }
    let mut swapped = segments.clone();
    for pair in swapped.chunks_mut(2) {
        pair.reverse();
    }
    // The same bytes cut at arbitrary points.
    let mut cut = Vec::new();
    let mut at = 0;
    let mut seed = 7u64;
    while at < wire.len() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 200 + (seed >> 33) as usize % MSS;
        let end = (at + len).min(wire.len());
        cut.push((at as u64, wire[at..end].to_vec()));
        at = end;
    }

    let mut group = c.benchmark_group("receive");
    group.throughput(Throughput::Bytes(wire.len() as u64));
    group.bench_function("decode_frame only", |b| {
        b.iter(|| {
            for &(a, z) in &frames {
                black_box(decode_frame(&wire[a..z], 1 << 16).unwrap());
            }
        })
    });
    group.bench_function("StreamDecoder in order", |b| {
        b.iter(|| {
            let mut d = StreamDecoder::new(1 << 16);
            for (_, s) in &segments {
                d.push(s);
                while let Some(f) = d.next_frame() {
                    black_box(f.unwrap());
                }
            }
        })
    });
    let run = |segs: &[(u64, Vec<u8>)]| {
        let mut r = Reassembler::new(1 << 16, 1 << 20).unwrap();
        let mut n = 0;
        for (o, s) in segs {
            r.insert(*o, s).unwrap();
            while let Some(f) = r.next_frame() {
                black_box(f.unwrap());
                n += 1;
            }
        }
        assert_eq!(n, 256);
    };
    group.bench_function("Reassembler in order", |b| b.iter(|| run(&segments)));
    group.bench_function("Reassembler pairs swapped", |b| b.iter(|| run(&swapped)));
    group.bench_function("Reassembler cut anywhere", |b| b.iter(|| run(&cut)));
    group.finish();
}

criterion_group!(benches, reassembly);
criterion_main!(benches);
