//! The same trace, two drivers: a random message/stream/close trace run through the sans-IO
//! connection core in the simulator (`squarepeg_connection::Connection` on both hosts,
//! driven by `EndpointLink` on a simulated `squarepeg_tcp::Endpoint`) and through the tokio
//! `squarepeg` API gives the same outcome, for both substrates:
//!
//! - in-order byte stream: simulated standard TCP ↔ kernel TCP on loopback;
//! - uTCP (segments in, tagged writes out): simulated userspace TCP ↔ the userspace TCP on
//!   TUN stacks at both ends of a network lab; and a uTCP client ↔ a standard TCP server,
//!   simulated and as a TUN stack ↔ kernel TCP in the lab's server namespace (needs root,
//!   /dev/net/tun and iproute2; skipped with a message otherwise).
//!
//! Compared, per side: the peer's messages delivered (number, sub-stream, length, payload
//! digest), the peer's stream (bytes, SHA-256, whether its end arrived), the final status of
//! each message as the sender saw it, how the connection ended (`ConnectionError`, with its
//! code), and the frame formats in force (byte stream: plain both ways after negotiation;
//! uTCP: uCOBS both ways). Any difference fails with a diff.
//!
//! # A trace whose outcome the protocol decides
//!
//! The paths differ in everything timing-related (packet loss and RTT in the simulator,
//! thread scheduling, batch sizes and timers in the tokio driver), so the trace uses only
//! what does not depend on when the connection sends:
//!
//! - **Bursts.** Messages are queued in bursts, each in one go with no chance for the driver
//!   to run in between (one simulator round; synchronous `try_send_message` calls on a
//!   current-thread runtime). Sizes, sub-streams and priorities are random: priorities only
//!   order sending, and deliveries are compared as a set.
//! - **Squash keys are local to a burst.** A later message of a burst squashes an earlier one
//!   with the same key, which is still queued in the session for certain. A key never
//!   outlives its burst, so whether an older message already left cannot matter (and no two
//!   live messages share a key in the TCP's tagged queue).
//! - **Lifetimes are zero or long.** A zero lifetime expires before the connection can
//!   first send the message (the session drops expired messages before it picks one):
//!   `Expired`, for certain. A long one (10 minutes) never expires during the test; over
//!   uTCP it makes `Sent` wait for the TCP's acknowledgement. Nothing in between, whose fate
//!   would depend on the path's delay. No `depends_on`: with an expired dependency, the
//!   outcome depends on which of the two the scheduler picks first.
//! - **Close after a barrier.** Each side writes its stream and finishes it, waits for the
//!   final status of every message it queued and for the end of the peer's stream, then
//!   sends a summary message (how many of its messages ended `Sent`) and waits for that
//!   one's status. The closing side closes only once it also has the peer's summary, as
//!   many of the peer's messages, and the end of the peer's stream: then nothing is in
//!   flight either way, so neither the close nor the status a message gets at the
//!   connection's end (`Discarded` for one still in the TCP's queue) races with data. A graceful close then sends just APPLICATION_CLOSE (code 0);
//!   an abort (random code) first queues a last burst in the same go, whose messages are all
//!   `Discarded` (or `Squashed`) for certain.
//! - **Formats.** A sender switches its direction to plain frames with the first frame it
//!   sends after the peer's PARAMS (docs/wire.md §3). The summary goes after the end of the
//!   peer's stream, so after its PARAMS over an in-order stream: every byte-stream side
//!   switches before the summary, however its earlier frames were timed.
//!
//! `PROPTEST_CASES` overrides the number of cases (12 by default).
//!
//! `cargo test -p squarepeg --test equivalence`

mod utcp_world;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{
    Config as ProptestConfig, FileFailurePersistence, TestError, TestRunner,
};
use sha2::{Digest, Sha256};
use squarepeg::{
    Connection, ConnectionConfig, ConnectionError, Endpoint, FrameFormat, Message, MessageNumber,
    MessageProps, MessageStatus, Priority,
};
use squarepeg_connection::Connection as Core;
use squarepeg_lab::Side;
use squarepeg_lab::model::{Bottleneck, LinkConfig};
use squarepeg_lab::sim::{HostId, SimConfig, Simulator};
use squarepeg_session::{Event, ReadOutcome, Role, StreamId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use utcp_world::{App, PegHost, pattern, stream_to_read};

// ------------------------------------------------------------------------ the trace

/// The lifetimes a trace uses (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Reliable,
    /// Expired before the connection can send it.
    Zero,
    /// Never expires during the test.
    Long,
}

const LONG_LIFETIME: Duration = Duration::from_secs(600);

/// One message of a burst.
#[derive(Clone, Debug)]
struct Msg {
    len: usize,
    substream: u64,
    priority: u8,
    /// Squash key, shared only with messages of the same burst.
    squash: Option<u8>,
    life: Life,
}

#[derive(Clone, Debug)]
enum Step {
    /// Messages queued in one go.
    Burst(Vec<Msg>),
    /// Bytes written to the side's stream.
    Stream(usize),
}

/// What one side does before the barrier.
#[derive(Clone, Debug, Default)]
struct SideTrace {
    steps: Vec<Step>,
}

