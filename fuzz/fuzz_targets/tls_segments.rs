//! squarepeg-tls's out-of-order receive path (`Tls::push_segment`, the record scanner)
//! driven by a fuzz-generated sequence of segments.
//!
//! A client and a server finish their handshake in process; the server receives through
//! `push_segment` with out-of-order receive on, numbered records (docs/wire.md §5, writes
//! reordered by a tagged queue, KeyUpdates on the way) or a stock sender's positional records
//! (found by prediction). The input picks the messages and a sequence of operations: genuine
//! segments at their offsets, arbitrary bytes at arbitrary offsets (inside and beyond the
//! window, up to the end of the offset space), genuine ranges with flipped bytes, fake
//! `17 03 03 len` headers, genuine records copied elsewhere, repeats of earlier segments.
//!
//! Always: no panic; every message delivered, in order or out of order, is byte for byte one
//! that was sent, and none twice; an out-of-order record's length on the wire is that of the
//! record that carried it; with positional records, the in-order stream is the sent one in
//! its order (less what was delivered out of order) and an out-of-order record's number is
//! its position; the bytes held ahead stay within the window plus one record. When every
//! byte the fuzzer made up lay beyond the end of the genuine stream and within the window,
//! and every segment within the window (and no genuine record was copied to another place):
//! no error, and after a final in-order pass every message has been delivered exactly once.
#![no_main]

#[path = "common/tls.rs"]
mod tls_setup;

use std::collections::HashMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use squarepeg_tls::record::MAX_RECORD_LEN;
use squarepeg_tls::{OutOfOrderConfig, Tls};
use tls_setup::{SERVER_NAME, configs};

/// Message header: id (4 bytes), total length (2 bytes); then filler derived from the id.
const MESSAGE_HEADER: usize = 6;

#[derive(Arbitrary, Debug)]
struct Input {
    numbered: bool,
    reorder: bool,
    /// The receiver expects replacements (docs/wire.md §5.1): records found again in order
    /// may be skipped as copies, and bytes that do not authenticate hold the stream.
    replacing: bool,
    key_updates: u8,
    window_sel: u8,
    predictions: u8,
    seed: u64,
    max_segment: u16,
    sizes: Vec<u16>,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Genuine segment number `i` (of the stream cut into segments).
    Segment { i: u16 },
    /// Genuine stream bytes `from..from + len` at their offset.
    Range { from: u16, len: u16 },
    /// Arbitrary bytes at `offset` past the start of the application data.
    Raw { offset: u32, bytes: Vec<u8> },
    /// Arbitrary bytes at an arbitrary 64-bit offset.
    RawFar { offset: u64, bytes: Vec<u8> },
    /// A genuine range with bytes XORed.
    Flip {
        from: u16,
        len: u16,
        at: Vec<(u16, u8)>,
    },
    /// A fake record header with a plausible length, then filler.
    FakeHeader { at: u32, len: u16, fill: u8 },
    /// Genuine record `r` copied to `at` (a replay elsewhere, or over another record).
    Copy { r: u8, at: u32, cut: u16 },
    /// Genuine record `r` with its header's length changed.
    BadLength { r: u8, len: u16 },
    /// The `back`-th segment pushed before, again.
    Repeat { back: u8 },
}

fn message(id: u32, len: usize) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend((len as u16).to_be_bytes());
    m.extend((MESSAGE_HEADER..len).map(|i| (id as usize * 31 + i * 7) as u8));
    m
}

