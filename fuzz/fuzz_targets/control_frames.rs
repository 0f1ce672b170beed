//! squarepeg-session's control frames (docs/wire.md §2): the codec, and a session fed what a
//! peer can send.
//!
//! The input is a session set-up and a sequence of operations: control frames built from the
//! input (any type and field values, stream ids among the ones in use or anywhere, reasons of
//! any length), arbitrary bodies as control frames, repeats of earlier frames (duplicates,
//! reordering), stream chunks and messages from the peer (header values within the varint
//! range, as the frame decoder yields them), the application's stream and message calls, time
//! advances, a graceful close and an abort.
//!
//! Always:
//! - no panic (debug assertions on: overflows are bugs);
//! - codec: a body that decodes re-encodes to a body no longer than it that decodes to the same
//!   frame; a built frame encodes unless a value exceeds the varint range (then
//!   `ValueTooLarge`), and decodes back equal (its reason cut to `MAX_REASON_LEN`);
//! - errors are typed: a control body that does not decode closes an open session with
//!   `ProtocolViolation(Control(e))`, `e` the decoder's error; a CLOSE or APPLICATION_CLOSE
//!   on an open session closes it with the peer's code and reason; once closed, the error
//!   never changes;
//! - memory bounded: received stream bytes within the stream window, queued messages within
//!   the send queue limit, RECORDS_REPLACED ranges within their cap, a bounded number of
//!   events and frames per step;
//! - everything the session sends is a well-formed uCOBS frame, and its control frames decode.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use squarepeg_framing::varint;
use squarepeg_framing::{Frame, FrameHeader, StreamDecoder};
use squarepeg_session::control::{ControlError, ControlFrame, MAX_REASON_LEN, Params};
use squarepeg_session::{
    Config, ConnectionError, MAX_FRAME_BODY, MessageProps, ProtocolError, Role, Session,
    TransportError,
};

/// RECORDS_REPLACED ranges a session keeps waiting (`MAX_RECORDS_REPLACED` in session.rs).
const MAX_RECORDS_REPLACED: usize = 4096;
const MAX_FRAMES_PER_STEP: usize = 100_000;
const MAX_EVENTS_PER_STEP: usize = 100_000;

#[derive(Arbitrary, Debug)]
struct Input {
    server: bool,
    small_windows: bool,
    record_numbers: Option<u8>,
    receive_plain: bool,
    ops: Vec<Op>,
}

/// A value: small (often meaningful) or any (beyond the varint range too).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Value {
    Small(u16),
    Any(u64),
}

impl Value {
    fn get(self) -> u64 {
        match self {
            Value::Small(v) => u64::from(v),
            Value::Any(v) => v,
        }
    }

