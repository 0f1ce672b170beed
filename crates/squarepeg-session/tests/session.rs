//! Session behaviour through the public API: scheduler order, expiry,
//! squash, dependencies, streams, flow control, dedup, close and errors,
//! and two sessions joined through `StreamDecoder` in virtual time.

use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use squarepeg_framing::{DEFAULT_MAX_BODY, Frame, FrameHeader, StreamDecoder, encode_frame};
use squarepeg_session::control::{self, ControlFrame};
use squarepeg_session::*;

fn session(role: Role) -> Session {
    Session::new(role, Config::default()).unwrap()
}

fn props(substream: u64, urgency: u8) -> MessageProps {
    MessageProps {
        substream,
        priority: Priority::new(urgency).unwrap(),
        ..Default::default()
    }
}

/// Everything `s` sends now, as decoded frames with their metadata.
fn drain(s: &mut Session, now: Instant) -> Vec<(Frame, Transmit)> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut dec = StreamDecoder::new(DEFAULT_MAX_BODY);
    while let Some(t) = s.poll_transmit(now, &mut buf) {
        dec.push(&buf);
        buf.clear();
        let f = dec.next_frame().unwrap().unwrap();
        out.push((f, t));
    }
    out
}

fn data_frames(frames: Vec<(Frame, Transmit)>) -> Vec<(Frame, Transmit)> {
    frames
        .into_iter()
        .filter(|(f, _)| f.header != FrameHeader::Control)
        .collect()
}

fn message_numbers(frames: &[(Frame, Transmit)]) -> Vec<u64> {
    frames
        .iter()
        .filter_map(|(f, _)| match f.header {
            FrameHeader::Message { number, .. } => Some(number),
            _ => None,
        })
        .collect()
}

fn statuses(s: &mut Session) -> Vec<(u64, MessageStatus)> {
    let mut v = Vec::new();
    while let Some(e) = s.poll_event() {
        if let Event::MessageStatus { numbers, status } = e {
            v.extend(numbers.map(|n| (n, status)));
        }
    }
    v
}

/// Two sessions joined by a byte pipe through `StreamDecoder`, in virtual
/// time: what a kernel TCP connection does, minus the kernel.
struct Pair {
    a: Session,
    b: Session,
    dec_a: StreamDecoder,
    dec_b: StreamDecoder,
    now: Instant,
    /// Bytes moved per call of `pump` and direction, to interleave.
    batch: usize,
}

impl Pair {
    fn new() -> Self {
        Self::with(Config::default(), Config::default())
    }

    fn with(ca: Config, cb: Config) -> Self {
        Self {
            a: Session::new(Role::Client, ca).unwrap(),
            b: Session::new(Role::Server, cb).unwrap(),
            dec_a: StreamDecoder::new(DEFAULT_MAX_BODY),
            dec_b: StreamDecoder::new(DEFAULT_MAX_BODY),
            now: Instant::now(),
            batch: 64 * 1024,
        }
    }

    /// Moves up to `batch` bytes each way; returns whether anything moved.
    fn step(&mut self) -> bool {
        let moved_ab = Self::carry(
            &mut self.a,
            &mut self.b,
            &mut self.dec_b,
            self.now,
            self.batch,
        );
        let moved_ba = Self::carry(
            &mut self.b,
            &mut self.a,
            &mut self.dec_a,
            self.now,
            self.batch,
        );
        moved_ab || moved_ba
    }

    fn carry(
        from: &mut Session,
        to: &mut Session,
        dec: &mut StreamDecoder,
        now: Instant,
        batch: usize,
    ) -> bool {
        let mut buf = Vec::new();
        while buf.len() < batch && from.poll_transmit(now, &mut buf).is_some() {}
        if buf.is_empty() {
            return false;
        }
        dec.push(&buf);
        while let Some(f) = dec.next_frame() {
            match f {
                Ok(f) => to.handle_frame(now, f),
                Err(e) => to.handle_decode_error(now, e),
            }
        }
        true
    }

    fn settle(&mut self) {
        for _ in 0..100_000 {
            if !self.step() {
                return;
            }
        }
        panic!("did not settle");
    }
}

fn read_stream(s: &mut Session, id: StreamId) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 7000];
    loop {
        match s.stream_read(id, &mut buf).unwrap() {
            ReadOutcome::Data(n) => out.extend_from_slice(&buf[..n]),
            ReadOutcome::Finished => return (out, true),
            ReadOutcome::Blocked => return (out, false),
        }
    }
}

#[test]
fn strict_priority_and_late_binding() {
    let mut s = session(Role::Client);
    let now = Instant::now();
    drain(&mut s, now); // PARAMS
    for i in 0..5 {
        s.send_message(now, vec![i; 100], props(1, 7)).unwrap();
    }
    // Two bulk messages leave, then urgent ones are queued: they overtake
    // the rest of the queued bulk (late binding: nothing is committed early).
    let mut buf = Vec::new();
    let first = s.poll_transmit(now, &mut buf).unwrap();
    assert!(matches!(
        first.content,
        TransmitContent::Message { number: 0, .. }
    ));
    s.send_message(now, vec![9; 10], props(2, 0)).unwrap();
    s.send_message(now, vec![9; 10], props(2, 3)).unwrap();
    let frames = drain(&mut s, now);
    assert_eq!(message_numbers(&frames), vec![5, 6, 1, 2, 3, 4]);
    assert_eq!(frames[0].1.priority, Some(Priority::HIGHEST));
}