fn next(rng: &mut u64) -> u64 {
    // xorshift64*
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A genuine record of the stream.
struct Record {
    offset: u64,
    wire_len: usize,
    /// The message it carries (`None`: control output).
    id: Option<u32>,
    /// Its position among the records after the handshake (positional records only).
    position: u64,
}

struct Write {
    priority: i32,
    /// KeyUpdates (control writes) queued ahead of it after it.
    overtaken: u8,
    bytes: Vec<u8>,
    id: Option<u32>,
}

/// What the server handed out so far, checked as it comes.
struct Checker {
    messages: Vec<Vec<u8>>,
    /// Message id → index of its record.
    record_of: HashMap<u32, usize>,
    records: Vec<Record>,
    delivered: Vec<bool>,
    delivered_out_of_order: Vec<bool>,
    /// Positional records: the next record the in-order stream may deliver.
    next_in_order: usize,
    numbered: bool,
    in_order: Vec<u8>,
}

impl Checker {
    /// A whole message `m`: one that was sent, byte for byte, and not delivered before.
    fn message(&mut self, m: &[u8]) -> u32 {
        assert!(m.len() >= MESSAGE_HEADER, "short message {m:?}");
        let id = u32::from_be_bytes(m[..4].try_into().unwrap());
        let sent = self
            .messages
            .get(id as usize)
            .unwrap_or_else(|| panic!("no message {id}"));
        assert_eq!(m, &sent[..], "message {id} is not the one sent");
        assert!(!self.delivered[id as usize], "message {id} delivered twice");
        self.delivered[id as usize] = true;
        id
    }

    fn in_order(&mut self, bytes: &[u8]) {
        self.in_order.extend_from_slice(bytes);
        while self.in_order.len() >= MESSAGE_HEADER {
            let len = usize::from(u16::from_be_bytes([self.in_order[4], self.in_order[5]]));
            assert!(len >= MESSAGE_HEADER, "in-order stream out of step");
            if self.in_order.len() < len {
                return;
            }
            let m: Vec<u8> = self.in_order.drain(..len).collect();
            let id = self.message(&m);
            if !self.numbered {
                // The stream's own order: the next record that carries a message and was not
                // delivered out of order.
                while let Some(r) = self.records.get(self.next_in_order) {
                    match r.id {
                        Some(i) if !self.delivered_out_of_order[i as usize] => break,
                        _ => self.next_in_order += 1,
                    }
                }
                let expected = self.records.get(self.next_in_order).and_then(|r| r.id);
                assert_eq!(expected, Some(id), "in-order message out of place");
                self.next_in_order += 1;
            }
        }
    }

    fn out_of_order(&mut self, wire_len: usize, number: u64, content: &[u8]) {
        let id = self.message(content);
        self.delivered_out_of_order[id as usize] = true;
        let r = &self.records[self.record_of[&id]];
        assert_eq!(
            wire_len, r.wire_len,
            "message {id} from a record of another length"
        );
        if !self.numbered {
            assert_eq!(number, r.position, "message {id} under another number");
        }
    }
}

fuzz_target!(|input: Input| {
    let (client_config, server_config) = configs();
    let mut client = Tls::client(client_config.clone(), SERVER_NAME).unwrap();
    let mut server = Tls::server(server_config.clone()).unwrap();
    let window = match input.window_sel % 4 {
        0 => 1024,
        1 => 8 * 1024,
        2 => 40 * 1024,
        _ => 256 * 1024,
    };
    let mut ooo = OutOfOrderConfig::new(window);
    ooo.predictions = u32::from(input.predictions % 6);
    server.enable_out_of_order(ooo);
    let numbered = input.numbered;
    if numbered {
        server.accept_numbered_records();
        client.send_numbered_records();
        if input.replacing {
            server.expect_replacements();
        }
        if input.key_updates > 0 {
            client.set_key_update_threshold(u64::from(input.key_updates % 16) + 2);
        }
    }

    // Handshake, the server's side through segments in order.
    let mut base = 0u64;
    for _ in 0..10 {
        let mut c = Vec::new();
        client.poll_output(&mut c);
        let mut s = Vec::new();
        server.poll_output(&mut s);
        if c.is_empty() && s.is_empty() {
            break;
        }
        let mut plain = Vec::new();
        server
            .push_segment(base, &c, &mut plain, &mut |_| panic!("no data yet"))
            .unwrap();
        assert!(plain.is_empty());
        base += c.len() as u64;
        client.push_ciphertext(&s);
        let mut plain = Vec::new();
        client.process(&mut plain).unwrap();
    }
    assert!(!client.is_handshaking() && !server.is_handshaking());

    // The messages, one record each, as a tagged queue puts them on the wire.
    let mut rng = input.seed | 1;
    let messages: Vec<Vec<u8>> = input
        .sizes
        .iter()
        .take(48)
        .enumerate()
        .map(|(id, &s)| message(id as u32, MESSAGE_HEADER + usize::from(s) % 1500))
        .collect();
    let mut writes = Vec::new();
    for (id, m) in messages.iter().enumerate() {
        let mut control = Vec::new();
        client.poll_output(&mut control);
        if !control.is_empty() {
            writes.push(Write {
                priority: i32::MAX,
                overtaken: 0,
                bytes: control,
                id: None,
            });
        }
        let mut bytes = Vec::new();
        client.seal(m, &mut bytes).unwrap();
        let priority = (next(&mut rng) % 4) as i32;
        writes.push(Write {
            priority,
            overtaken: 0,
            bytes,
            id: Some(id as u32),
        });
    }
    let mut control = Vec::new();
    client.poll_output(&mut control);
    if !control.is_empty() {
        writes.push(Write {
            priority: i32::MAX,
            overtaken: 0,
            bytes: control,
            id: None,
        });
    }
    let mut pending: Vec<Write> = Vec::new();
    let mut ordered: Vec<Write> = Vec::new();
    for w in writes {
        if w.id.is_none() {
            // A record sealed under a key must not trail two KeyUpdates (the receiver keeps
            // one key before the current one): the sender's KeyUpdate margin keeps them far
            // apart; here, with a small threshold, they are close, so what one overtook goes
            // out before the next.
            while pending.iter().any(|p| p.overtaken > 0) {
                ordered.push(pending.remove(0));
            }
        }
        let at = if numbered && input.reorder {
            pending.partition_point(|p| p.priority >= w.priority)
        } else {
            pending.len()
        };
        let control = w.id.is_none();
        pending.insert(at, w);
        if control {
            for p in &mut pending[at + 1..] {
                p.overtaken += 1;
            }
        }
        while pending.len() > 8 || (!pending.is_empty() && next(&mut rng) % 3 == 0) {
            ordered.push(pending.remove(0));
        }
    }
    ordered.append(&mut pending);
    let mut stream = Vec::new();
    let mut records = Vec::new();
    let mut position = 0;
    for w in ordered {
        let mut at = 0;
        while at < w.bytes.len() {
            let len = 5 + usize::from(u16::from_be_bytes([w.bytes[at + 3], w.bytes[at + 4]]));
            records.push(Record {
                offset: base + (stream.len() + at) as u64,
                wire_len: len,
                id: w.id,
                position,
            });
            position += 1;
            at += len;
        }
        assert_eq!(at, w.bytes.len());
        if w.id.is_some() {
            assert_eq!(
                records.last().unwrap().wire_len,
                w.bytes.len(),
                "one record a message"
            );
        }
        stream.extend_from_slice(&w.bytes);
    }
    let end = base + stream.len() as u64;
    if std::env::var_os("TLS_SEGMENTS_DEBUG").is_some() {
        for r in &records {
            eprintln!(
                "record at {} len {} id {:?} position {}",
                r.offset, r.wire_len, r.id, r.position
            );
        }
    }
    let mut record_of = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        if let Some(id) = r.id {
            record_of.insert(id, i);
        }
    }
    let max_segment = 1 + usize::from(input.max_segment) % 3000;
    let mut segments = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let n = (1 + next(&mut rng) as usize % max_segment).min(stream.len() - at);
        segments.push((base + at as u64, stream[at..at + n].to_vec()));
        at += n;
    }

    let count = messages.len();
    let check = Checker {
        messages,
        record_of,
        records,
        delivered: vec![false; count],
        delivered_out_of_order: vec![false; count],
        next_in_order: 0,
        numbered,
        in_order: Vec::new(),
    };
    let mut run = Run {
        server,
        check,
        clean: true,
        failed: false,
        pushed: Vec::new(),
        base,
        end,
        window,
        stream,
    };
    for op in input.ops.iter().take(256) {
        let (offset, data) = match op {
            Op::Segment { i } => {
                if segments.is_empty() {
                    continue;
                }
                segments[usize::from(*i) % segments.len()].clone()
            }
            Op::Range { from, len } => {
                let from = usize::from(*from).min(run.stream.len());
                let to = (from + usize::from(*len)).min(run.stream.len());
                (base + from as u64, run.stream[from..to].to_vec())
            }
            Op::Raw { offset, bytes } => (base + u64::from(*offset), bytes.clone()),
            Op::RawFar { offset, bytes } => (*offset, bytes.clone()),
            Op::Flip { from, len, at } => {
                let from = usize::from(*from).min(run.stream.len());
                let to = (from + usize::from(*len)).min(run.stream.len());
                let mut bytes = run.stream[from..to].to_vec();
                if !bytes.is_empty() {
                    for &(i, x) in at.iter().take(8) {
                        let n = bytes.len();
                        bytes[usize::from(i) % n] ^= x;
                    }
                }
                (base + from as u64, bytes)
            }
            Op::FakeHeader { at, len, fill } => {
                let len = usize::from(*len) % (16 * 1024 + 300);
                let mut bytes = vec![0x17, 0x03, 0x03, (len >> 8) as u8, len as u8];
                let mut x = u64::from(*fill) | 1;
                bytes.extend((0..len).map(|_| next(&mut x) as u8));
                (base + u64::from(*at), bytes)
            }
            Op::Copy { r, at, cut } => {
                let Some(rec) = run
                    .check
                    .records
                    .get(usize::from(*r) % run.check.records.len().max(1))
                else {
                    continue;
                };
                let from = (rec.offset - base) as usize;
                let to = from + rec.wire_len;
                let cut = usize::from(*cut) % (rec.wire_len + 1);
                let at = base + u64::from(*at);
                if at != rec.offset + cut as u64 && cut < rec.wire_len {
                    // A genuine record somewhere else, even beyond the stream's end: the
                    // receiver cannot tell it from a replay that displaces a record it has
                    // not seen yet, and may fail the stream when it meets the original
                    // (docs/wire.md §5); nothing it delivers may be wrong either way.
                    run.clean = false;
                }
                (at, run.stream[from + cut..to].to_vec())
            }
            Op::BadLength { r, len } => {
                let Some(rec) = run
                    .check
                    .records
                    .get(usize::from(*r) % run.check.records.len().max(1))
                else {
                    continue;
                };
                let from = (rec.offset - base) as usize;
                let mut bytes = run.stream[from..from + rec.wire_len].to_vec();
                bytes[3..5].copy_from_slice(&len.to_be_bytes());
                (rec.offset, bytes)
            }
            Op::Repeat { back } => {
                let Some(p) = run.pushed.len().checked_sub(1 + usize::from(*back)) else {
                    continue;
                };
                run.pushed[p].clone()
            }
        };
        run.push(offset, data);
    }

    // The rest of the stream in order, as retransmissions would bring it.
    for _ in 0..run.stream.len() / 1000 + 100 {
        let at = run.server.in_order_offset();
        if run.failed || at >= end {
            break;
        }
        let from = (at - base) as usize;
        let to = (from + 1400).min(run.stream.len());
        let data = run.stream[from..to].to_vec();
        run.push(at, data);
    }
    if std::env::var_os("TLS_SEGMENTS_SUMMARY").is_some() {
        let ooo = run
            .check
            .delivered_out_of_order
            .iter()
            .filter(|&&d| d)
            .count();
        let all = run.check.delivered.iter().filter(|&&d| d).count();
        eprintln!(
            "summary: numbered {numbered} messages {count} delivered {all} out of order {ooo} clean {} failed {}",
            run.clean, run.failed
        );
    }
    if !run.failed && !run.server.is_held() && run.server.in_order_records_end() >= end {
        // Whatever was done to the stream: read in order to its end, neither failed nor
        // held, it delivered every message (a replay that displaced one must not be
        // skipped as a copy).
        let missing: Vec<usize> = (0..count).filter(|&i| !run.check.delivered[i]).collect();
        assert!(
            missing.is_empty(),
            "messages {missing:?} lost without an error"
        );
    }
    if run.clean {
        assert!(!run.failed);
        assert!(
            run.server.in_order_offset() >= end,
            "the genuine stream stalled"
        );
        let missing: Vec<usize> = (0..count).filter(|&i| !run.check.delivered[i]).collect();
        assert!(missing.is_empty(), "messages {missing:?} never delivered");
        assert!(
            run.check.in_order.is_empty(),
            "a partial message at the end"
        );
    }
});