#[derive(Clone, Debug)]
enum Close {
    /// `close()`: APPLICATION_CLOSE with code 0.
    Graceful,
    /// `abort(code)`, right after queueing `doomed` in the same go.
    Abort { code: u64, doomed: Vec<Msg> },
}

#[derive(Clone, Debug)]
struct Trace {
    client: SideTrace,
    server: SideTrace,
    closer: Role,
    close: Close,
    /// Seeds the simulator's losses.
    sim_seed: u64,
}

/// The summary message's sub-stream (the trace's messages use 0..4).
const SUMMARY_SUBSTREAM: u64 = 1000;

/// The index that stands for the doomed burst in squash keys and payloads.
const DOOMED_BURST: usize = 1 << 16;

fn tag(role: Role) -> u8 {
    match role {
        Role::Client => 1,
        Role::Server => 2,
    }
}

fn props(role: Role, burst: usize, m: &Msg) -> MessageProps {
    MessageProps {
        substream: m.substream,
        priority: Priority::new(m.priority).unwrap_or_default(),
        lifetime: match m.life {
            Life::Reliable => None,
            Life::Zero => Some(Duration::ZERO),
            Life::Long => Some(LONG_LIFETIME),
        },
        depends_on: None,
        squash_key: m
            .squash
            .map(|k| (u64::from(tag(role)) << 40) | ((burst as u64) << 8) | u64::from(k)),
        safely_replayable: false,
        path: None,
    }
}

fn payload(role: Role, burst: usize, index: usize, len: usize) -> Vec<u8> {
    let seed = (u64::from(tag(role)) << 48) ^ ((burst as u64) << 20) ^ index as u64;
    pattern(seed, 0, len)
}

fn stream_data(role: Role, offset: u64, len: usize) -> Vec<u8> {
    pattern(0x5EED_0000 + u64::from(tag(role)), offset, len)
}

fn summary_props() -> MessageProps {
    MessageProps {
        substream: SUMMARY_SUBSTREAM,
        ..Default::default()
    }
}

impl SideTrace {
    /// The side's messages before the summary, in number order: (burst, index in burst).
    fn numbered(&self) -> Vec<(usize, usize, &Msg)> {
        let mut out = Vec::new();
        for (b, step) in self.steps.iter().enumerate() {
            if let Step::Burst(ms) = step {
                out.extend(ms.iter().enumerate().map(|(i, m)| (b, i, m)));
            }
        }
        out
    }
}

impl Trace {
    fn side(&self, role: Role) -> &SideTrace {
        match role {
            Role::Client => &self.client,
            Role::Server => &self.server,
        }
    }

    fn close_of(&self, role: Role) -> Option<Close> {
        (role == self.closer).then(|| self.close.clone())
    }
}

fn fmt_msgs(f: &mut fmt::Formatter<'_>, ms: &[Msg]) -> fmt::Result {
    write!(f, "[")?;
    for (i, m) in ms.iter().enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(f, "{}B s{} p{}", m.len, m.substream, m.priority)?;
        if let Some(k) = m.squash {
            write!(f, " k{k}")?;
        }
        match m.life {
            Life::Reliable => {}
            Life::Zero => write!(f, " life0")?,
            Life::Long => write!(f, " life600s")?,
        }
    }
    write!(f, "]")
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for role in [Role::Client, Role::Server] {
            writeln!(f, "  {role:?}:")?;
            for (b, step) in self.side(role).steps.iter().enumerate() {
                match step {
                    Step::Burst(ms) => {
                        write!(f, "    {b}: burst ")?;
                        fmt_msgs(f, ms)?;
                        writeln!(f)?;
                    }
                    Step::Stream(n) => writeln!(f, "    {b}: stream {n}B")?,
                }
            }
        }
        write!(f, "  then {:?} ", self.closer)?;
        match &self.close {
            Close::Graceful => write!(f, "closes gracefully")?,
            Close::Abort { code, doomed } => {
                write!(f, "aborts with code {code} after queueing ")?;
                fmt_msgs(f, doomed)?;
            }
        }
        write!(f, " (simulator seed {})", self.sim_seed)
    }
}

fn msg_strategy() -> impl Strategy<Value = Msg> {
    (
        prop_oneof![
            3 => 0usize..200,
            2 => 200usize..4000,
            1 => 4000usize..40_000,
        ],
        0u64..4,
        0u8..8,
        proptest::option::weighted(0.4, 0u8..3),
        prop_oneof![
            6 => Just(Life::Reliable),
            2 => Just(Life::Long),
            1 => Just(Life::Zero),
        ],
    )
        .prop_map(|(len, substream, priority, squash, life)| Msg {
            len,
            substream,
            priority,
            squash,
            life,
        })
}

fn side_strategy() -> impl Strategy<Value = SideTrace> {
    let step = prop_oneof![
        3 => proptest::collection::vec(msg_strategy(), 1..8).prop_map(Step::Burst),
        1 => (0usize..60_000).prop_map(Step::Stream),
    ];
    proptest::collection::vec(step, 0..8).prop_map(|steps| SideTrace { steps })
}