#[test]
fn round_robin_is_fair_by_bytes_across_substreams_and_streams() {
    let config = {
        let mut c = Config::default();
        c.chunk_size = 4096;
        c
    };
    let mut s = Session::new(Role::Client, config).unwrap();
    let now = Instant::now();
    drain(&mut s, now);
    // Raise the credit so the stream is not flow-control limited.
    s.handle_frame(
        now,
        control(ControlFrame::Params(control::Params {
            initial_max_data: Some(1 << 30),
            initial_max_stream_data: Some(1 << 30),
            initial_max_streams: Some(10),
            receive_formats: None,
            record_numbers: None,
        })),
    );
    // Sub-stream 1: 1000-byte messages; sub-stream 2: 4000-byte messages;
    // stream: 400 KiB of bulk. Same class.
    for _ in 0..400 {
        s.send_message(now, vec![1; 1000], props(1, 3)).unwrap();
    }
    for _ in 0..100 {
        s.send_message(now, vec![2; 4000], props(2, 3)).unwrap();
    }
    let id = s.open_stream().unwrap();
    assert_eq!(s.stream_write(id, &vec![3; 400_000]).unwrap(), 400_000);
    let frames = drain(&mut s, now);
    let mut bytes = [0usize; 3];
    for (f, _) in frames.iter().take(200) {
        let k = match f.header {
            FrameHeader::Message { substream, .. } => substream as usize - 1,
            FrameHeader::StreamChunk { .. } => 2,
            _ => continue,
        };
        bytes[k] += f.payload.len();
    }
    let max = *bytes.iter().max().unwrap();
    let min = *bytes.iter().min().unwrap();
    assert!(min > 0 && max - min <= 2 * 4096 + 4000, "unfair: {bytes:?}");
}

