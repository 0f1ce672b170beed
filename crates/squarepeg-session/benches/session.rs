//! The sans-IO cores alone, without sockets, threads or locks: messages of
//! several sizes go from one `Session` through its scheduler and the frame
//! encoder into a byte buffer, through a `StreamDecoder` into the peer's
//! `Session` and out of its receive queue. This is the floor of the
//! per-message cost over kernel TCP (`peg bench messages` adds the kernel,
//! the tokio driver and the locks); docs/results.md compares the two.
//!
//! `cargo bench -p squarepeg-session --bench session`

use std::time::Instant;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use squarepeg_framing::StreamDecoder;
use squarepeg_session::{Config, MAX_FRAME_BODY, MessageProps, Role, Session};

/// Messages per iteration.
const BATCH: usize = 256;

fn pair() -> (Session, Session) {
    let config = {
        let mut c = Config::default();
        c.message_send_queue = 64 << 20;
        c.message_receive_queue = 64 << 20;
        c
    };
    (
        Session::new(Role::Client, config.clone()).expect("config"),
        Session::new(Role::Server, config).expect("config"),
    )
}

fn messages(c: &mut Criterion) {
    let mut group = c.benchmark_group("session");
    for size in [64usize, 1024, 16384] {
        let payload = Bytes::from(vec![0x5au8; size]);
        group.throughput(Throughput::Bytes((size * BATCH) as u64));
        group.bench_with_input(BenchmarkId::new("messages", size), &size, |b, _| {
            let (mut tx, mut rx) = pair();
            let mut decoder = StreamDecoder::new(MAX_FRAME_BODY);
            let mut wire = Vec::with_capacity(BATCH * (size + 32));
            let now = Instant::now();
            b.iter(|| {
                for _ in 0..BATCH {
                    tx.send_message(now, payload.clone(), MessageProps::default())
                        .expect("queued");
                }
                wire.clear();
                while tx.poll_transmit(now, &mut wire).is_some() {}
                while tx.poll_event().is_some() {}
                decoder.push(&wire);
                while let Some(frame) = decoder.next_frame() {
                    rx.handle_frame(now, frame.expect("valid frame"));
                }
                let mut got = 0;
                while let Some(m) = rx.poll_message() {
                    got += m.payload.len();
                }
                while rx.poll_event().is_some() {}
                assert_eq!(got, size * BATCH);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, messages);
criterion_main!(benches);