/// The server and what it was given.
struct Run {
    server: Tls,
    check: Checker,
    /// Every byte the fuzzer made up lay beyond the genuine stream's end (not right at it:
    /// the in-order stream would go on into it), every segment within the window: then the
    /// genuine stream must come through whole.
    clean: bool,
    failed: bool,
    pushed: Vec<(u64, Vec<u8>)>,
    base: u64,
    end: u64,
    window: usize,
    stream: Vec<u8>,
}

impl Run {
    fn push(&mut self, offset: u64, data: Vec<u8>) {
        let floor = self.server.in_order_offset();
        let data_end = offset.saturating_add(data.len() as u64);
        if data_end > floor && data_end - floor > self.window as u64 {
            self.clean = false;
        }
        let made_up = data.iter().enumerate().any(|(i, &b)| {
            let Some(at) = offset.checked_add(i as u64) else {
                return false;
            };
            at >= floor
                && (at == self.end
                    || at.checked_sub(self.base).is_some_and(|g| {
                        self.stream
                            .get(g as usize)
                            .is_some_and(|&genuine| genuine != b)
                    }))
        });
        if made_up {
            self.clean = false;
        }
        let mut in_order = Vec::new();
        let mut ooo: Vec<(usize, u64, Vec<u8>)> = Vec::new();
        if std::env::var_os("TLS_SEGMENTS_DEBUG").is_some() {
            eprintln!(
                "push {offset} len {} (in order {}) held {}",
                data.len(),
                floor,
                self.server.out_of_order_bytes_held()
            );
        }
        let result = self
            .server
            .push_segment(offset, &data, &mut in_order, &mut |r| {
                ooo.push((r.wire_len, r.number, r.content.to_vec()))
            });
        self.check.in_order(&in_order);
        for (wire_len, number, content) in ooo {
            self.check.out_of_order(wire_len, number, &content);
        }
        let held = self.server.out_of_order_bytes_held();
        assert!(
            held <= self.window + MAX_RECORD_LEN,
            "{held} bytes held ahead, window {}",
            self.window
        );
        if let Err(e) = result {
            assert!(
                !self.clean,
                "an error with only genuine bytes in the stream: {e:?}"
            );
            self.failed = true;
        }
        self.pushed.push((offset, data));
    }
}