fn trace_strategy() -> impl Strategy<Value = Trace> {
    let close = prop_oneof![
        Just(Close::Graceful),
        (
            1u64..1_000_000,
            proptest::collection::vec(msg_strategy(), 0..4)
        )
            .prop_map(|(code, doomed)| Close::Abort { code, doomed }),
    ];
    (
        side_strategy(),
        side_strategy(),
        any::<bool>(),
        close,
        any::<u64>(),
    )
        .prop_map(|(client, server, client_closes, close, sim_seed)| Trace {
            client,
            server,
            closer: if client_closes {
                Role::Client
            } else {
                Role::Server
            },
            close,
            sim_seed,
        })
}

fn abort_reason(code: u64) -> Vec<u8> {
    format!("equivalence abort {code}").into_bytes()
}

// ------------------------------------------------------------------------ outcomes

/// A message as the receiver got it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Delivery {
    substream: u64,
    len: usize,
    /// The first bytes of the payload's SHA-256, in hex.
    digest: String,
}

/// What one side saw.
#[derive(Clone, Debug, Default, PartialEq)]
struct SideOutcome {
    /// The peer's messages delivered, by number.
    delivered: BTreeMap<MessageNumber, Delivery>,
    /// The peer's stream: bytes read, their SHA-256 (hex, shortened), whether its end came.
    stream_bytes: u64,
    stream_digest: String,
    stream_finished: bool,
    /// The final status of each of this side's messages.
    statuses: BTreeMap<MessageNumber, MessageStatus>,
    /// How the connection ended.
    end: Option<ConnectionError>,
    send_format: Option<FrameFormat>,
    receive_format: Option<FrameFormat>,
    /// Broken invariants seen on the way (a message twice, a payload not the one sent, …).
    problems: Vec<String>,
}

