//! Where a message's time goes in the sans-IO cores: nanoseconds per
//! message for each phase of the path a message takes over kernel TCP,
//! without the kernel, threads or locks, next to the bare per-byte passes
//! the format needs (memcpy for scale).
//!
//! `cargo run --release -p squarepeg-session --example message_phases -- 1024`
//!
//! Batches of 256 messages go through small reused buffers, so the figures
//! are cache-warm, as in a steady stream; each is the best of 5 rounds.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use squarepeg_framing::{FrameHeader, StreamDecoder, cobs, encode_frame};
use squarepeg_session::{Config, MAX_FRAME_BODY, MessageProps, Role, Session};

const BATCH: usize = 256;
const ROUNDS: usize = 400;

const PHASES: [&str; 13] = [
    "session: send_message (queue)",
    "session: poll_transmit (schedule + encode)",
    "  of which encode_frame alone",
    "framing: StreamDecoder (scan, COBS decode, CRC)",
    "session: handle_frame",
    "session: poll_message",
    "pass: memcpy of the payload",
    "pass: COBS encode of the payload",
    "pass: COBS decode of the payload",
    "pass: memchr scan of the encoding",
    "pass: CRC32C of the payload",
    "frame: encode_frame into a cache-hot buffer",
    "frame: decode_frame of one cache-hot frame",
];

fn main() {
    let size: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let config = {
        let mut c = Config::default();
        c.message_send_queue = 1 << 30;
        c.message_receive_queue = 1 << 30;
        c
    };
    let payload = Bytes::from(
        squarepeg_framing::sample::payload(squarepeg_framing::sample::PayloadKind::Text, size, 1)
            .into_iter()
            .map(|b| b.max(1))
            .collect::<Vec<u8>>(),
    );
    let mut encoded_payload = Vec::new();
    cobs::encode(&payload, &mut encoded_payload);
    let mut best = [Duration::MAX; PHASES.len()];
    for _ in 0..5 {
        let mut tx = Session::new(Role::Client, config.clone()).expect("config");
        let mut rx = Session::new(Role::Server, config.clone()).expect("config");
        let now = Instant::now();
        let mut t = [Duration::ZERO; PHASES.len()];
        let mut wire = Vec::with_capacity(BATCH * (size + 32));
        let mut scratch = Vec::with_capacity(BATCH * (size + 32));
        let mut copy = vec![0u8; size + cobs::WINDOW + 8];
        let mut decoder = StreamDecoder::new(MAX_FRAME_BODY);
        let mut frames = Vec::with_capacity(BATCH + 8);
        let mut number = 0u64;
        for _ in 0..ROUNDS {
            let mut marks = [Instant::now(); PHASES.len() + 1];
            for _ in 0..BATCH {
                tx.send_message(now, payload.clone(), MessageProps::default())
                    .expect("queued");
            }
            marks[1] = Instant::now();
            wire.clear();
            while tx.poll_transmit(now, &mut wire).is_some() {}
            while tx.poll_event().is_some() {}
            marks[2] = Instant::now();
            scratch.clear();
            for _ in 0..BATCH {
                let h = FrameHeader::Message {
                    substream: 0,
                    number,
                };
                number += 1;
                encode_frame(&h, &payload, &mut scratch).expect("encodes");
            }
            marks[3] = Instant::now();
            decoder.push(&wire);
            while let Some(f) = decoder.next_frame() {
                frames.push(f.expect("valid"));
            }
            marks[4] = Instant::now();
            for f in frames.drain(..) {
                rx.handle_frame(now, f);
            }
            marks[5] = Instant::now();
            while let Some(m) = rx.poll_message() {
                black_box(m);
            }
            while rx.poll_event().is_some() {}
            marks[6] = Instant::now();
            for _ in 0..BATCH {
                copy[..size].copy_from_slice(black_box(&payload));
            }
            marks[7] = Instant::now();
            for _ in 0..BATCH {
                scratch.clear();
                cobs::encode(black_box(&payload), &mut scratch);
            }
            marks[8] = Instant::now();
            for _ in 0..BATCH {
                black_box(cobs::decode_run_into(black_box(&encoded_payload), &mut copy).ok());
            }
            marks[9] = Instant::now();
            for _ in 0..BATCH {
                black_box(memchr::memchr(0, black_box(&encoded_payload)));
            }
            marks[10] = Instant::now();
            for _ in 0..BATCH {
                let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
                d.update(black_box(&payload));
                black_box(d.finalize());
            }
            marks[11] = Instant::now();
            for _ in 0..BATCH {
                scratch.clear();
                let h = FrameHeader::Message {
                    substream: 0,
                    number,
                };
                encode_frame(&h, black_box(&payload), &mut scratch).expect("encodes");
            }
            marks[12] = Instant::now();
            let one = &scratch[1..scratch.len() - 1];
            for _ in 0..BATCH {
                black_box(squarepeg_framing::decode_frame(black_box(one), MAX_FRAME_BODY).ok());
            }
            marks[13] = Instant::now();
            for (k, span) in marks.windows(2).enumerate() {
                t[k] += span[1] - span[0];
            }
        }
        for (b, t) in best.iter_mut().zip(t) {
            *b = (*b).min(t);
        }
    }
    let n = (BATCH * ROUNDS) as f64;
    println!("{size}-byte messages, ns per message (best of 5):");
    for (name, t) in PHASES.iter().zip(best) {
        println!("  {name:<48} {:>8.1}", t.as_nanos() as f64 / n);
    }
}
