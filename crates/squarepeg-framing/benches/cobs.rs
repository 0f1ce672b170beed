//! COBS throughput: squarepeg's codec against the `cobs` and `corncobs`
//! crates and plain memcpy (`copy_from_slice`), on 64 B, 1 KiB and 16 KiB
//! inputs of three shapes (random, text-like, zero-heavy; see
//! `squarepeg_framing::sample`). Every codec writes into a buffer allocated
//! once, outside the timed loop. For decoding, `squarepeg` is
//! `decode_run_into` (the frame path: the marker scan has already found the
//! run, so there is no zero check; corncobs does none either) and
//! `squarepeg-checked` is `decode_into`, which scans for zero bytes first.
//!
//! Run: `cargo bench -p squarepeg-framing --bench cobs`
//! (`peg bench framing` runs a quick self-timed version of the same grid).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use squarepeg_framing::cobs as sp;
use squarepeg_framing::sample::{PayloadKind, payload};

const SIZES: [usize; 3] = [64, 1024, 16 * 1024];

fn encode(c: &mut Criterion) {
    for kind in PayloadKind::ALL {
        let mut group = c.benchmark_group(format!("encode/{kind}"));
        for size in SIZES {
            let input = payload(kind, size, 1);
            group.throughput(Throughput::Bytes(size as u64));
            let mut vec = Vec::with_capacity(sp::max_encoded_len(size));
            group.bench_with_input(BenchmarkId::new("squarepeg", size), &input, |b, input| {
                b.iter(|| {
                    vec.clear();
                    sp::encode(black_box(input), &mut vec);
                    black_box(vec.len())
                })
            });
            let mut dest = vec![0u8; corncobs::max_encoded_len(size) + 8];
            group.bench_with_input(BenchmarkId::new("cobs", size), &input, |b, input| {
                b.iter(|| black_box(::cobs::encode(black_box(input), &mut dest)))
            });
            group.bench_with_input(BenchmarkId::new("corncobs", size), &input, |b, input| {
                b.iter(|| black_box(corncobs::encode_buf(black_box(input), &mut dest)))
            });
            group.bench_with_input(BenchmarkId::new("memcpy", size), &input, |b, input| {
                b.iter(|| {
                    dest[..input.len()].copy_from_slice(black_box(input));
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
            let input = payload(kind, size, 1);
            // Each codec decodes its own encoding of the same input; the
            // throughput counts decoded bytes.
            let mut ours = Vec::new();
            sp::encode(&input, &mut ours);
            let mut theirs = vec![0u8; ::cobs::max_encoding_length(size)];
            let n = ::cobs::encode(&input, &mut theirs);
            theirs.truncate(n);
            let mut corn = vec![0u8; corncobs::max_encoded_len(size)];
            let n = corncobs::encode_buf(&input, &mut corn);
            corn.truncate(n);
            group.throughput(Throughput::Bytes(size as u64));
            let mut dest = vec![0u8; size + 64];
            // What frame decoding runs on a run the marker scan found (no
            // zero check; corncobs does none either) ...
            group.bench_function(BenchmarkId::new("squarepeg", size), |b| {
                b.iter(|| black_box(sp::decode_run_into(black_box(&ours), &mut dest).unwrap()))
            });
            // ... and the checked decoder, which scans for zero bytes first.
            group.bench_function(BenchmarkId::new("squarepeg-checked", size), |b| {
                b.iter(|| black_box(sp::decode_into(black_box(&ours), &mut dest).unwrap()))
            });
            group.bench_function(BenchmarkId::new("cobs", size), |b| {
                b.iter(|| black_box(::cobs::decode(black_box(&theirs), &mut dest).unwrap()))
            });
            group.bench_function(BenchmarkId::new("corncobs", size), |b| {
                b.iter(|| black_box(corncobs::decode_buf(black_box(&corn), &mut dest).unwrap()))
            });
            group.bench_function(BenchmarkId::new("memcpy", size), |b| {
                b.iter(|| {
                    dest[..size].copy_from_slice(black_box(&input));
                    black_box(dest[0])
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, encode, decode);
criterion_main!(benches);
