//! COBS throughput: squarepeg's codec against the `cobs` and `corncobs`
//! crates and plain memcpy (`copy_from_slice`), on 64 B, 1 KiB and 16 KiB
//! inputs of three shapes (random, text-like, zero-heavy; see
//! `squarepeg_framing::sample`). Every codec writes into a buffer allocated
//! once, outside the timed loop. For decoding, `squarepeg` is
//! `decode_run_into` (the frame path: the marker scan has already found the
//! run, so there is no zero check; corncobs does none either) and
//! `squarepeg-checked` is `decode_into`, which scans for zero bytes first.
//!
//! Each benchmark cycles through about 64 KiB of distinct inputs of its
//! shape (1024 inputs of 64 B, 64 of 1 KiB, 4 of 16 KiB): one input
//! repeated would let the branch predictor learn it by heart, which
//! flatters byte-at-a-time codecs several times over on small inputs.
//!
//! Run: `cargo bench -p squarepeg-framing --bench cobs`
//! (`peg bench framing` runs a quick self-timed version of the same grid).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use squarepeg_framing::cobs as sp;
use squarepeg_framing::sample::{PayloadKind, payload};

const SIZES: [usize; 3] = [64, 1024, 16 * 1024];

fn inputs(kind: PayloadKind, size: usize) -> Vec<Vec<u8>> {
    let count = ((64 << 10) / size).clamp(1, 1024);
    (0..count as u64)
        .map(|seed| payload(kind, size, seed + 1))
        .collect()
}

/// The next item of `items`, round and round.
fn next<'a>(items: &'a [Vec<u8>], k: &mut usize) -> &'a [u8] {
    *k = (*k + 1) % items.len();
    &items[*k]
}

fn encode(c: &mut Criterion) {
    for kind in PayloadKind::ALL {
        let mut group = c.benchmark_group(format!("encode/{kind}"));
        for size in SIZES {
            let inputs = inputs(kind, size);
            group.throughput(Throughput::Bytes(size as u64));
            let mut vec = Vec::with_capacity(sp::max_encoded_len(size));
            let mut dest = vec![0u8; corncobs::max_encoded_len(size) + 8];
            let mut k = 0;
            group.bench_function(BenchmarkId::new("squarepeg", size), |b| {
                b.iter(|| {
                    vec.clear();
                    sp::encode(black_box(next(&inputs, &mut k)), &mut vec);
                    black_box(vec.len())
                })
            });
            group.bench_function(BenchmarkId::new("cobs", size), |b| {
                b.iter(|| black_box(::cobs::encode(black_box(next(&inputs, &mut k)), &mut dest)))
            });
            group.bench_function(BenchmarkId::new("corncobs", size), |b| {
                b.iter(|| {
                    black_box(corncobs::encode_buf(
                        black_box(next(&inputs, &mut k)),
                        &mut dest,
                    ))
                })
            });
            group.bench_function(BenchmarkId::new("memcpy", size), |b| {
                b.iter(|| {
                    dest[..size].copy_from_slice(black_box(next(&inputs, &mut k)));
                    black_box(dest[0])
                })
            });
        }
        group.finish();
    }
}

fn decode(c: &mut Criterion) {
    for kind in PayloadKind::ALL {
        let mut group = c.benchmark_group(format!("decode/{kind}"));
        for size in SIZES {
            let inputs = inputs(kind, size);
            // Each codec decodes its own encodings of the same inputs; the
            // throughput counts decoded bytes.
            let ours: Vec<Vec<u8>> = inputs
                .iter()
                .map(|input| {
                    let mut enc = Vec::new();
                    sp::encode(input, &mut enc);
                    enc
                })
                .collect();
            let theirs: Vec<Vec<u8>> = inputs
                .iter()
                .map(|input| {
                    let mut enc = vec![0u8; ::cobs::max_encoding_length(size)];
                    let n = ::cobs::encode(input, &mut enc);
                    enc.truncate(n);
                    enc
                })
                .collect();
            let corn: Vec<Vec<u8>> = inputs
                .iter()
                .map(|input| {
                    let mut enc = vec![0u8; corncobs::max_encoded_len(size)];
                    let n = corncobs::encode_buf(input, &mut enc);
                    enc.truncate(n);
                    enc
                })
                .collect();
            group.throughput(Throughput::Bytes(size as u64));
            let mut dest = vec![0u8; size + 64];
            let mut k = 0;
            group.bench_function(BenchmarkId::new("squarepeg", size), |b| {
                b.iter(|| {
                    black_box(
                        sp::decode_run_into(black_box(next(&ours, &mut k)), &mut dest).unwrap(),
                    )
                })
            });
            group.bench_function(BenchmarkId::new("squarepeg-checked", size), |b| {
                b.iter(|| {
                    black_box(sp::decode_into(black_box(next(&ours, &mut k)), &mut dest).unwrap())
                })
            });
            group.bench_function(BenchmarkId::new("cobs", size), |b| {
                b.iter(|| {
                    black_box(::cobs::decode(black_box(next(&theirs, &mut k)), &mut dest).unwrap())
                })
            });
            group.bench_function(BenchmarkId::new("corncobs", size), |b| {
                b.iter(|| {
                    black_box(
                        corncobs::decode_buf(black_box(next(&corn, &mut k)), &mut dest).unwrap(),
                    )
                })
            });
            group.bench_function(BenchmarkId::new("memcpy", size), |b| {
                b.iter(|| {
                    dest[..size].copy_from_slice(black_box(next(&inputs, &mut k)));
                    black_box(dest[0])
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, encode, decode);
criterion_main!(benches);