fn short_hex(bytes: &[u8]) -> String {
    bytes[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Builds one side's [`SideOutcome`], the same way on both paths.
struct Recorder {
    /// This side and the peer's trace (what its messages must be).
    role: Role,
    peer: SideTrace,
    out: SideOutcome,
    stream_hash: Sha256,
    /// The peer's summary: how many of its messages ended `Sent`.
    peer_summary: Option<u64>,
}

impl Recorder {
    fn new(role: Role, peer: SideTrace) -> Self {
        Self {
            role,
            peer,
            out: SideOutcome::default(),
            stream_hash: Sha256::new(),
            peer_summary: None,
        }
    }

    fn peer_role(&self) -> Role {
        other(self.role)
    }

    fn message(&mut self, m: &Message) {
        let delivery = Delivery {
            substream: m.substream,
            len: m.payload.len(),
            digest: short_hex(&Sha256::digest(&m.payload)),
        };
        if self.out.delivered.insert(m.number, delivery).is_some() {
            self.out
                .problems
                .push(format!("message {} delivered twice", m.number));
        }
        let numbered = self.peer.numbered();
        if m.substream == SUMMARY_SUBSTREAM {
            let count = <[u8; 8]>::try_from(&m.payload[..]).map(u64::from_le_bytes);
            match (count, self.peer_summary) {
                (Ok(c), None) if m.number == numbered.len() as u64 => self.peer_summary = Some(c),
                _ => self
                    .out
                    .problems
                    .push(format!("unexpected summary message {}", m.number)),
            }
            return;
        }
        let expected = numbered
            .get(m.number as usize)
            .map(|&(b, i, msg)| (msg.substream, payload(self.peer_role(), b, i, msg.len)));
        if expected.as_ref().map(|(s, p)| (*s, &p[..])) != Some((m.substream, &m.payload[..])) {
            self.out.problems.push(format!(
                "message {} (sub-stream {}, {} bytes) is not the one sent under its number",
                m.number,
                m.substream,
                m.payload.len()
            ));
        }
    }

    fn status(&mut self, number: MessageNumber, status: MessageStatus) {
        if let Some(old) = self.out.statuses.insert(number, status) {
            self.out.problems.push(format!(
                "message {number}: a second status ({old:?}, then {status:?})"
            ));
        }
    }

    fn stream(&mut self, data: &[u8]) {
        let expect = stream_data(self.peer_role(), self.out.stream_bytes, data.len());
        if data != &expect[..] {
            self.out.problems.push(format!(
                "stream bytes at {} are not the ones written",
                self.out.stream_bytes
            ));
        }
        self.stream_hash.update(data);
        self.out.stream_bytes += data.len() as u64;
    }

    fn stream_finished(&mut self) {
        if std::mem::replace(&mut self.out.stream_finished, true) {
            self.out.problems.push("the stream ended twice".into());
        }
    }

    fn end(&mut self, e: ConnectionError) {
        if let Some(old) = self.out.end.replace(e) {
            self.out
                .problems
                .push(format!("the connection ended twice (first: {old:?})"));
        }
    }

    fn formats(&mut self, send: FrameFormat, receive: FrameFormat) {
        self.out.send_format = Some(send);
        self.out.receive_format = Some(receive);
    }

    /// Statuses of this side's messages with this status.
    fn count(&self, status: MessageStatus) -> u64 {
        self.out.statuses.values().filter(|&&s| s == status).count() as u64
    }

    /// The peer's summary, as many of its messages, and the end of its stream are here.
    fn has_everything(&self) -> bool {
        let data = self.out.delivered.len() as u64 - u64::from(self.peer_summary.is_some());
        self.peer_summary == Some(data) && self.out.stream_finished
    }

    fn finish(mut self) -> SideOutcome {
        self.out.stream_digest = short_hex(&self.stream_hash.finalize());
        self.out
    }
}

/// Both sides' outcomes of one run.
#[derive(Clone, Debug, Default, PartialEq)]
struct Outcomes {
    client: SideOutcome,
    server: SideOutcome,
}

impl Outcomes {
    fn side(&self, role: Role) -> &SideOutcome {
        match role {
            Role::Client => &self.client,
            Role::Server => &self.server,
        }
    }
}

fn diff_maps<K: Ord + fmt::Debug, V: PartialEq + fmt::Debug>(
    what: &str,
    a: &BTreeMap<K, V>,
    b: &BTreeMap<K, V>,
    out: &mut Vec<String>,
) {
    for (k, va) in a {
        match b.get(k) {
            None => out.push(format!("{what} {k:?}: {va:?} | missing")),
            Some(vb) if vb != va => out.push(format!("{what} {k:?}: {va:?} | {vb:?}")),
            Some(_) => {}
        }
    }
    for (k, vb) in b {
        if !a.contains_key(k) {
            out.push(format!("{what} {k:?}: missing | {vb:?}"));
        }
    }
}

/// The differences between two runs' outcomes, one line each ("left | right").
fn diff(a: &Outcomes, b: &Outcomes) -> Vec<String> {
    let mut lines = Vec::new();
    for role in [Role::Client, Role::Server] {
        let (x, y) = (a.side(role), b.side(role));
        let mut d = Vec::new();
        diff_maps("delivered", &x.delivered, &y.delivered, &mut d);
        diff_maps("status of", &x.statuses, &y.statuses, &mut d);
        let mut field = |name: &str, l: String, r: String| {
            if l != r {
                d.push(format!("{name}: {l} | {r}"));
            }
        };
        field(
            "stream",
            format!(
                "{}B {} end {}",
                x.stream_bytes, x.stream_digest, x.stream_finished
            ),
            format!(
                "{}B {} end {}",
                y.stream_bytes, y.stream_digest, y.stream_finished
            ),
        );
        field("end", format!("{:?}", x.end), format!("{:?}", y.end));
        field(
            "formats (send, receive)",
            format!("{:?}", (x.send_format, x.receive_format)),
            format!("{:?}", (y.send_format, y.receive_format)),
        );
        field(
            "problems",
            format!("{:?}", x.problems),
            format!("{:?}", y.problems),
        );
        lines.extend(d.into_iter().map(|l| format!("{role:?}: {l}")));
    }
    lines
}

/// What must hold within one run, whatever the path: no broken invariants, every message
/// its sender reported `Sent` delivered and no other, the whole stream, the ends the close
/// implies, and the substrate's frame formats.
fn check_run(trace: &Trace, o: &Outcomes, formats: FrameFormat) -> Vec<String> {
    let mut problems = Vec::new();
    for role in [Role::Client, Role::Server] {
        let (me, peer_role) = match role {
            Role::Client => (&o.client, Role::Server),
            Role::Server => (&o.server, Role::Client),
        };
        let peer = o.side(peer_role);
        let mut p: Vec<String> = me.problems.clone();
        let sent: Vec<MessageNumber> = peer
            .statuses
            .iter()
            .filter(|&(_, &s)| s == MessageStatus::Sent)
            .map(|(&n, _)| n)
            .collect();
        let delivered: Vec<MessageNumber> = me.delivered.keys().copied().collect();
        if sent != delivered {
            p.push(format!(
                "delivered {delivered:?}, but the peer reported Sent for {sent:?}"
            ));
        }
        let written: usize = trace
            .side(peer_role)
            .steps
            .iter()
            .map(|s| match s {
                Step::Stream(n) => *n,
                Step::Burst(_) => 0,
            })
            .sum();
        if me.stream_bytes != written as u64 || !me.stream_finished {
            p.push(format!(
                "stream: {} bytes (end {}), the peer wrote {written}",
                me.stream_bytes, me.stream_finished
            ));
        }
        let queued = trace.side(role).numbered().len()
            + 1
            + match (&trace.close, role == trace.closer) {
                (Close::Abort { doomed, .. }, true) => doomed.len(),
                _ => 0,
            };
        if me.statuses.len() != queued {
            p.push(format!(
                "{} statuses for {queued} messages",
                me.statuses.len()
            ));
        }
        let end = match (&trace.close, role == trace.closer) {
            (Close::Graceful, true) => ConnectionError::LocallyClosed,
            (Close::Graceful, false) => ConnectionError::ApplicationClosed {
                code: 0,
                reason: String::new(),
            },
            (Close::Abort { code, .. }, true) => ConnectionError::LocallyAborted(*code),
            (Close::Abort { code, .. }, false) => ConnectionError::ApplicationClosed {
                code: *code,
                reason: String::from_utf8_lossy(&abort_reason(*code)).into_owned(),
            },
        };
        if me.end.as_ref() != Some(&end) {
            p.push(format!("ended {:?}, expected {end:?}", me.end));
        }
        if (me.send_format, me.receive_format) != (Some(formats), Some(formats)) {
            p.push(format!(
                "frame formats (send, receive) {:?}, expected {formats:?} both ways",
                (me.send_format, me.receive_format)
            ));
        }
        problems.extend(p.into_iter().map(|l| format!("{role:?}: {l}")));
    }
    problems
}

/// Checks the simulator's and the tokio driver's runs of `trace`, and compares them.
fn compare(
    trace: &Trace,
    formats: FrameFormat,
    sim: Outcomes,
    real_name: &str,
    real: Outcomes,
) -> Result<(), String> {
    let mut report = Vec::new();
    for (name, o) in [("simulator", &sim), (real_name, &real)] {
        let p = check_run(trace, o, formats);
        if !p.is_empty() {
            report.push(format!("{name} run:\n    {}", p.join("\n    ")));
        }
    }
    let d = diff(&sim, &real);
    if !d.is_empty() {
        report.push(format!(
            "simulator | {real_name} differ:\n    {}",
            d.join("\n    ")
        ));
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(format!("trace:\n{trace}\n{}", report.join("\n")))
    }
}

// ------------------------------------------------------------------------ (a) simulator

/// The trace's application on a simulator host (one [`PegHost`]): the same steps as
/// [`tokio_side`], as a state machine run in the host's rounds.
struct SimApp {
    role: Role,
    me: SideTrace,
    close: Option<Close>,
    rec: Recorder,
    step: usize,
    /// Bytes of the current stream step written.
    step_written: usize,
    stream_offset: u64,
    send_stream: Option<StreamId>,
    stream_finished: bool,
    /// Messages queued so far (the next number).
    queued: u64,
    summary: Option<MessageNumber>,
    recv_stream: Option<StreamId>,
    recv_done: bool,
    closed: bool,
    buf: Vec<u8>,
}

impl SimApp {
    fn new(trace: &Trace, role: Role) -> Self {
        Self {
            role,
            me: trace.side(role).clone(),
            close: trace.close_of(role),
            rec: Recorder::new(role, trace.side(other(role)).clone()),
            step: 0,
            step_written: 0,
            stream_offset: 0,
            send_stream: None,
            stream_finished: false,
            queued: 0,
            summary: None,
            recv_stream: None,
            recv_done: false,
            closed: false,
            buf: vec![0; 64 * 1024],
        }
    }

    fn queue(&mut self, now: Instant, conn: &mut Core, burst: usize, ms: &[Msg]) {
        for (i, m) in ms.iter().enumerate() {
            let p = payload(self.role, burst, i, m.len);
            match conn
                .session_mut()
                .send_message(now, p, props(self.role, burst, m))
            {
                Ok(n) if n == self.queued => {}
                other => self
                    .rec
                    .out
                    .problems
                    .push(format!("queueing message {}: {other:?}", self.queued)),
            }
            self.queued += 1;
        }
    }

    fn receive(&mut self, conn: &mut Core) {
        while let Some(ev) = conn.poll_event() {
            match ev {
                Event::MessageStatus { numbers, status } => {
                    for number in numbers {
                        self.rec.status(number, status);
                    }
                }
                Event::ConnectionLost(e) => self.rec.end(e),
                _ => {}
            }
        }
        while let Some(m) = conn.session_mut().poll_message() {
            self.rec.message(&m);
        }
        while !self.recv_done {
            let s = conn.session_mut();
            let Some(id) = stream_to_read(s, &mut self.recv_stream) else {
                break;
            };
            match s.stream_read(id, &mut self.buf) {
                Ok(ReadOutcome::Data(n)) => self.rec.stream(&self.buf[..n]),
                Ok(ReadOutcome::Finished) => {
                    self.rec.stream_finished();
                    self.recv_done = true;
                }
                Ok(ReadOutcome::Blocked) => break,
                Err(_) => self.recv_done = true,
            }
        }
        let st = conn.stats().session;
        self.rec.formats(st.send_format, st.receive_format);
    }

    /// The steps, then the stream's end.
    fn send(&mut self, now: Instant, conn: &mut Core) {
        let id = match self.send_stream {
            Some(id) => id,
            None => match conn.session_mut().open_stream() {
                Ok(id) => *self.send_stream.insert(id),
                Err(_) => return,
            },
        };
        while self.step < self.me.steps.len() {
            match self.me.steps[self.step].clone() {
                Step::Burst(ms) => self.queue(now, conn, self.step, &ms),
                Step::Stream(n) => {
                    while self.step_written < n {
                        let k = (n - self.step_written).min(16 * 1024);
                        let data = stream_data(self.role, self.stream_offset, k);
                        match conn.session_mut().stream_write(id, &data) {
                            Ok(0) => return,
                            Ok(k) => {
                                self.step_written += k;
                                self.stream_offset += k as u64;
                            }
                            Err(e) => {
                                self.rec.out.problems.push(format!("stream write: {e}"));
                                return;
                            }
                        }
                    }
                    self.step_written = 0;
                }
            }
            self.step += 1;
        }
        if !self.stream_finished {
            self.stream_finished = true;
            if let Err(e) = conn.session_mut().stream_finish(id) {
                self.rec.out.problems.push(format!("stream finish: {e}"));
            }
        }
    }
}

impl App for SimApp {
    fn round(&mut self, now: Instant, conn: &mut Core) {
        self.receive(conn);
        if self.closed || conn.session().error().is_some() {
            return;
        }
        self.send(now, conn);
        if !self.stream_finished {
            return;
        }
        // The barrier (see the module docs).
        if self.summary.is_none()
            && self.rec.out.statuses.len() as u64 == self.queued
            && self.rec.out.stream_finished
        {
            let count = self.rec.count(MessageStatus::Sent);
            match conn.session_mut().send_message(
                now,
                count.to_le_bytes().to_vec(),
                summary_props(),
            ) {
                Ok(n) => self.summary = Some(n),
                Err(e) => self.rec.out.problems.push(format!("summary: {e}")),
            }
            self.queued += 1;
        }
        let summary_settled = self
            .summary
            .is_some_and(|n| self.rec.out.statuses.contains_key(&n));
        if !(summary_settled && self.rec.has_everything()) {
            return;
        }
        match self.close.take() {
            None => {}
            Some(Close::Graceful) => {
                self.closed = true;
                conn.session_mut().close(0, b"");
            }
            Some(Close::Abort { code, doomed }) => {
                self.closed = true;
                self.queue(now, conn, DOOMED_BURST, &doomed);
                conn.session_mut().abort(now, code, &abort_reason(code));
            }
        }
        // What closing reported.
        self.receive(conn);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}

/// Runs `trace` in the simulator: both ends are the connection core on a simulated TCP
/// endpoint, each over uTCP or a standard in-order TCP, on a path with delay and loss.
fn run_sim(trace: &Trace, client_utcp: bool, server_utcp: bool) -> Outcomes {
    let start = Instant::now();
    let link = LinkConfig::new()
        .with_delay(Duration::from_millis(5))
        .with_rate(50_000_000)
        .with_queue(None, Some(200))
        .with_loss(0.01);
    let mut sim = Simulator::with_start(
        SimConfig::new(trace.sim_seed, Bottleneck::symmetric(link)),
        start,
    )
    .expect("simulator");
    let mut tcp = squarepeg_tcp::ConnectionConfig::default();
    tcp.recv_buffer = 256 * 1024;
    tcp.send_buffer = 256 * 1024;
    let host =
        |role, utcp| PegHost::with_app(role, utcp, tcp.clone(), SimApp::new(trace, role), start);
    let server: HostId = sim
        .add_host(Side::Right, host(Role::Server, server_utcp))
        .expect("server");
    let client: HostId = sim
        .add_host(Side::Left, host(Role::Client, client_utcp))
        .expect("client");
    // Simulated time: minutes of it take well under a second.
    let deadline = start + Duration::from_secs(600);
    let done = |sim: &Simulator| {
        [client, server].into_iter().all(|id| {
            let h = sim.host::<PegHost<SimApp>>(id).expect("host");
            h.app.rec.out.end.is_some() && h.drained()
        })
    };
    let mut stalled = None;
    while !done(&sim) {
        match sim.step() {
            Ok(Some(t)) if t < deadline => {}
            Ok(other) => {
                stalled = Some(format!("not finished at {other:?}"));
                break;
            }
            Err(e) => {
                stalled = Some(format!("simulator: {e}"));
                break;
            }
        }
    }
    let mut take = |id| {
        let h = sim.host_mut::<PegHost<SimApp>>(id).expect("host");
        let rec = std::mem::replace(
            &mut h.app.rec,
            Recorder::new(Role::Client, SideTrace::default()),
        );
        rec.finish()
    };
    let mut outcomes = Outcomes {
        client: take(client),
        server: take(server),
    };
    if let Some(why) = stalled {
        for o in [&mut outcomes.client, &mut outcomes.server] {
            o.problems.push(format!("simulator {why}"));
        }
    }
    outcomes
}

// ------------------------------------------------------------------------ (b) tokio

/// One side of the trace over the tokio API (the same steps as [`SimApp`]).
async fn tokio_side(conn: Connection, trace: &Trace, role: Role, rec: &RefCell<Recorder>) {
    let progress = Notify::new();
    let receive = async {
        while let Ok(m) = conn.recv_message().await {
            rec.borrow_mut().message(&m);
            progress.notify_one();
        }
        progress.notify_one();
    };
    let read_stream = async {
        if let Ok(mut s) = conn.accept_stream().await {
            let mut buf = vec![0; 64 * 1024];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) => {
                        rec.borrow_mut().stream_finished();
                        break;
                    }
                    Ok(n) => rec.borrow_mut().stream(&buf[..n]),
                    Err(_) => break,
                }
            }
        }
        progress.notify_one();
    };
    let main = async {
        let mut queued = 0;
        // Queues a burst in one go: no await, so the driver cannot take any of it meanwhile.
        let queue = |queued: &mut u64, burst: usize, ms: &[Msg]| {
            for (i, m) in ms.iter().enumerate() {
                let p = payload(role, burst, i, m.len);
                match conn.try_send_message(p, props(role, burst, m)) {
                    Ok(n) if n == *queued => {}
                    other => rec
                        .borrow_mut()
                        .out
                        .problems
                        .push(format!("queueing message {queued}: {other:?}")),
                }
                *queued += 1;
            }
        };
        let Ok(mut stream) = conn.open_stream().await else {
            return;
        };
        let mut offset = 0;
        for (b, step) in trace.side(role).steps.iter().enumerate() {
            match step {
                Step::Burst(ms) => queue(&mut queued, b, ms),
                Step::Stream(n) => {
                    if let Err(e) = stream.write_all(&stream_data(role, offset, *n)).await {
                        rec.borrow_mut()
                            .out
                            .problems
                            .push(format!("stream write: {e}"));
                    }
                    offset += *n as u64;
                }
            }
        }
        if let Err(e) = stream.shutdown().await {
            rec.borrow_mut()
                .out
                .problems
                .push(format!("stream finish: {e}"));
        }
        // The barrier (see the module docs).
        let statuses_until = async |queued: u64| {
            while (rec.borrow().out.statuses.len() as u64) < queued {
                match conn.next_message_status().await {
                    Ok((n, s)) => rec.borrow_mut().status(n, s),
                    Err(_) => return false,
                }
            }
            true
        };
        let wait_for = async |what: fn(&Recorder) -> bool| loop {
            let notified = progress.notified();
            if what(&rec.borrow()) || conn.close_reason().is_some() {
                break;
            }
            notified.await;
        };
        if !statuses_until(queued).await {
            return;
        }
        wait_for(|r| r.out.stream_finished).await;
        let count = rec.borrow().count(MessageStatus::Sent);
        match conn.try_send_message(count.to_le_bytes().to_vec(), summary_props()) {
            Ok(_) => {}
            Err(e) => rec.borrow_mut().out.problems.push(format!("summary: {e}")),
        }
        queued += 1;
        if !statuses_until(queued).await {
            return;
        }
        wait_for(Recorder::has_everything).await;
        match trace.close_of(role) {
            None => {}
            Some(Close::Graceful) => conn.close().await,
            Some(Close::Abort { code, doomed }) => {
                queue(&mut queued, DOOMED_BURST, &doomed);
                conn.abort(code, &abort_reason(code));
            }
        }
    };
    let ((), (), ()) = tokio::join!(receive, read_stream, main);
    let end = conn.closed().await;
    let mut r = rec.borrow_mut();
    r.end(end);
    while let Some((n, s)) = conn.try_next_message_status() {
        r.status(n, s);
    }
    let st = conn.stats().session;
    r.formats(st.send_format, st.receive_format);
}