#[test]
fn expiry_drops_unless_a_live_message_depends() {
    let mut s = session(Role::Client);
    let t0 = Instant::now();
    drain(&mut s, t0);
    let short = |depends_on| MessageProps {
        lifetime: Some(Duration::from_millis(10)),
        depends_on,
        ..Default::default()
    };
    let a = s.send_message(t0, b"a".to_vec(), short(None)).unwrap();
    let b = s.send_message(t0, b"b".to_vec(), short(None)).unwrap();
    // c depends on b and lives long: b must survive its own deadline.
    let c = s
        .send_message(
            t0,
            b"c".to_vec(),
            MessageProps {
                depends_on: Some(b),
                lifetime: Some(Duration::from_secs(10)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_millis(10)));
    let t1 = t0 + Duration::from_millis(20);
    s.handle_timeout(t1);
    assert_eq!(statuses(&mut s), vec![(a, MessageStatus::Expired)]);
    let frames = drain(&mut s, t1);
    assert_eq!(message_numbers(&frames), vec![b, c]);
    assert_eq!(
        statuses(&mut s),
        vec![(b, MessageStatus::Sent), (c, MessageStatus::Sent)]
    );
    // A message depending on an expired, dropped one expires at once.
    let d = s.send_message(t1, b"d".to_vec(), short(Some(a))).unwrap();
    assert_eq!(statuses(&mut s), vec![(d, MessageStatus::Expired)]);
    assert_eq!(s.stats().messages_expired, 2);
}

#[test]
fn dependency_chain_is_dropped_when_its_last_dependent_expires() {
    let mut s = session(Role::Client);
    let t0 = Instant::now();
    drain(&mut s, t0);
    let p = |ms, dep| MessageProps {
        lifetime: Some(Duration::from_millis(ms)),
        depends_on: dep,
        ..Default::default()
    };
    let x = s.send_message(t0, b"x".to_vec(), p(10, None)).unwrap();
    let y = s.send_message(t0, b"y".to_vec(), p(20, Some(x))).unwrap();
    let z = s.send_message(t0, b"z".to_vec(), p(30, Some(y))).unwrap();
    s.handle_timeout(t0 + Duration::from_millis(25));
    assert!(statuses(&mut s).is_empty(), "x and y are kept for z");
    s.handle_timeout(t0 + Duration::from_millis(35));
    assert_eq!(
        statuses(&mut s),
        vec![
            (z, MessageStatus::Expired),
            (y, MessageStatus::Expired),
            (x, MessageStatus::Expired)
        ]
    );
    assert!(data_frames(drain(&mut s, t0 + Duration::from_millis(35))).is_empty());
}

#[test]
fn sending_a_dependent_pins_its_dependency() {
    let mut s = session(Role::Client);
    let t0 = Instant::now();
    drain(&mut s, t0);
    let x = s
        .send_message(
            t0,
            b"x".to_vec(),
            MessageProps {
                priority: Priority::LOWEST,
                lifetime: Some(Duration::from_millis(5)),
                ..Default::default()
            },
        )
        .unwrap();
    let y = s
        .send_message(
            t0,
            b"y".to_vec(),
            MessageProps {
                priority: Priority::HIGHEST,
                depends_on: Some(x),
                ..Default::default()
            },
        )
        .unwrap();
    // y goes first (more urgent); x is past its deadline but the receiver
    // needs it for y, so it is still sent.
    let frames = drain(&mut s, t0 + Duration::from_millis(50));
    assert_eq!(message_numbers(&frames), vec![y, x]);
}

#[test]
fn squash_replaces_queued_messages_with_the_same_key() {
    let mut s = session(Role::Client);
    let now = Instant::now();
    drain(&mut s, now);
    let sq = |key| MessageProps {
        squash_key: Some(key),
        ..Default::default()
    };
    let a = s.send_message(now, b"pos 1".to_vec(), sq(1)).unwrap();
    let b = s.send_message(now, b"other".to_vec(), sq(2)).unwrap();
    let c = s.send_message(now, b"pos 2".to_vec(), sq(1)).unwrap();
    let d = s.send_message(now, b"pos 3".to_vec(), sq(1)).unwrap();
    let frames = drain(&mut s, now);
    assert_eq!(message_numbers(&frames), vec![b, d]);
    let st = statuses(&mut s);
    assert!(st.contains(&(a, MessageStatus::Squashed)));
    assert!(st.contains(&(c, MessageStatus::Squashed)));
    // A sent message is never squashed.
    let e = s.send_message(now, b"pos 4".to_vec(), sq(1)).unwrap();
    assert_eq!(message_numbers(&drain(&mut s, now)), vec![e]);
    // A squashed message that a queued one depends on stays.
    let f = s.send_message(now, b"key".to_vec(), sq(5)).unwrap();
    let g = s
        .send_message(
            now,
            b"dep".to_vec(),
            MessageProps {
                depends_on: Some(f),
                ..Default::default()
            },
        )
        .unwrap();
    let h = s.send_message(now, b"key2".to_vec(), sq(5)).unwrap();
    assert_eq!(message_numbers(&drain(&mut s, now)), vec![f, g, h]);
}

proptest! {
    /// Every message ends in exactly one status; nothing dropped is sent;
    /// expired messages without kept dependents are never on the wire; the
    /// queue ends empty.
    #[test]
    fn every_message_gets_one_status(
        ops in proptest::collection::vec(
            (0u8..8, 0u64..3, proptest::option::of(0u64..50), proptest::option::of(0u64..4),
             proptest::option::of(1u64..40), 0u8..4),
            1..120),
    ) {
        let mut s = session(Role::Client);
        let t0 = Instant::now();
        let mut now = t0;
        let mut sent = Vec::new();
        let mut numbers = Vec::new();
        drain(&mut s, now);
        for (urgency, substream, lifetime, squash, dep_back, action) in ops {
            let depends_on = dep_back.and_then(|b| numbers.len().checked_sub(b as usize)).map(|i| numbers[i]);
            let p = MessageProps {
                substream,
                priority: Priority::new(urgency).unwrap(),
                lifetime: lifetime.map(Duration::from_millis),
                depends_on,
                squash_key: squash,
                safely_replayable: false,
                path: None,
            };
            numbers.push(s.send_message(now, vec![urgency; 10], p).unwrap());
            now += Duration::from_millis(3);
            match action {
                0 => sent.extend(message_numbers(&drain(&mut s, now))),
                1 => {
                    let mut buf = Vec::new();
                    if let Some(t) = s.poll_transmit(now, &mut buf)
                        && let TransmitContent::Message { number, .. } = t.content {
                        sent.push(number);
                    }
                }
                _ => s.handle_timeout(now),
            }
        }
        now += Duration::from_secs(1);
        sent.extend(message_numbers(&drain(&mut s, now)));
        prop_assert_eq!(s.queued_message_bytes(), 0);
        let st = statuses(&mut s);
        let mut seen = std::collections::HashMap::new();
        for (n, status) in &st {
            prop_assert!(seen.insert(*n, *status).is_none(), "two statuses for {}", n);
        }
        prop_assert_eq!(seen.len(), numbers.len());
        for n in &sent {
            prop_assert_eq!(seen[n], MessageStatus::Sent);
        }
        prop_assert_eq!(sent.len(), st.iter().filter(|(_, s)| *s == MessageStatus::Sent).count());
    }
}

#[test]
fn message_dedup_and_delivery() {
    let mut s = session(Role::Server);
    let now = Instant::now();
    let msg = |n: u64| Frame {
        header: FrameHeader::Message {
            substream: 4,
            number: n,
        },
        payload: vec![n as u8; 3].into(),
    };
    for n in [0, 2, 1, 2, 0, 5, 5, 3] {
        s.handle_frame(now, msg(n));
    }
    let got: Vec<u64> = std::iter::from_fn(|| s.poll_message())
        .map(|m| m.number)
        .collect();
    assert_eq!(got, vec![0, 2, 1, 5, 3]);
    assert_eq!(s.stats().duplicate_messages, 3);
    // Far beyond the window, an old number counts as a duplicate.
    s.handle_frame(now, msg(1_000_000));
    s.handle_frame(now, msg(4));
    assert_eq!(s.poll_message().unwrap().number, 1_000_000);
    assert!(s.poll_message().is_none());
}

/// Empty messages still take a record in each queue: both limits count it, so neither an
/// application queueing them nor a peer sending them to an application that does not read
/// can grow memory without bound.
#[test]
fn empty_messages_fill_both_queues() {
    let mut config = Config::default();
    config.message_send_queue = 64 * 1024;
    config.message_receive_queue = 64 * 1024;
    let per_queue = 64 * 1024 / MESSAGE_RECORD_BYTES;
    let now = Instant::now();

    let mut sender = Session::new(Role::Client, config.clone()).unwrap();
    let mut queued = 0;
    let full = loop {
        match sender.send_message(now, Vec::new(), MessageProps::default()) {
            Ok(_) => queued += 1,
            Err(e) => break e,
        }
        assert!(
            queued <= per_queue,
            "more empty messages queued than the limit allows"
        );
    };
    assert!(matches!(full, SendError::QueueFull { .. }), "{full:?}");
    assert_eq!(queued, per_queue);
    assert_eq!(
        sender.queued_message_bytes(),
        per_queue * MESSAGE_RECORD_BYTES
    );

    let mut receiver = Session::new(Role::Server, config).unwrap();
    let mut delivered = 0u64;
    while !receiver.receive_blocked() {
        assert!(
            delivered <= per_queue as u64,
            "the receive queue never blocked on empty messages"
        );
        receiver.handle_frame(
            now,
            Frame {
                header: FrameHeader::Message {
                    substream: 0,
                    number: delivered,
                },
                payload: Default::default(),
            },
        );
        delivered += 1;
    }
    assert_eq!(delivered, per_queue as u64);
    // Reading one unblocks it again.
    assert!(receiver.poll_message().is_some());
    assert!(!receiver.receive_blocked());
}

fn control(c: ControlFrame) -> Frame {
    let mut payload = Vec::new();
    c.encode(&mut payload).unwrap();
    Frame {
        header: FrameHeader::Control,
        payload: payload.into(),
    }
}

fn chunk(stream: u64, offset: u64, data: &[u8], fin: bool) -> Frame {
    Frame {
        header: FrameHeader::StreamChunk {
            stream,
            offset,
            fin,
        },
        payload: data.to_vec().into(),
    }
}

#[test]
fn stream_reassembly_from_out_of_order_duplicated_chunks() {
    let mut s = session(Role::Server);
    let now = Instant::now();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let order = [
        (3000, 6000),
        (0, 1000),
        (5000, 10_000),
        (500, 3500),
        (0, 10_000),
    ];
    for (a, b) in order {
        s.handle_frame(now, chunk(0, a, &data[a as usize..b as usize], b == 10_000));
    }
    assert_eq!(s.accept_stream(), Some(0));
    assert_eq!(read_stream(&mut s, 0), (data, true));
    assert!(s.error().is_none());
}

#[test]
fn flow_control_violations_close_with_typed_errors() {
    // Stream credit: default before PARAMS is the configured window.
    let mut s = session(Role::Server);
    let now = Instant::now();
    let w = Config::default().stream_receive_window;
    s.handle_frame(now, chunk(0, w - 1, b"ab", false));
    assert!(matches!(
        s.error(),
        Some(ConnectionError::ProtocolViolation(
            ProtocolError::StreamFlowControl { stream: 0, .. }
        ))
    ));
    let frames = drain(&mut s, now);
    let (f, _) = frames.last().unwrap();
    match ControlFrame::decode(&f.payload).unwrap() {
        ControlFrame::Close { code, .. } => assert_eq!(code, transport_code::FLOW_CONTROL_ERROR),
        other => panic!("{other:?}"),
    }
    assert!(s.is_send_finished());

    // Connection credit across several streams.
    let config = {
        let mut c = Config::default();
        c.connection_receive_window = 1 << 20;
        c.stream_receive_window = 1 << 20;
        c
    };
    let mut s = Session::new(Role::Server, config).unwrap();
    s.handle_frame(now, chunk(0, 0, &vec![0; 600_000], false));
    assert!(s.error().is_none());
    s.handle_frame(now, chunk(4, 0, &vec![0; 600_000], false));
    assert!(matches!(
        s.error(),
        Some(ConnectionError::ProtocolViolation(
            ProtocolError::ConnectionFlowControl { .. }
        ))
    ));

    // Stream limit, unknown control type, data on an unopened local stream.
    let mut s = session(Role::Server);
    s.handle_frame(now, chunk(2 * 100, 0, b"x", false));
    assert!(matches!(
        s.error(),
        Some(ConnectionError::ProtocolViolation(
            ProtocolError::StreamLimit { .. }
        ))
    ));
    let mut s = session(Role::Server);
    s.handle_frame(
        now,
        Frame {
            header: FrameHeader::Control,
            payload: vec![0x3e, 1, 2].into(),
        },
    );
    assert!(matches!(
        s.error(),
        Some(ConnectionError::ProtocolViolation(ProtocolError::Control(
            control::ControlError::UnknownType(0x3e)
        )))
    ));
    let mut s = session(Role::Server);
    s.handle_frame(now, chunk(1, 0, b"x", false));
    assert!(matches!(
        s.error(),
        Some(ConnectionError::ProtocolViolation(
            ProtocolError::StreamState { .. }
        ))
    ));
}

#[test]
fn flow_control_accounting_and_credit_updates() {
    let small = {
        let mut c = Config::default();
        c.stream_receive_window = 64 * 1024;
        c.connection_receive_window = 96 * 1024;
        c.chunk_size = 8 * 1024;
        c
    };
    let mut p = Pair::with(Config::default(), small);
    p.settle();
    let id = p.a.open_stream().unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let mut written = 0;
    let mut got = Vec::new();
    let mut rounds = 0;
    while got.len() < data.len() {
        rounds += 1;
        assert!(rounds < 10_000);
        if written < data.len() {
            written += p.a.stream_write(id, &data[written..]).unwrap();
            if written == data.len() {
                p.a.stream_finish(id).unwrap();
            }
        }
        p.step();
        p.b.accept_stream();
        // The receiver never buffers more than its window.
        assert!(p.b.stream_readable_bytes(id) <= 64 * 1024);
        // Read slowly: at most 20 KiB per round.
        let mut buf = vec![0u8; 20 * 1024];
        if let Ok(ReadOutcome::Data(n)) = p.b.stream_read(id, &mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
    }
    assert_eq!(got, data);
    let mut buf = [0u8; 10];
    p.settle();
    assert_eq!(p.b.stream_read(id, &mut buf), Ok(ReadOutcome::Finished));
    assert!(p.a.error().is_none() && p.b.error().is_none());
}

#[test]
fn one_blocked_stream_does_not_starve_another() {
    let mut p = Pair::new();
    p.settle();
    let s1 = p.a.open_stream().unwrap();
    let s2 = p.a.open_stream().unwrap();
    // s1: more than the peer's stream window; nobody reads it.
    let big = vec![1u8; 3 << 20];
    let mut w = 0;
    for _ in 0..10 {
        w += p.a.stream_write(s1, &big[w..]).unwrap();
        p.settle();
    }
    assert!(w < big.len(), "s1 must be blocked by flow control");
    p.a.stream_write(s2, b"hello").unwrap();
    p.a.stream_finish(s2).unwrap();
    p.settle();
    let mut ids = vec![p.b.accept_stream().unwrap(), p.b.accept_stream().unwrap()];
    ids.sort();
    assert_eq!(ids, vec![s1, s2]);
    assert_eq!(read_stream(&mut p.b, s2), (b"hello".to_vec(), true));
    assert!(p.b.stream_readable_bytes(s1) <= Config::default().stream_receive_window as usize);
}

#[test]
fn loopback_in_virtual_time_messages_and_streams() {
    let mut p = Pair::new();
    p.batch = 3000; // small pipe batches interleave the two directions
    let mut sent = Vec::new();
    for i in 0..200u32 {
        let payload = format!("message {i}").into_bytes();
        let n =
            p.a.send_message(
                p.now,
                payload.clone(),
                props(u64::from(i % 3), (i % 8) as u8),
            )
            .unwrap();
        sent.push((n, payload));
    }
    let ids: Vec<StreamId> = (0..4).map(|_| p.a.open_stream().unwrap()).collect();
    let blobs: Vec<Vec<u8>> = (0..4u8)
        .map(|k| (0..300_000u32).map(|i| (i as u8) ^ k).collect())
        .collect();
    let mut written = [0usize; 4];
    let mut received: Vec<Vec<u8>> = vec![Vec::new(); 4];
    let mut done = [false; 4];
    let mut accepted = Vec::new();
    for _ in 0..100_000 {
        for k in 0..4 {
            if written[k] < blobs[k].len() {
                written[k] += p.a.stream_write(ids[k], &blobs[k][written[k]..]).unwrap();
                if written[k] == blobs[k].len() {
                    p.a.stream_finish(ids[k]).unwrap();
                }
            }
        }
        let moved = p.step();
        while let Some(id) = p.b.accept_stream() {
            accepted.push(id);
        }
        for k in 0..4 {
            if !done[k] && accepted.contains(&ids[k]) {
                let (d, fin) = read_stream(&mut p.b, ids[k]);
                received[k].extend(d);
                done[k] = fin;
            }
        }
        p.now += Duration::from_millis(1);
        if !moved && done.iter().all(|d| *d) {
            break;
        }
    }
    assert_eq!(received, blobs);
    let mut got: Vec<(u64, Vec<u8>)> = std::iter::from_fn(|| p.b.poll_message())
        .map(|m| (m.number, m.payload.to_vec()))
        .collect();
    got.sort();
    assert_eq!(got, sent);
    assert_eq!(p.a.stats().messages_sent, 200);
}

#[test]
fn graceful_close_flushes_then_both_ends_see_it() {
    let mut p = Pair::new();
    let id = p.a.open_stream().unwrap();
    p.a.stream_write(id, &vec![5u8; 10_000]).unwrap();
    p.a.stream_finish(id).unwrap();
    for i in 0..10u8 {
        p.a.send_message(p.now, vec![i], MessageProps::default())
            .unwrap();
    }
    p.a.close(0, b"bye");
    assert_eq!(
        p.a.send_message(p.now, vec![], MessageProps::default()),
        Err(SendError::Closing)
    );
    p.settle();
    assert_eq!(p.a.error(), Some(&ConnectionError::LocallyClosed));
    assert_eq!(
        p.b.error(),
        Some(&ConnectionError::ApplicationClosed {
            code: 0,
            reason: "bye".into()
        })
    );
    // Everything sent before the close is readable after it.
    assert_eq!(std::iter::from_fn(|| p.b.poll_message()).count(), 10);
    assert!(p.b.is_drained());
    assert!(!p.a.is_drained());
    p.a.handle_transport_closed(p.now, TransportError::PeerClosed);
    assert!(p.a.is_drained());
    assert_eq!(p.a.error(), Some(&ConnectionError::LocallyClosed));
}

#[test]
fn a_graceful_close_the_peer_never_answered_is_an_error() {
    // The peer never sent a frame, not even PARAMS (it is no squarepeg session, or one that
    // runs TLS while this side does not): when its end arrives after this side's graceful
    // close, the close does not count as clean — nothing sent here was taken.
    for (reason, want) in [
        (TransportError::PeerClosed, TransportError::NothingReceived),
        (TransportError::Reset, TransportError::Reset),
    ] {
        let now = Instant::now();
        let mut a = session(Role::Client);
        a.send_message(now, b"hello".to_vec(), MessageProps::default())
            .unwrap();
        a.close(0, b"");
        assert!(!drain(&mut a, now).is_empty());
        assert_eq!(a.error(), Some(&ConnectionError::LocallyClosed));
        a.handle_transport_closed(now, reason);
        assert!(a.is_drained());
        assert_eq!(a.error(), Some(&ConnectionError::Transport(want)));
    }
    // A peer that neither answers nor ends the connection: the same, at the drain timeout.
    let now = Instant::now();
    let mut a = session(Role::Client);
    a.close(0, b"");
    assert!(!drain(&mut a, now).is_empty());
    let deadline = a.poll_timeout().expect("the drain timer");
    a.handle_timeout(deadline);
    assert!(a.is_drained());
    assert_eq!(
        a.error(),
        Some(&ConnectionError::Transport(TransportError::NothingReceived))
    );
    // The peer's PARAMS arriving only while this side drains: it answered, the close is
    // clean.
    let now = Instant::now();
    let mut a = session(Role::Client);
    let mut b = session(Role::Server);
    a.close(0, b"");
    assert!(!drain(&mut a, now).is_empty());
    for (frame, _) in drain(&mut b, now) {
        a.handle_frame(now, frame);
    }
    a.handle_transport_closed(now, TransportError::PeerClosed);
    assert_eq!(a.error(), Some(&ConnectionError::LocallyClosed));
}

#[test]
fn abort_discards_and_reports() {
    let mut p = Pair::new();
    p.settle();
    let n =
        p.a.send_message(p.now, vec![1; 10], MessageProps::default())
            .unwrap();
    p.a.abort(p.now, 42, b"gone");
    assert!(statuses(&mut p.a).contains(&(n, MessageStatus::Discarded)));
    p.settle();
    assert_eq!(p.a.error(), Some(&ConnectionError::LocallyAborted(42)));
    assert_eq!(
        p.b.error(),
        Some(&ConnectionError::ApplicationClosed {
            code: 42,
            reason: "gone".into()
        })
    );
    assert!(p.b.poll_message().is_none());
    // The drain timer ends a close the peer never answers.
    assert_eq!(
        p.a.poll_timeout(),
        Some(p.now + Config::default().drain_timeout)
    );
    p.a.handle_timeout(p.now + Duration::from_secs(10));
    assert!(p.a.is_drained());
}

#[test]
fn peer_misbehaviour_is_typed_on_both_ends() {
    let mut p = Pair::new();
    p.settle();
    // A corrupted frame (bad CRC) on the in-order stream.
    let mut wire = Vec::new();
    encode_frame(
        &FrameHeader::Message {
            substream: 0,
            number: 0,
        },
        b"payload",
        &mut wire,
    )
    .unwrap();
    wire[5] ^= 0x40;
    p.dec_b.push(&wire);
    while let Some(f) = p.dec_b.next_frame() {
        match f {
            Ok(f) => p.b.handle_frame(p.now, f),
            Err(e) => p.b.handle_decode_error(p.now, e),
        }
    }
    p.settle();
    assert!(matches!(
        p.b.error(),
        Some(ConnectionError::ProtocolViolation(ProtocolError::Frame(_)))
    ));
    match p.a.error() {
        Some(ConnectionError::PeerError { code, reason }) => {
            assert_eq!(*code, transport_code::FRAME_ERROR);
            assert!(!reason.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        p.a.send_message(p.now, vec![], MessageProps::default()),
        Err(SendError::Connection(p.a.error().unwrap().clone()))
    );
}

#[test]
fn reset_and_stop_sending() {
    let mut p = Pair::new();
    p.settle();
    let id = p.a.open_stream().unwrap();
    p.a.stream_write(id, &[1; 1000]).unwrap();
    p.settle();
    p.a.stream_reset(id, 7).unwrap();
    p.settle();
    assert_eq!(p.b.accept_stream(), Some(id));
    let mut buf = [0u8; 100];
    assert_eq!(
        p.b.stream_read(id, &mut buf),
        Err(StreamError::Reset { id, code: 7 })
    );
    // STOP_SENDING: the writer's next write fails with the code.
    let id2 = p.a.open_stream().unwrap();
    p.a.stream_write(id2, b"abc").unwrap();
    p.settle();
    assert_eq!(p.b.accept_stream(), Some(id2));
    p.b.stream_stop(id2, 9).unwrap();
    p.settle();
    assert_eq!(
        p.a.stream_write(id2, b"more"),
        Err(StreamError::Stopped { id: id2, code: 9 })
    );
    assert!(p.a.error().is_none() && p.b.error().is_none());
}

#[test]
fn stream_limit_and_release() {
    let config = {
        let mut c = Config::default();
        c.max_concurrent_peer_streams = 8;
        c
    };
    let mut p = Pair::with(Config::default(), config);
    p.settle();
    let ids: Vec<StreamId> = (0..8).map(|_| p.a.open_stream().unwrap()).collect();
    assert_eq!(p.a.open_stream(), Err(StreamError::StreamsBlocked));
    for &id in &ids {
        p.a.stream_finish(id).unwrap();
        p.a.stream_release(id);
    }
    p.settle();
    // The receiver reads each to the end and lets go: the peer may open more.
    while let Some(id) = p.b.accept_stream() {
        assert_eq!(read_stream(&mut p.b, id), (vec![], true));
        p.b.stream_release(id);
    }
    p.settle();
    let mut more = 0;
    while p.a.open_stream().is_ok() {
        more += 1;
    }
    assert_eq!(more, 8);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Over the out-of-order substrate frames arrive reordered and more
    /// than once: streams still deliver exactly the bytes written, in
    /// order, and every message arrives exactly once.
    #[test]
    fn reordered_and_duplicated_frames(
        seed in any::<u64>(),
        window in 1usize..12,
        dup_percent in 0u64..40,
        chunk in 200usize..5000,
        messages in 0usize..80,
    ) {
        let config = {
            let mut c = Config::default();
            c.chunk_size = chunk;
            c
        };
        let mut a = Session::new(Role::Client, config).unwrap();
        let mut b = session(Role::Server);
        let now = Instant::now();
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let blobs: Vec<Vec<u8>> = (0..3u8)
            .map(|k| (0..60_000u32).map(|i| (i.wrapping_mul(31) as u8) ^ k).collect())
            .collect();
        let ids: Vec<StreamId> = (0..3).map(|_| a.open_stream().unwrap()).collect();
        let mut written = [0usize; 3];
        let mut sent = Vec::new();
        for i in 0..messages {
            sent.push(a.send_message(now, vec![i as u8; i * 7], props(i as u64 % 4, (i % 8) as u8)).unwrap());
        }
        let mut in_flight: Vec<Frame> = Vec::new();
        let mut got: Vec<Vec<u8>> = vec![Vec::new(); 3];
        let mut fin = [false; 3];
        let mut msgs = Vec::new();
        let mut buf = Vec::new();
        let mut dec = StreamDecoder::new(DEFAULT_MAX_BODY);
        let mut back = StreamDecoder::new(DEFAULT_MAX_BODY);
        for _round in 0..20_000 {
            for k in 0..3 {
                if written[k] < blobs[k].len() {
                    written[k] += a.stream_write(ids[k], &blobs[k][written[k]..]).unwrap();
                    if written[k] == blobs[k].len() {
                        a.stream_finish(ids[k]).unwrap();
                    }
                }
            }
            buf.clear();
            while buf.len() < 20_000 && a.poll_transmit(now, &mut buf).is_some() {}
            dec.push(&buf);
            while let Some(f) = dec.next_frame() {
                in_flight.push(f.unwrap());
            }
            // Deliver a few frames, each picked among the first `window`.
            for _ in 0..4 {
                if in_flight.is_empty() {
                    break;
                }
                let i = (next() as usize) % in_flight.len().min(window);
                let f = if next() % 100 < dup_percent { in_flight[i].clone() } else { in_flight.remove(i) };
                b.handle_frame(now, f);
            }
            prop_assert!(b.error().is_none(), "{:?}", b.error());
            while let Some(id) = b.accept_stream() {
                prop_assert!(ids.contains(&id));
            }
            for k in 0..3 {
                if !fin[k] && let Ok(ReadOutcome::Data(_) | ReadOutcome::Finished | ReadOutcome::Blocked) = b.stream_read(ids[k], &mut []) {
                    let (d, f) = read_stream(&mut b, ids[k]);
                    got[k].extend(d);
                    fin[k] = f;
                }
            }
            while let Some(m) = b.poll_message() {
                msgs.push(m.number);
            }
            // Credit flows back in order.
            buf.clear();
            while b.poll_transmit(now, &mut buf).is_some() {}
            back.push(&buf);
            while let Some(f) = back.next_frame() {
                a.handle_frame(now, f.unwrap());
            }
            if fin.iter().all(|f| *f) && in_flight.is_empty() && msgs.len() >= sent.len() {
                break;
            }
        }
        prop_assert_eq!(&got, &blobs);
        msgs.sort();
        prop_assert_eq!(msgs, sent);
        prop_assert!(a.error().is_none());
    }
}

#[test]
fn stream_priorities_and_messages_share_the_scheduler() {
    let config = {
        let mut c = Config::default();
        c.chunk_size = 1000;
        c
    };
    let mut s = Session::new(Role::Client, config).unwrap();
    let now = Instant::now();
    drain(&mut s, now);
    let bulk = s.open_stream().unwrap();
    s.set_stream_priority(bulk, Priority::LOWEST).unwrap();
    s.stream_write(bulk, &[0u8; 10_000]).unwrap();
    // Two bulk chunks leave, then an urgent stream and message arrive.
    let mut buf = Vec::new();
    s.poll_transmit(now, &mut buf).unwrap();
    s.poll_transmit(now, &mut buf).unwrap();
    let urgent = s.open_stream().unwrap();
    s.set_stream_priority(urgent, Priority::HIGHEST).unwrap();
    s.stream_write(urgent, &[1u8; 2500]).unwrap();
    s.stream_finish(urgent).unwrap();
    let n = s.send_message(now, b"mid".to_vec(), props(0, 4)).unwrap();
    let order: Vec<String> = data_frames(drain(&mut s, now))
        .iter()
        .map(|(f, _)| match f.header {
            FrameHeader::StreamChunk { stream, .. } if stream == urgent => "U".into(),
            FrameHeader::StreamChunk { .. } => "b".into(),
            FrameHeader::Message { number, .. } => {
                assert_eq!(number, n);
                "m".into()
            }
            _ => unreachable!(),
        })
        .collect();
    // Urgent stream (3 chunks incl. FIN), then the urgency-4 message, then
    // the remaining 8 bulk chunks.
    assert_eq!(order.concat(), "UUUmbbbbbbbb");
}

/// One session's load for the batch test: messages of several classes
/// and sub-streams (some with lifetimes, dependencies and squash keys),
/// a stream, and the peer's credit.
fn loaded_session(now: Instant, ops: &[(u8, u8, u16, u8)]) -> Session {
    let config = {
        let mut c = Config::default();
        c.chunk_size = 1500;
        c
    };
    let mut s = Session::new(Role::Client, config).unwrap();
    s.handle_frame(
        now,
        control(ControlFrame::Params(control::Params {
            initial_max_data: Some(1 << 30),
            initial_max_stream_data: Some(1 << 30),
            initial_max_streams: Some(10),
            receive_formats: None,
            record_numbers: None,
        })),
    );
    let id = s.open_stream().unwrap();
    for (i, op @ &(_, substream, len, extra)) in ops.iter().enumerate() {
        if extra % 8 == 3 {
            s.stream_write(id, &vec![7; usize::from(len)]).unwrap();
            continue;
        }
        let _ = s.send_message(now, vec![substream; usize::from(len)], op_props(i, op));
    }
    s
}

/// The properties of message `i` of a generated load: its class and sub-stream, and by
/// `extra` a lifetime, a dependency on the message before or a squash key.
fn op_props(i: usize, &(urgency, substream, len, extra): &(u8, u8, u16, u8)) -> MessageProps {
    let mut p = props(u64::from(substream % 3), urgency % 4);
    match extra % 8 {
        0 => p.lifetime = Some(Duration::from_millis(u64::from(len % 3))),
        1 if i > 0 => p.depends_on = Some(i as u64 - 1),
        2 => p.squash_key = Some(u64::from(substream % 2)),
        _ => {}
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `poll_transmit_batch` writes exactly the bytes, and leaves exactly
    /// the events, that repeated `poll_transmit` calls do, whatever the
    /// batch limits.
    #[test]
    fn batch_transmit_equals_single_frames(
        ops in proptest::collection::vec((0u8..8, 0u8..6, 0u16..3000, 0u8..16), 1..200),
        limits in proptest::collection::vec(1usize..20_000, 1..50),
    ) {
        let start = Instant::now();
        let now = start + Duration::from_millis(1);
        let mut single = loaded_session(start, &ops);
        let mut batched = loaded_session(start, &ops);
        let mut one = Vec::new();
        while single.poll_transmit(now, &mut one).is_some() {}
        let mut many = Vec::new();
        let mut frames = 0;
        for limit in limits.iter().cycle() {
            let until = many.len() + limit;
            let n = batched.poll_transmit_batch(now, &mut many, until);
            frames += n;
            if n == 0 {
                break;
            }
        }
        prop_assert_eq!(&one, &many);
        prop_assert_eq!(single.stats(), batched.stats());
        prop_assert_eq!(frames as u64, batched.stats().frames_sent);
        let mut events_single = Vec::new();
        while let Some(e) = single.poll_event() {
            events_single.push(e);
        }
        let mut events_batched = Vec::new();
        while let Some(e) = batched.poll_event() {
            events_batched.push(e);
        }
        prop_assert_eq!(events_single, events_batched);
    }
}

/// `use_plain_frames`: both directions are plain from the first byte (no Switch, no
/// announcement), messages go through, and a Switch from the peer is a protocol violation.
#[test]
fn plain_frames_from_the_start() {
    use squarepeg_framing::{FrameFormat, FrameReader};
    let now = Instant::now();
    let (mut a, mut b) = (session(Role::Client), session(Role::Server));
    a.use_plain_frames();
    b.use_plain_frames();
    let mut into_b = FrameReader::new(DEFAULT_MAX_BODY);
    into_b.start_plain();
    for i in 0..5u8 {
        a.send_message(now, vec![i; 100 * i as usize], MessageProps::default())
            .unwrap();
    }
    let mut wire = Vec::new();
    a.poll_transmit_batch(now, &mut wire, usize::MAX);
    // The first byte is a plain frame's length, not a uCOBS marker.
    assert_ne!(wire[0], 0);
    into_b.push(&wire);
    while let Some(f) = into_b.next_frame() {
        b.handle_frame(now, f.unwrap());
    }
    let got: Vec<usize> = std::iter::from_fn(|| b.poll_message())
        .map(|m| m.payload.len())
        .collect();
    assert_eq!(got, vec![0, 100, 200, 300, 400]);
    assert_eq!(a.stats().send_format, FrameFormat::Plain);
    assert_eq!(b.stats().receive_format, FrameFormat::Plain);
    b.handle_frame(
        now,
        Frame {
            header: FrameHeader::Switch {
                format: FrameFormat::Plain.id(),
            },
            payload: Default::default(),
        },
    );
    assert!(matches!(
        b.error(),
        Some(ConnectionError::ProtocolViolation(
            ProtocolError::UnexpectedSwitch { .. }
        ))
    ));
}

#[test]
fn records_replaced_goes_only_to_an_out_of_order_reader_of_numbered_records() {
    let now = Instant::now();
    let replaced = ControlFrame::RecordsReplaced {
        start: 1000,
        len: 300,
    };
    // A side that reads records out of order asked for these: it keeps them for its record
    // layer.
    let mut reader = session(Role::Server);
    reader.announce_record_numbers(
        control::record_numbers::READS | control::record_numbers::OUT_OF_ORDER,
    );
    reader.handle_frame(now, control(replaced.clone()));
    assert!(reader.error().is_none());
    assert_eq!(reader.take_records_replaced(), vec![1000..1300]);
    assert!(reader.take_records_replaced().is_empty());
    // One that did not ask closes with PROTOCOL_VIOLATION.
    let mut other = session(Role::Server);
    other.announce_record_numbers(control::record_numbers::READS);
    other.handle_frame(now, control(replaced));
    assert!(matches!(
        other.error(),
        Some(ConnectionError::ProtocolViolation(
            ProtocolError::UnexpectedControl { frame_type: 0x09 }
        ))
    ));
    // The sender announces only to a peer that asked (its PARAMS, bit 1).
    let mut sender = session(Role::Client);
    sender.announce_records_replaced(0..100);
    assert!(!drain(&mut sender, now).iter().any(|(f, _)| {
        f.header == FrameHeader::Control
            && matches!(
                ControlFrame::decode(&f.payload),
                Ok(ControlFrame::RecordsReplaced { .. })
            )
    }));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `send_admitted_messages` queues exactly what one `send_admitted_message` call per
    /// message would: the same bytes go out, with the same statuses and counters, for any
    /// mix of flows, lifetimes, dependencies and squash keys, taken in batches of any size.
    #[test]
    fn batch_queueing_equals_single_messages(
        ops in proptest::collection::vec((0u8..8, 0u8..6, 0u16..3000, 0u8..16), 1..200),
        batches in proptest::collection::vec(1usize..40, 1..20),
    ) {
        let start = Instant::now();
        let message = |i: usize, op @ &(_, substream, len, extra): &(u8, u8, u16, u8)| {
            let mut p = op_props(i, op);
            p.safely_replayable = extra % 8 == 3;
            (start, Bytes::from(vec![substream; usize::from(len)]), p)
        };
        let mut single = session(Role::Client);
        let mut batched = session(Role::Client);
        for (i, op) in ops.iter().enumerate() {
            let (now, payload, p) = message(i, op);
            prop_assert_eq!(single.send_admitted_message(now, payload, p).unwrap(), i as u64);
        }
        let mut all = ops.iter().enumerate().map(|(i, op)| message(i, op));
        for &n in batches.iter().cycle() {
            let (taken, refused) = batched.send_admitted_messages(all.by_ref().take(n));
            prop_assert!(refused.is_none());
            if taken == 0 {
                break;
            }
        }
        prop_assert_eq!(batched.next_message_number(), ops.len() as u64);
        prop_assert_eq!(single.queued_message_bytes(), batched.queued_message_bytes());
        let now = start + Duration::from_millis(1);
        let (mut one, mut many) = (Vec::new(), Vec::new());
        while single.poll_transmit(now, &mut one).is_some() {}
        while batched.poll_transmit(now, &mut many).is_some() {}
        prop_assert_eq!(&one, &many);
        prop_assert_eq!(single.stats(), batched.stats());
        prop_assert_eq!(statuses(&mut single), statuses(&mut batched));
    }
}

/// A closing session takes nothing from a batch and says why; what it took before stays.
#[test]
fn a_closing_session_refuses_a_batch() {
    let now = Instant::now();
    let mut s = session(Role::Client);
    let batch =
        |n: usize| (0..n).map(move |_| (now, Bytes::from_static(b"m"), MessageProps::default()));
    assert_eq!(s.send_admitted_messages(batch(3)), (3, None));
    s.close(0, b"");
    let (taken, refused) = s.send_admitted_messages(batch(2));
    assert_eq!(taken, 0);
    assert!(matches!(refused, Some(SendError::Closing)), "{refused:?}");
    assert_eq!(s.next_message_number(), 3);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Messages handed over as runs (`handle_message_run`, consecutive MESSAGE frames as
    /// the plain reader finds them) are received exactly as the same frames handed over one
    /// by one: the same messages taken in the same order, duplicates dropped alike, the same
    /// counters, events and receive-queue state after every step, whatever the numbering
    /// (in order, gaps, repeats, numbers older than the window) and however the taking of
    /// messages interleaves with the runs.
    #[test]
    fn message_runs_are_received_as_single_frames(
        steps in proptest::collection::vec(
            (proptest::collection::vec((0u8..3, 0u8..4, 0usize..200), 0..40), 0usize..50),
            1..30,
        ),
    ) {
        let now = Instant::now();
        let mut config = Config::default();
        config.message_receive_queue = 4096;
        let mut single = Session::new(Role::Server, config.clone()).unwrap();
        let mut runs = Session::new(Role::Server, config).unwrap();
        let mut next = 0u64;
        let (mut got_single, mut got_runs) = (Vec::new(), Vec::new());
        for (messages, take) in steps {
            let mut wire = Vec::new();
            for (i, &(substream, numbering, len)) in messages.iter().enumerate() {
                // Mostly the next number; sometimes a gap, a repeat, or a number long past.
                let number = match numbering {
                    0 | 1 => next,
                    2 => next + 3,
                    _ => next.saturating_sub(1 + (i as u64 % 5) * 3000),
                };
                next = next.max(number + 1);
                let header = FrameHeader::Message { substream: u64::from(substream), number };
                let payload = vec![substream; len];
                squarepeg_framing::encode_plain_frame(&header, &payload, &mut wire).unwrap();
            }
            let mut reader = squarepeg_framing::FrameReader::new(DEFAULT_MAX_BODY);
            reader.start_plain();
            reader.push(&wire);
            while let Some(d) = reader.next_decoded() {
                match d {
                    squarepeg_framing::Decoded::Messages(run) => {
                        let mut copy = run.clone();
                        while let Some(f) = copy.pop_frame() {
                            single.handle_frame(now, f);
                        }
                        runs.handle_message_run(run);
                    }
                    squarepeg_framing::Decoded::Frame(f) => {
                        let f = f.unwrap();
                        single.handle_frame(now, f.clone());
                        runs.handle_frame(now, f);
                    }
                }
            }
            for _ in 0..take {
                got_single.extend(single.poll_message());
                got_runs.extend(runs.poll_message());
            }
            prop_assert_eq!(&got_single, &got_runs);
            prop_assert_eq!(single.stats(), runs.stats());
            prop_assert_eq!(single.receive_blocked(), runs.receive_blocked());
            prop_assert_eq!(single.received_message_bytes(), runs.received_message_bytes());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            while let Some(e) = single.poll_event() { a.push(e); }
            while let Some(e) = runs.poll_event() { b.push(e); }
            prop_assert_eq!(a, b);
        }
        while let Some(m) = single.poll_message() {
            got_single.push(m);
        }
        while let Some(m) = runs.poll_message() {
            got_runs.push(m);
        }
        prop_assert_eq!(got_single, got_runs);
    }
}
