//! Message throughput over loopback: squarepeg over kernel TCP against plain
//! tokio TCP carrying the same bytes as length-prefixed records. The ratio
//! is printed by `peg bench messages`; this bench gives criterion's view.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use squarepeg::ConnectionConfig;
use squarepeg::bench::{raw_tcp_messages, squarepeg_messages};

const BYTES_PER_RUN: usize = 16 << 20;

fn messages(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("messages");
    group.sample_size(10);
    for size in [64usize, 256, 1024, 4096, 16384] {
        let count = BYTES_PER_RUN / size;
        group.throughput(Throughput::Bytes((size * count) as u64));
        group.bench_with_input(BenchmarkId::new("squarepeg", size), &size, |b, &size| {
            b.to_async(&rt).iter(|| async move {
                squarepeg_messages(size, count, ConnectionConfig::default())
                    .await
                    .expect("squarepeg run")
            })
        });
        group.bench_with_input(BenchmarkId::new("raw_tcp", size), &size, |b, &size| {
            b.to_async(&rt)
                .iter(|| async move { raw_tcp_messages(size, count).await.expect("raw run") })
        });
    }
    group.finish();
}

criterion_group!(benches, messages);
criterion_main!(benches);