/// Fails a run that would otherwise hang; not a timing assertion.
const STALL: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    // One thread: a burst queued without an await is queued in one go.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs `role`'s side of `trace` on the connection `open` makes, on a current-thread runtime
/// of its own (on the calling thread). A stall is one of the outcome's problems.
fn run_side(trace: &Trace, role: Role, open: impl AsyncFnOnce() -> Connection) -> SideOutcome {
    let rec = RefCell::new(Recorder::new(role, trace.side(other(role)).clone()));
    let r = runtime().block_on(async {
        tokio::time::timeout(STALL, async {
            tokio_side(open().await, trace, role, &rec).await;
        })
        .await
    });
    let mut out = rec.into_inner().finish();
    if r.is_err() {
        out.problems.push(format!("stalled for {STALL:?}"));
    }
    out
}

/// Runs the server's side (`server`, on a thread of its own) and the client's (`client`,
/// on this thread); `server` sends on the channel once it listens.
fn run_tokio(
    server: impl FnOnce(mpsc::Sender<()>) -> SideOutcome + Send,
    client: impl FnOnce(mpsc::Receiver<()>) -> SideOutcome,
) -> Outcomes {
    let (listening, ready) = mpsc::channel();
    std::thread::scope(|scope| {
        let server = scope.spawn(move || server(listening));
        let client = client(ready);
        let server = server.join().unwrap_or_else(|_| SideOutcome {
            problems: vec!["the server side panicked".into()],
            ..SideOutcome::default()
        });
        Outcomes { client, server }
    })
}