    /// As a frame header carries it: a varint (the decoder yields nothing larger).
    fn header(self) -> u64 {
        self.get() & varint::MAX
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Built {
    Params {
        max_data: Option<Value>,
        max_stream_data: Option<Value>,
        max_streams: Option<Value>,
        receive_formats: Option<Value>,
        record_numbers: Option<Value>,
    },
    MaxData(Value),
    MaxStreamData {
        stream: Value,
        max: Value,
    },
    MaxStreams(Value),
    ResetStream {
        stream: Value,
        code: Value,
        final_size: Value,
    },
    StopSending {
        stream: Value,
        code: Value,
    },
    Close {
        code: Value,
        reason: Vec<u8>,
        long: u16,
    },
    ApplicationClose {
        code: Value,
        reason: Vec<u8>,
        long: u16,
    },
    RecordsReplaced {
        start: Value,
        len: Value,
    },
    PathAck {
        received: Value,
    },
    PathProbe,
    AddAddress {
        id: Value,
        v6: bool,
        octets: [u8; 16],
        port: u16,
    },
    RemoveAddress {
        id: Value,
    },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Control(Built),
    RawControl(Vec<u8>),
    /// The `back`-th control body sent before, again.
    Repeat {
        back: u8,
    },
    Chunk {
        stream: Value,
        offset: Value,
        len: u16,
        fin: bool,
    },
    Message {
        substream: u8,
        number: Value,
        len: u16,
    },
    OpenStream,
    StreamWrite {
        i: u8,
        len: u16,
    },
    StreamFinish {
        i: u8,
    },
    StreamReset {
        i: u8,
        code: u16,
    },
    StreamStop {
        i: u8,
        code: u16,
    },
    StreamRead {
        i: u8,
        len: u16,
    },
    AcceptStream,
    SendMessage {
        len: u16,
        lifetime_ms: Option<u16>,
    },
    PollMessages,
    Advance {
        ms: u16,
    },
    Close {
        code: u16,
    },
    Abort {
        code: u16,
    },
}

fn build(b: &Built) -> ControlFrame {
    let reason = |r: &Vec<u8>, long: u16| {
        let mut r = r.clone();
        // Now and then longer than a CLOSE may carry.
        if long > 60_000 {
            r.resize(MAX_REASON_LEN + usize::from(long % 64), b'x');
        }
        r
    };
    match b {
        Built::Params {
            max_data,
            max_stream_data,
            max_streams,
            receive_formats,
            record_numbers,
        } => ControlFrame::Params(Params {
            initial_max_data: max_data.map(Value::get),
            initial_max_stream_data: max_stream_data.map(Value::get),
            initial_max_streams: max_streams.map(Value::get),
            receive_formats: receive_formats.map(Value::get),
            record_numbers: record_numbers.map(Value::get),
        }),
        Built::MaxData(v) => ControlFrame::MaxData(v.get()),
        Built::MaxStreamData { stream, max } => ControlFrame::MaxStreamData {
            stream: stream.get(),
            max: max.get(),
        },
        Built::MaxStreams(v) => ControlFrame::MaxStreams(v.get()),
        Built::ResetStream {
            stream,
            code,
            final_size,
        } => ControlFrame::ResetStream {
            stream: stream.get(),
            code: code.get(),
            final_size: final_size.get(),
        },
        Built::StopSending { stream, code } => ControlFrame::StopSending {
            stream: stream.get(),
            code: code.get(),
        },
        Built::Close {
            code,
            reason: r,
            long,
        } => ControlFrame::Close {
            code: code.get(),
            reason: reason(r, *long),
        },
        Built::ApplicationClose {
            code,
            reason: r,
            long,
        } => ControlFrame::ApplicationClose {
            code: code.get(),
            reason: reason(r, *long),
        },
        Built::RecordsReplaced { start, len } => ControlFrame::RecordsReplaced {
            start: start.get(),
            len: len.get(),
        },
        Built::PathAck { received } => ControlFrame::PathAck {
            received: received.get(),
        },
        Built::PathProbe => ControlFrame::PathProbe,
        Built::AddAddress {
            id,
            v6,
            octets,
            port,
        } => {
            let ip = if *v6 {
                std::net::IpAddr::from(*octets)
            } else {
                std::net::IpAddr::from([octets[0], octets[1], octets[2], octets[3]])
            };
            ControlFrame::AddAddress {
                id: id.get(),
                addr: std::net::SocketAddr::new(ip, *port),
            }
        }
        Built::RemoveAddress { id } => ControlFrame::RemoveAddress { id: id.get() },
    }
}

/// The values of a frame that go on the wire as varints.
fn varints(f: &ControlFrame) -> Vec<u64> {
    match f {
        ControlFrame::Params(p) => [
            p.initial_max_data,
            p.initial_max_stream_data,
            p.initial_max_streams,
            p.receive_formats,
            p.record_numbers,
        ]
        .into_iter()
        .flatten()
        .collect(),
        ControlFrame::MaxData(v) | ControlFrame::MaxStreams(v) => vec![*v],
        ControlFrame::MaxStreamData { stream, max } => vec![*stream, *max],
        ControlFrame::ResetStream {
            stream,
            code,
            final_size,
        } => vec![*stream, *code, *final_size],
        ControlFrame::StopSending { stream, code } => vec![*stream, *code],
        ControlFrame::Close { code, .. } | ControlFrame::ApplicationClose { code, .. } => {
            vec![*code]
        }
        ControlFrame::RecordsReplaced { start, len } => vec![*start, *len],
        ControlFrame::PathAck { received } => vec![*received],
        ControlFrame::PathProbe => vec![],
        ControlFrame::AddAddress { id, .. } | ControlFrame::RemoveAddress { id } => vec![*id],
    }
}

/// A decoded body re-encodes to a body no longer than it that decodes equal.
fn check_round_trip(body: &[u8], f: &ControlFrame) {
    let mut again = Vec::new();
    f.encode(&mut again)
        .unwrap_or_else(|e| panic!("decoded frame {f:?} does not encode: {e}"));
    assert!(
        again.len() <= body.len(),
        "{f:?} re-encodes longer: {} > {}",
        again.len(),
        body.len()
    );
    assert_eq!(ControlFrame::decode(&again).as_ref(), Ok(f));
}

struct Run {
    session: Session,
    now: Instant,
    config: Config,
    /// Control bodies fed so far.
    sent: Vec<Vec<u8>>,
    /// The error the session closed with, once it has.
    closed: Option<ConnectionError>,
    /// A frame from the peer was fed (the session then knows a squarepeg peer is there).
    frames_fed: bool,
    decoder: StreamDecoder,
    out: Vec<u8>,
    /// Our streams and the peer's.
    streams: Vec<u64>,
}

impl Run {
    fn control(&mut self, body: Vec<u8>) {
        let decoded = ControlFrame::decode(&body);
        if let Ok(f) = &decoded {
            check_round_trip(&body, f);
        }
        let open = self.session.error().is_none();
        let closing = self.session.is_closing();
        self.frames_fed = true;
        self.session.handle_frame(
            self.now,
            Frame {
                header: FrameHeader::Control,
                payload: Bytes::from(body.clone()),
            },
        );
        if open {
            match (&decoded, self.session.error()) {
                (Err(e), got) => assert_eq!(
                    got,
                    Some(&ConnectionError::ProtocolViolation(ProtocolError::Control(
                        e.clone()
                    ))),
                    "a body that does not decode ({e})"
                ),
                (Ok(ControlFrame::Close { code, reason }), got) if !closing => assert_eq!(
                    got,
                    Some(&ConnectionError::PeerError {
                        code: *code,
                        reason: String::from_utf8_lossy(reason).into_owned(),
                    })
                ),
                (Ok(ControlFrame::ApplicationClose { code, reason }), got) if !closing => {
                    assert_eq!(
                        got,
                        Some(&ConnectionError::ApplicationClosed {
                            code: *code,
                            reason: String::from_utf8_lossy(reason).into_owned(),
                        })
                    )
                }
                (Ok(_), Some(ConnectionError::ProtocolViolation(ProtocolError::Control(e)))) => {
                    panic!("a body that decodes failed as a control frame: {e}")
                }
                _ => {}
            }
        }
        if self.sent.len() < 256 {
            self.sent.push(body);
        }
        self.step();
    }

    /// The error the session closed with never changes, but for one case: a graceful close
    /// that the peer never answered with a single frame becomes `NothingReceived` at the
    /// drain timeout (not a clean close).
    fn check_closing_error(&mut self) {
        if let Some(e) = &self.closed {
            let unanswered = *e == ConnectionError::LocallyClosed
                && !self.frames_fed
                && self.session.error()
                    == Some(&ConnectionError::Transport(TransportError::NothingReceived));
            if !unanswered {
                assert_eq!(self.session.error(), Some(e), "the closing error changed");
            }
        }
        self.closed = self.session.error().cloned();
    }

    fn step(&mut self) {
        self.check_closing_error();
        let mut frames = 0;
        loop {
            self.out.clear();
            let Some(t) = self.session.poll_transmit(self.now, &mut self.out) else {
                break;
            };
            frames += 1;
            assert!(frames <= MAX_FRAMES_PER_STEP, "output does not end");
            assert_eq!(t.len, self.out.len(), "transmit length");
            self.decoder.push(&self.out);
            let mut n = 0;
            while let Some(f) = self.decoder.next_frame() {
                let f = f.unwrap_or_else(|e| panic!("the session sent a bad frame: {e:?}"));
                n += 1;
                if f.header == FrameHeader::Control {
                    let c = ControlFrame::decode(&f.payload)
                        .unwrap_or_else(|e| panic!("the session sent a bad control frame: {e}"));
                    check_round_trip(&f.payload, &c);
                }
            }
            assert_eq!(n, 1, "one frame per transmit");
        }
        let mut events = 0;
        while let Some(ev) = self.session.poll_event() {
            events += 1;
            assert!(events <= MAX_EVENTS_PER_STEP, "events do not end");
            if let squarepeg_session::Event::ConnectionLost(e) = ev {
                assert_eq!(self.session.error(), Some(&e));
            }
        }
        self.check_closing_error();
        self.check_bounds();
    }

    fn check_bounds(&mut self) {
        assert!(self.session.queued_message_bytes() <= self.config.message_send_queue);
        for &id in &self.streams {
            let n = self.session.stream_readable_bytes(id);
            assert!(
                n as u64 <= self.config.stream_receive_window,
                "{n} bytes readable on stream {id}, window {}",
                self.config.stream_receive_window
            );
        }
        let replaced = self.session.take_records_replaced();
        assert!(replaced.len() <= MAX_RECORDS_REPLACED);
        for r in replaced {
            assert!(r.start <= r.end);
        }
    }

    fn stream(&self, i: u8) -> Option<u64> {
        (!self.streams.is_empty()).then(|| self.streams[usize::from(i) % self.streams.len()])
    }

    fn note_stream(&mut self, id: u64) {
        if !self.streams.contains(&id) && self.streams.len() < 64 {
            self.streams.push(id);
        }
    }
}

fuzz_target!(|input: Input| {
    let start = Instant::now();
    let mut config = Config::default();
    if input.small_windows {
        config.stream_receive_window = squarepeg_session::DEFAULT_INITIAL_MAX_STREAM_DATA;
        config.connection_receive_window = squarepeg_session::DEFAULT_INITIAL_MAX_DATA;
        config.max_concurrent_peer_streams = squarepeg_session::DEFAULT_INITIAL_MAX_STREAMS;
        config.stream_send_buffer = 4096;
        config.message_send_queue = 64 * 1024;
        config.message_receive_queue = 64 * 1024;
        config.dedup_window = 64;
        config.chunk_size = 1024;
    }
    let role = if input.server {
        Role::Server
    } else {
        Role::Client
    };
    let mut session = Session::new(role, config.clone()).unwrap();
    session.set_frame_formats(input.receive_plain, false);
    if let Some(bits) = input.record_numbers {
        session.announce_record_numbers(u64::from(bits % 8));
    }
    let mut run = Run {
        session,
        now: start,
        config,
        sent: Vec::new(),
        closed: None,
        frames_fed: false,
        decoder: StreamDecoder::new(MAX_FRAME_BODY),
        out: Vec::new(),
        streams: Vec::new(),
    };
    run.step();
    let mut buf = vec![0u8; 70_000];
    for op in input.ops.iter().take(300) {
        match op {
            Op::Control(b) => {
                let f = build(b);
                let mut body = Vec::new();
                match f.encode(&mut body) {
                    Ok(()) => {
                        let mut expected = f.clone();
                        if let ControlFrame::Close { reason, .. }
                        | ControlFrame::ApplicationClose { reason, .. } = &mut expected
                        {
                            reason.truncate(MAX_REASON_LEN);
                        }
                        assert_eq!(ControlFrame::decode(&body), Ok(expected));
                        assert!(varints(&f).iter().all(|&v| v <= varint::MAX));
                        run.control(body);
                    }
                    Err(ControlError::ValueTooLarge(v)) => {
                        assert!(v > varint::MAX && varints(&f).contains(&v));
                    }
                    Err(e) => panic!("{f:?} does not encode: {e}"),
                }
            }
            Op::RawControl(body) => run.control(body.clone()),
            Op::Repeat { back } => {
                if let Some(i) = run.sent.len().checked_sub(1 + usize::from(*back)) {
                    let body = run.sent[i].clone();
                    run.control(body);
                }
            }
            Op::Chunk {
                stream,
                offset,
                len,
                fin,
            } => {
                let id = stream.header();
                run.note_stream(id);
                run.frames_fed = true;
                run.session.handle_frame(
                    run.now,
                    Frame {
                        header: FrameHeader::StreamChunk {
                            stream: id,
                            offset: offset.header(),
                            fin: *fin,
                        },
                        payload: Bytes::from(vec![0x63; usize::from(*len) % 20_000]),
                    },
                );
                run.step();
            }
            Op::Message {
                substream,
                number,
                len,
            } => {
                run.frames_fed = true;
                run.session.handle_frame(
                    run.now,
                    Frame {
                        header: FrameHeader::Message {
                            substream: u64::from(*substream),
                            number: number.header(),
                        },
                        payload: Bytes::from(vec![0x6d; usize::from(*len) % 20_000]),
                    },
                );
                run.step();
            }
            Op::OpenStream => {
                if let Ok(id) = run.session.open_stream() {
                    run.note_stream(id);
                }
                run.step();
            }
            Op::StreamWrite { i, len } => {
                if let Some(id) = run.stream(*i) {
                    let _ = run.session.stream_write(id, &vec![0x77; usize::from(*len)]);
                }
                run.step();
            }
            Op::StreamFinish { i } => {
                if let Some(id) = run.stream(*i) {
                    let _ = run.session.stream_finish(id);
                }
                run.step();
            }
            Op::StreamReset { i, code } => {
                if let Some(id) = run.stream(*i) {
                    let _ = run.session.stream_reset(id, u64::from(*code));
                }
                run.step();
            }
            Op::StreamStop { i, code } => {
                if let Some(id) = run.stream(*i) {
                    let _ = run.session.stream_stop(id, u64::from(*code));
                }
                run.step();
            }
            Op::StreamRead { i, len } => {
                if let Some(id) = run.stream(*i) {
                    let n = usize::from(*len).min(buf.len());
                    let _ = run.session.stream_read(id, &mut buf[..n]);
                }
                run.step();
            }
            Op::AcceptStream => {
                while let Some(id) = run.session.accept_stream() {
                    run.note_stream(id);
                }
                run.step();
            }
            Op::SendMessage { len, lifetime_ms } => {
                let props = MessageProps {
                    lifetime: lifetime_ms.map(|ms| Duration::from_millis(u64::from(ms))),
                    ..MessageProps::default()
                };
                let _ = run.session.send_message(
                    run.now,
                    vec![0x73; usize::from(*len) % 20_000],
                    props,
                );
                run.step();
            }
            Op::PollMessages => {
                while run.session.poll_message().is_some() {}
                run.step();
            }
            Op::Advance { ms } => {
                run.now += Duration::from_millis(u64::from(*ms));
                run.session.handle_timeout(run.now);
                run.step();
            }
            Op::Close { code } => {
                run.session.close(u64::from(*code), b"bye");
                run.step();
            }
            Op::Abort { code } => {
                run.session.abort(run.now, u64::from(*code), b"abort");
                run.step();
            }
        }
    }
});