fn other(role: Role) -> Role {
    match role {
        Role::Client => Role::Server,
        Role::Server => Role::Client,
    }
}

// ------------------------------------------------------------------------ the properties

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

/// Runs `case` on `cases()` random traces; on a failure, shrinks a little and panics with
/// the smallest failing trace's report.
fn check_traces(case: impl Fn(&Trace) -> Result<(), String>) {
    let config = ProptestConfig {
        cases: cases(),
        // Each case runs real connections: shrink, but not for long.
        max_shrink_iters: 64,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&trace_strategy(), |trace| {
        case(&trace).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, _)) => panic!("{why}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn byte_stream_core_in_simulator_matches_tokio_driver_on_loopback() {
    check_traces(|trace| {
        let sim = run_sim(trace, false, false);
        let (addr_tx, addr_rx) = mpsc::channel();
        let real = run_tokio(
            |listening| {
                run_side(trace, Role::Server, async || {
                    let ep = Endpoint::bind("127.0.0.1:0", ConnectionConfig::default())
                        .await
                        .expect("bind");
                    addr_tx
                        .send(ep.local_addr().expect("address"))
                        .expect("address");
                    listening.send(()).expect("signal");
                    ep.accept().await.expect("accept")
                })
            },
            |ready| {
                run_side(trace, Role::Client, async || {
                    ready.recv().expect("server listening");
                    let addr = addr_rx.recv().expect("address");
                    Connection::connect(addr, ConnectionConfig::default())
                        .await
                        .expect("connect")
                })
            },
        );
        compare(
            trace,
            FrameFormat::Plain,
            sim,
            "tokio over kernel TCP",
            real,
        )
    });
}

#[test]
#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]
fn utcp_core_in_simulator_matches_tokio_driver_on_tun_stacks() {
    use squarepeg_io::StackConfig;
    use squarepeg_lab::net::{Lab, LabConfig, Role as LabRole};
    use squarepeg_lab::stack::LabStack;

    if !squarepeg_lab::stack::can_run() {
        return;
    }
    // One lab for every case (its namespaces go when it is dropped, also on a panic); each
    // case listens on a port of its own. A little delay and loss: retransmissions and
    // out-of-order segments must not change the outcome either.
    let link = || -> LinkConfig { "delay=2ms loss=1%".parse().expect("link") };
    let lab = Lab::start(
        LabConfig::new(&format!("sqeq{}", std::process::id() % 10_000))
            .with_seed(7)
            .with_up(link())
            .with_down(link()),
    )
    .expect("start lab");
    let client = LabStack::attach(&lab, LabRole::Client, StackConfig::new([]), Some(1500))
        .expect("attach client stack");
    let server = LabStack::attach(&lab, LabRole::Server, StackConfig::new([]), Some(1500))
        .expect("attach server stack");
    let server_ns = lab.server();
    let port = AtomicU16::new(7100);
    check_traces(|trace| {
        // uTCP ↔ uTCP: a TUN stack at each end of the lab.
        let sim = run_sim(trace, true, true);
        let addr = SocketAddr::new(server.address(false), port.fetch_add(1, Ordering::Relaxed));
        let real = run_tokio(
            |listening| {
                run_side(trace, Role::Server, async || {
                    let config = ConnectionConfig::default();
                    let ep = Endpoint::listen_utcp(server.stack(), addr, config).expect("listen");
                    listening.send(()).expect("signal");
                    ep.accept().await.expect("accept")
                })
            },
            |ready| {
                run_side(trace, Role::Client, async || {
                    ready.recv().expect("server listening");
                    let config = ConnectionConfig::default();
                    Connection::connect_utcp(client.stack(), addr, config)
                        .await
                        .expect("connect")
                })
            },
        );
        compare(trace, FrameFormat::Ucobs, sim, "tokio, uTCP ↔ uTCP", real)?;

        // uTCP client ↔ kernel-TCP server (in the server's namespace). The kernel side
        // reads in order but its peer does not: uCOBS both ways.
        let sim = run_sim(trace, true, false);
        let addr = SocketAddr::new(
            lab.addresses().server(false),
            port.fetch_add(1, Ordering::Relaxed),
        );
        let real = run_tokio(
            |listening| {
                server_ns
                    .run(|| {
                        run_side(trace, Role::Server, async || {
                            let ep = Endpoint::bind(addr, ConnectionConfig::default())
                                .await
                                .expect("bind");
                            listening.send(()).expect("signal");
                            ep.accept().await.expect("accept")
                        })
                    })
                    .expect("enter the server namespace")
            },
            |ready| {
                run_side(trace, Role::Client, async || {
                    ready.recv().expect("server listening");
                    let config = ConnectionConfig::default();
                    Connection::connect_utcp(client.stack(), addr, config)
                        .await
                        .expect("connect")
                })
            },
        );
        compare(
            trace,
            FrameFormat::Ucobs,
            sim,
            "tokio, uTCP ↔ kernel TCP",
            real,
        )
    });
}

#[test]
fn the_comparison_reports_a_difference() {
    // The comparison itself: equal outcomes give no lines, any changed field one.
    let mut a = Outcomes::default();
    a.client.statuses.insert(0, MessageStatus::Sent);
    a.server.delivered.insert(
        0,
        Delivery {
            substream: 1,
            len: 3,
            digest: "00".into(),
        },
    );
    assert!(diff(&a, &a.clone()).is_empty());
    let mut b = a.clone();
    b.client.statuses.insert(0, MessageStatus::Squashed);
    b.server.end = Some(ConnectionError::LocallyClosed);
    let d = diff(&a, &b);
    assert_eq!(d.len(), 2, "{d:?}");
    assert!(d[0].contains("status of 0: Sent | Squashed"), "{d:?}");
}
