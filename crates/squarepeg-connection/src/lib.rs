//! The sans-IO squarepeg connection: one [`Session`], its frame codec, the record layer, and
//! the adapter to the substrate below, in one type that every driver drives — the tokio
//! drivers of the `squarepeg` crate, the simulator's hosts, the experiments and the tests —
//! as quinn's drivers and tests all drive `quinn_proto::Connection`.
//!
//! A [`Connection`] does no I/O, reads no clock and depends on no runtime. It is fed what the
//! substrate delivered and the time, and polled for what to hand the substrate, for the
//! application's events ([`Connection::poll_event`]) and for its next timer
//! ([`Connection::poll_timeout`]). The application's side — messages, streams, priorities,
//! lifetimes, close — is the session ([`Connection::session_mut`]).
//!
//! # Substrates
//!
//! A connection is made for a [`Substrate`]: how it receives and how it sends.
//!
//! - **In-order byte stream** ([`Receive::InOrder`], [`Send::ByteStream`]: kernel TCP, or the
//!   userspace TCP read and written as a plain stream). Received bytes go into the frame
//!   reader ([`Connection::handle_bytes`], or zero-copy through [`Connection::take_receiver`]);
//!   a frame that fails to decode is a protocol violation (the stream is reliable, so the peer
//!   sent it). Frames to send are appended to the driver's buffer by
//!   [`Connection::poll_transmit`] as the transport can take them, so the session's scheduler
//!   decides as late as possible (late binding).
//! - **Segments and tagged writes** ([`Receive::Segments`], [`Send::TaggedWrites`]: the
//!   userspace TCP's uTCP interface, Minion §4). Every segment goes in with its stream offset
//!   ([`Connection::handle_segment`]), out of order and more than once; the uCOBS reassembler
//!   yields each frame as soon as its bytes between two markers are present and its checksum
//!   holds, and the session delivers a message at once, each number once. Frames that fail
//!   their checksum (a middlebox mixing two transmissions, Hollywood §4.5) are dropped and
//!   counted. The peer's CLOSE waits until everything before it has arrived. Frames to send
//!   leave one at a time as tagged writes ([`Connection::poll_write`]) for the TCP's tagged
//!   queue, which binds late itself (priority insertion, squash, deadlines, inconsistent
//!   retransmissions, Minion §4.2 and Hollywood §4.2) and reports each message's fate
//!   ([`Connection::handle_report`]); see "Message statuses".
//!
//! [`EndpointLink`] drives a connection on a `squarepeg_tcp::Endpoint` (the simulator's
//! hosts and the tests); the `squarepeg` crate's tokio driver drives it over a kernel socket
//! or over `squarepeg-io`'s TUN stack.
//!
//! # Framing per connection
//!
//! Every connection starts in uCOBS (docs/wire.md §1). uCOBS's markers are needed only where
//! a receiver reads segments out of order, or a sender may replace retransmitted bytes. Each
//! side's PARAMS says which frame formats it can receive; a sender whose peer reads in order
//! and who never replaces retransmissions switches its direction to plain frames
//! (length-prefixed, no stuffing and no checksum, docs/wire.md §3) with a Switch frame,
//! after which every byte is in the new format. A peer that does not announce plain frames
//! (an older squarepeg, a stock uCOBS receiver, a uTCP receiver) keeps getting uCOBS.
//!
//! # Message statuses
//!
//! The session reports `Sent` when it hands a message over. Over a byte stream that is the
//! end. Over tagged writes it is not yet, so the connection holds the session's status of a
//! message written to the TCP and reports the TCP queue's verdict instead:
//! - dropped before its first transmission: `Expired` (deadline) or `Squashed`;
//! - transmitted, without a deadline: `Sent`;
//! - transmitted, with a deadline: `Sent` once acknowledged, `Replaced` if a retransmission
//!   of its range carried other messages instead (it arrives only if its first transmission
//!   did); messages sent *as* replacements are counted in
//!   [`UtcpStats::sent_as_replacement`];
//! - still undecided when the connection ends (the transport's end, or the session drained;
//!   after a graceful close of ours, the messages queued in the TCP before the CLOSE still go
//!   out and get their verdicts first): `Sent` if transmitted, otherwise `Discarded`.
//!
//! Statuses come as runs: `Event::MessageStatus { numbers, status }` covers consecutive
//! message numbers that got the same status in a row (a batch sent together is one event);
//! over tagged writes a run of `Sent` is split around the messages whose verdict the TCP's
//! queue still owes.
//!
//! # Driver contract
//!
//! After anything happened (bytes or segments arrived, a report, a timer, an application
//! call on the session), a driver:
//! - hands the substrate what [`Connection::poll_transmit`] (byte stream) or
//!   [`Connection::poll_write`] / [`Connection::write_done`] (tagged writes) give, while
//!   the substrate takes more;
//! - ends its sending direction once [`Connection::poll_shutdown`] says so and everything
//!   handed out before is written;
//! - reads only while [`Connection::wants_read`];
//! - drains [`Connection::poll_event`];
//! - calls [`Connection::handle_timeout`] at [`Connection::poll_timeout`];
//! - reports the substrate's end with [`Connection::handle_transport_closed`], and stops
//!   at [`Connection::is_drained`].

mod config;
mod link;
pub mod multipath;
mod receive;
pub mod record;
mod send;

use std::time::{Duration, Instant};

pub use config::{Config, Receive, Send, Substrate};
pub use link::{EndpointLink, tcp_config, tcp_error, transport_error};
pub use receive::Receiver;
pub use record::{Protection, TlsSetup};
pub use send::TaggedWrite;

pub use multipath::{
    ClosedPath, MultipathConfig, MultipathConnection, MultipathStats, Path, PathEvent, PathId,
    PathInfo,
};
pub use squarepeg_framing::FrameFormat;
pub use squarepeg_session::{
    Config as SessionConfig, ConfigError, ConnectionError, Event, PathPolicy, Role, Session,
    Stats as SessionStats, TlsFailure, TransportError,
};
pub use squarepeg_tcp::{MessageReport, WriteTag};

use receive::{SegmentReceiver, TlsSegmentReceiver};
use record::{RecordLayer, TlsLayer, tls_transport_error};
use send::TaggedSender;
use squarepeg_framing::Decoded;
use squarepeg_session::control::record_numbers;
use squarepeg_tls::OutOfOrderConfig;
pub use squarepeg_tls::{EarlyData, Tls, TlsError, TlsStats};

/// How much of the session's output a client gathers to offer as early data: more than a
/// ticket usually allows (squarepeg servers allow 16 KiB); what does not fit is sealed first
/// after the handshake.
pub(crate) const EARLY_DATA_GATHER: usize = 16 * 1024;

/// Counters of the uTCP interface (segments in, tagged writes out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UtcpStats {
    /// Segments (or pieces of them) received.
    pub segments_read: u64,
    /// Bytes received in segments (duplicates included).
    pub bytes_read: u64,
    /// Byte ranges between markers that were not valid frames (checksum, encoding); dropped.
    pub frames_rejected: u64,
    /// Segments the reassembler refused (over its memory limit).
    pub segments_refused: u64,
    /// Frames written to the TCP queue.
    pub frames_written: u64,
    /// Messages dropped by the TCP queue before their first transmission (deadline).
    pub expired_in_tcp: u64,
    /// Messages squashed in the TCP queue.
    pub squashed_in_tcp: u64,
    /// Transmitted messages whose retransmission carried other messages (Hollywood §4.2).
    pub replaced: u64,
    /// Messages first transmitted in the range of replaced ones.
    pub sent_as_replacement: u64,
}

/// Counters of a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// The session's counters.
    pub session: SessionStats,
    /// Over the uTCP interface: its counters.
    pub utcp: Option<UtcpStats>,
    /// Over TLS: the record layer's counters.
    pub tls: Option<TlsStats>,
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NewConnectionError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("reassembler: {0}")]
    Reassembly(#[from] squarepeg_framing::ReassemblyError),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

#[derive(Debug)]
enum ReceivePath {
    /// In order; `None` while the driver has borrowed the receiver.
    InOrder(Option<Box<Receiver>>),
    Segments(Box<SegmentReceiver>),
    /// TLS records found in segments (Minion §6).
    TlsSegments(Box<TlsSegmentReceiver>),
}

#[derive(Debug)]
enum SendPath {
    ByteStream,
    Tagged(Box<TaggedSender>),
}

/// One squarepeg connection over one substrate (crate docs).
#[derive(Debug)]
pub struct Connection {
    session: Session,
    substrate: Substrate,
    receive: ReceivePath,
    send: SendPath,
    record: RecordLayer,
    utcp: Option<UtcpStats>,
    /// The sending direction's end was handed out ([`Connection::poll_shutdown`]).
    fin_sent: bool,
    /// The substrate ended (or failed); reported to the session once.
    transport_closed: bool,
    /// `Config::release_idle_after`.
    release_idle_after: Option<Duration>,
    /// The last time bytes were read or output was taken, while the memory an idle
    /// connection need not hold has not been given back since.
    active_at: Option<Instant>,
    /// The idle timer gave memory back since the driver last asked
    /// ([`Connection::take_idle_released`]).
    idle_released: bool,
}

impl Connection {
    /// A connection for an established transport connection of `substrate`.
    pub fn new(
        role: Role,
        config: Config,
        substrate: Substrate,
    ) -> Result<Self, NewConnectionError> {
        config.validate()?;
        let mut record = match &config.tls {
            None => RecordLayer::Cleartext,
            Some(setup) => {
                if setup.is_client() != (role == Role::Client) {
                    return Err(ConfigError("the TLS side must match the connection's role").into());
                }
                let mut tls = match setup {
                    // A client that may offer early data makes its ClientHello at the first
                    // poll, with what the application queued by then (see
                    // `Connection::poll_transmit` and `Connection::poll_write`).
                    TlsSetup::Client {
                        config,
                        server_name,
                    } if config.enable_early_data => {
                        Tls::client_deferred(config.clone(), server_name)?
                    }
                    _ => setup.start()?,
                };
                // A squarepeg peer may number its records (announced in PARAMS below).
                tls.accept_numbered_records();
                if let Receive::Segments { window } = substrate.receive {
                    // Stock senders' records are not read out of order here: squarepeg's
                    // frames need a whole-unit record, which only numbered records mark.
                    let mut ooo = OutOfOrderConfig::new(window);
                    ooo.predictions = 0;
                    tls.enable_out_of_order(ooo);
                }
                RecordLayer::Tls(Box::new(TlsLayer::new(tls, config.handshake_timeout)))
            }
        };
        let tls = matches!(record, RecordLayer::Tls(_));
        let receive_plain = config.plain_frames && substrate.receives_in_order();
        let send_plain = config.plain_frames && substrate.may_send_plain();
        let receive = match substrate.receive {
            Receive::InOrder => {
                let pinned = config.session.message_receive_queue + 4 * config.read_buffer;
                let mut receiver = Receiver::new(config.read_buffer, pinned, receive_plain);
                if tls {
                    receiver.start_plain();
                }
                ReceivePath::InOrder(Some(Box::new(receiver)))
            }
            Receive::Segments { .. } if tls => {
                let pinned = config.session.message_receive_queue + 4 * config.read_buffer;
                ReceivePath::TlsSegments(Box::new(TlsSegmentReceiver::new(
                    config.read_buffer,
                    pinned,
                )))
            }
            Receive::Segments { window } => {
                ReceivePath::Segments(Box::new(SegmentReceiver::new(window)?))
            }
        };
        let send = match substrate.send {
            Send::ByteStream => SendPath::ByteStream,
            Send::TaggedWrites => SendPath::Tagged(Box::default()),
        };
        if let RecordLayer::Tls(t) = &mut record {
            // Every byte the record layer hands out goes on the stream in order, or (tagged
            // writes) the TCP queue's reports say which did not and where the rest went: a
            // numbered close_notify can say where it starts (docs/wire.md §5).
            t.tls.set_output_in_order(true);
        }
        let uses_utcp =
            !matches!(receive, ReceivePath::InOrder(_)) || matches!(send, SendPath::Tagged(_));
        let mut session = Session::new(role, config.session)?;
        if tls {
            // Records delimit and authenticate: plain frames from the first byte (docs/wire.md
            // §4).
            session.use_plain_frames();
            session.announce_record_numbers(record_number_bits(substrate));
        } else {
            session.set_frame_formats(receive_plain, send_plain);
        }
        Ok(Self {
            session,
            substrate,
            receive,
            send,
            record,
            utcp: uses_utcp.then(UtcpStats::default),
            fin_sent: false,
            transport_closed: false,
            release_idle_after: config.release_idle_after,
            active_at: None,
            idle_released: false,
        })
    }

    /// The substrate this connection was made for.
    pub fn substrate(&self) -> Substrate {
        self.substrate
    }

    /// How this connection's bytes are protected.
    pub fn protection(&self) -> Protection {
        match self.record {
            RecordLayer::Cleartext => Protection::Cleartext,
            RecordLayer::Tls(_) => Protection::Tls,
        }
    }

    /// The TLS connection (peer certificates, cipher suite, key updates), if any.
    pub fn tls(&self) -> Option<&Tls> {
        match &self.record {
            RecordLayer::Tls(t) => Some(&t.tls),
            RecordLayer::Cleartext => None,
        }
    }

    /// TLS, to act on it (e.g. [`Tls::initiate_key_update`]); the driver polls afterwards.
    pub fn tls_mut(&mut self) -> Option<&mut Tls> {
        match &mut self.record {
            RecordLayer::Tls(t) => Some(&mut t.tls),
            RecordLayer::Cleartext => None,
        }
    }

    /// Whether the connection is ready for the application's data to flow: at once in
    /// cleartext; over TLS once the handshake is done. (Data sent before waits in the
    /// session.)
    pub fn is_established(&self) -> bool {
        match &self.record {
            RecordLayer::Cleartext => true,
            RecordLayer::Tls(t) => !t.tls.is_handshaking(),
        }
    }

    /// The session: send and receive messages, open and use streams, close.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The session, to act on it. After a call that may produce output (queueing a message,
    /// writing a stream, closing), the driver polls for it.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        Stats {
            session: self.session.stats(),
            utcp: self.utcp,
            tls: self.tls().map(Tls::stats),
        }
    }

    // ------------------------------------------------------------------ receiving

    /// Whether the driver should read: the session has room for what arrives, and the
    /// substrate has not ended.
    pub fn wants_read(&self) -> bool {
        // After a TLS failure the peer's bytes are still read, and dropped, while the session
        // drains (`Session::handle_transport_failed`).
        !self.transport_closed && !self.session.receive_blocked()
    }

    /// In-order bytes from the substrate (copied into the frame reader).
    pub fn handle_bytes(&mut self, now: Instant, data: &[u8]) {
        self.note_running(now);
        self.note_active(now);
        if let RecordLayer::Tls(_) = self.record {
            self.handle_tls_bytes(now, data);
            return;
        }
        match &mut self.receive {
            ReceivePath::InOrder(Some(r)) => r.push(data),
            ReceivePath::InOrder(None) => {
                self.driver_misuse(now, "in-order bytes handed in while the receiver is lent");
                return;
            }
            ReceivePath::Segments(_) | ReceivePath::TlsSegments(_) => {
                self.driver_misuse(now, "in-order bytes on a segment substrate");
                return;
            }
        }
        self.take_frames(now);
    }

    /// [`Self::handle_bytes`] for a read of `len` bytes into `buf`, which the connection may
    /// keep: under TLS the records are opened where they were read (no copy) and `buf` is
    /// then another buffer, at least as long, for the next read.
    pub fn handle_read(&mut self, now: Instant, buf: &mut Vec<u8>, len: usize) {
        self.note_running(now);
        self.note_active(now);
        let len = len.min(buf.len());
        if let RecordLayer::Cleartext = self.record {
            self.handle_bytes(now, &buf[..len]);
            return;
        }
        self.open_tls(now, |tls, r| record::open_buffer_into(tls, r, buf, len));
    }

    /// Lends the in-order receiver, so that the driver reads and decodes without holding the
    /// connection; give it back with [`Self::return_receiver`]. `None` on a segment
    /// substrate, or while it is lent.
    pub fn take_receiver(&mut self) -> Option<Box<Receiver>> {
        if let RecordLayer::Tls(_) = self.record {
            // Records are opened in the connection ([`Self::handle_bytes`]).
            return None;
        }
        match &mut self.receive {
            ReceivePath::InOrder(r) => r.take(),
            ReceivePath::Segments(_) | ReceivePath::TlsSegments(_) => None,
        }
    }

    /// Whether [`Self::take_receiver`] would give the receiver now (it is not out).
    pub fn receiver_available(&self) -> bool {
        !matches!(self.record, RecordLayer::Tls(_))
            && matches!(self.receive, ReceivePath::InOrder(Some(_)))
    }

    /// Takes the receiver back and hands the frames it decoded to the session.
    pub fn return_receiver(&mut self, now: Instant, receiver: Box<Receiver>) {
        if let ReceivePath::InOrder(slot @ None) = &mut self.receive {
            *slot = Some(receiver);
            self.note_active(now);
            self.take_frames(now);
        }
    }

    /// Moves decoded frames from the in-order receiver into the session.
    fn take_frames(&mut self, now: Instant) {
        let ReceivePath::InOrder(Some(r)) = &mut self.receive else {
            return;
        };
        while let Some(decoded) = r.next_decoded() {
            match decoded {
                Decoded::Messages(run) => self.session.handle_message_run(run),
                Decoded::Frame(Ok(f)) => self.session.handle_frame(now, f),
                // The stream is reliable and in order: the peer sent it.
                Decoded::Frame(Err(e)) => self.session.handle_decode_error(now, e),
            }
        }
    }

    /// A segment (or piece of one) at stream offset `offset`, on a segment substrate.
    pub fn handle_segment(&mut self, now: Instant, offset: u64, data: &[u8]) {
        self.note_running(now);
        self.note_active(now);
        if let ReceivePath::TlsSegments(_) = self.receive {
            self.handle_tls_segment(now, offset, data);
            return;
        }
        match &mut self.receive {
            ReceivePath::Segments(r) => {
                let stats = self.utcp.get_or_insert_default();
                r.handle_segment(now, &mut self.session, stats, offset, data);
            }
            ReceivePath::InOrder(_) | ReceivePath::TlsSegments(_) => {
                self.driver_misuse(now, "a segment on an in-order substrate")
            }
        }
    }

    /// A report of the TCP's tagged queue about a message this connection wrote.
    pub fn handle_report(&mut self, report: MessageReport) {
        if let SendPath::Tagged(t) = &mut self.send {
            let withdrawn = t.handle_report(report, self.utcp.get_or_insert_default());
            if let RecordLayer::Tls(layer) = &mut self.record {
                layer.tls.withdraw_output(withdrawn);
            }
        }
    }

    /// The substrate ended (the peer's FIN: [`TransportError::PeerClosed`]) or failed. Told to
    /// the session once; later calls change nothing.
    pub fn handle_transport_closed(&mut self, now: Instant, reason: TransportError) {
        if !self.transport_closed {
            self.transport_closed = true;
            let mut reason = reason;
            if let RecordLayer::Tls(t) = &mut self.record {
                // The stream ended where it was held on bytes that never authenticated (no
                // replacement covered them), or its FIN came inside a record: that is the
                // record layer's failure, not a peer that closed. (A reset or a timeout keeps
                // its own reason.)
                let cut = if t.tls.ends_held() {
                    Some(TlsError::Decrypt)
                } else if reason == TransportError::PeerClosed && t.tls.ends_inside_record() {
                    Some(TlsError::BadRecord)
                } else {
                    None
                };
                if let Some(e) = cut {
                    t.failed = true;
                    reason = tls_transport_error(&e);
                }
            }
            self.session.handle_transport_closed(now, reason);
            if let SendPath::Tagged(t) = &mut self.send {
                // Nothing more will be transmitted or reported.
                t.settle_all();
            }
        }
    }

    /// Whether the substrate's end was reported.
    pub fn is_transport_closed(&self) -> bool {
        self.transport_closed
    }

    /// A driver broke the contract (a bug, not the peer's doing): close rather than lose
    /// bytes silently.
    fn driver_misuse(&mut self, now: Instant, what: &str) {
        tracing::error!("squarepeg connection: {what}");
        debug_assert!(false, "{what}");
        self.handle_transport_closed(now, TransportError::Io(std::io::ErrorKind::InvalidInput));
    }

    // ------------------------------------------------------------------ sending

    /// Appends frames to `out` (a byte stream's output) until it holds at least `limit`
    /// bytes or nothing is left to send now; returns the number of frames taken from the
    /// session. Ask only when the substrate can take more, so that the scheduler decides as
    /// late as possible. Over TLS the frames go out sealed in records, each filled up to its
    /// room while the session has more to send (stream chunks cut to fit; a frame that
    /// overflows a record continues in the next), and sealed where they were written; a call
    /// may append records and return 0 (what overflowed the last call's records).
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>, limit: usize) -> usize {
        self.note_running(now);
        let before = out.len();
        let frames = self.poll_transmit_inner(now, out, limit);
        if out.len() > before {
            self.note_active(now);
        }
        frames
    }

    /// [`Self::poll_transmit`] but for noting the activity.
    fn poll_transmit_inner(&mut self, now: Instant, out: &mut Vec<u8>, limit: usize) -> usize {
        if !matches!(self.send, SendPath::ByteStream) || self.fin_sent {
            return 0;
        }
        if self.transport_closed {
            // The peer's end does not end this side's stream: a TLS alert (or close_notify)
            // queued before it still goes out — e.g. the alert for a peer that does not
            // speak TLS, whose FIN came with its first bytes.
            if let RecordLayer::Tls(t) = &mut self.record {
                t.tls.poll_output(out);
            }
            return 0;
        }
        let RecordLayer::Tls(t) = &mut self.record else {
            return self.session.poll_transmit_batch(now, out, limit);
        };
        if t.tls.is_hello_pending() {
            // TLS 1.3 early data (0-RTT): PARAMS and the messages marked safely replayable
            // go behind the ClientHello, as far as a ticket allows. They are the first bytes
            // of this side's plaintext stream either way: what the server does not take
            // (beyond the ticket's limit, or all of it if it rejects early data) is sealed
            // first after the handshake (RFC 8446 §4.2.10).
            if let Err(e) = t.start_client_with_early_data(now, &mut self.session) {
                t.tls.poll_output(out);
                self.tls_failed(now, &e);
                return 0;
            }
        }
        // Handshake flights, KeyUpdates, alerts first: they go on the wire in order.
        t.tls.poll_output(out);
        if t.failed {
            t.alert_out = true;
        }
        if t.tls.is_handshaking() && t.tls.may_seal_half_rtt() && !t.failed {
            // Server: answers to early data (and anything else the session has) go in the
            // first flight, before the client's Finished (0.5-RTT, RFC 8446 §4.4.4).
            let frames = self.session.poll_transmit_batch(
                now,
                &mut t.staging,
                limit.saturating_sub(out.len()),
            );
            if !t.staging.is_empty() {
                match t.tls.seal_half_rtt(&t.staging, out) {
                    Ok(true) => t.staging.clear(),
                    // Sealed after the handshake instead.
                    Ok(false) => {}
                    Err(e) => self.tls_failed(now, &e),
                }
            }
            return frames;
        }
        if t.tls.is_handshaking() || t.failed || t.close_notify_out {
            return 0;
        }
        if let Some(rest) = t.early_not_taken() {
            // What the server did not take of the early data goes first.
            t.staging.splice(t.carry_pos..t.carry_pos, rest);
        }
        // Frames are written straight into the records' places in `out` and sealed there
        // (no copy); the session cuts stream chunks to each record's room, so bulk data
        // fills records exactly. What overflows a record (a frame longer than the room left,
        // a control frame) is carried into the next one.
        let room = t.tls.record_room();
        let mut frames = 0;
        let mut failure = None;
        while out.len() < limit {
            let slot = match t.tls.begin_record(out) {
                Ok(slot) => slot,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let content = slot.content_start();
            let starts_inside = t.carry_pos < t.staging.len() && t.carry_cut;
            let carried = room.min(t.staging.len() - t.carry_pos);
            out.extend_from_slice(&t.staging[t.carry_pos..t.carry_pos + carried]);
            t.carry_pos += carried;
            let mut ends_inside = false;
            let mut full = true;
            if t.carry_pos < t.staging.len() {
                // Still carrying: whether the record ends on a frame's end is not known here,
                // so this record may end, and the next begin, inside one.
                ends_inside = true;
                t.carry_cut = true;
            } else {
                t.staging.clear();
                t.carry_pos = 0;
                t.carry_cut = false;
                if carried < room {
                    let batch =
                        self.session
                            .poll_transmit_fitted(now, out, room - carried, carried == 0);
                    frames += batch.frames;
                    let len = out.len() - content;
                    full = len >= room || batch.next_does_not_fit;
                    if len > room {
                        t.staging.extend_from_slice(&out[content + room..]);
                        out.truncate(content + room);
                        t.carry_cut = true;
                        ends_inside = true;
                    }
                }
            }
            let empty = out.len() == content;
            t.tls.finish_record(out, slot, starts_inside, ends_inside);
            if empty || !full {
                // The session has nothing more now.
                break;
            }
        }
        let carrying = t.carry_pos < t.staging.len();
        match failure {
            None if self.session.is_send_finished() && !carrying => {
                // The session's last frame is out: close_notify, then the FIN (RFC 8446 §6.1).
                t.tls.send_close_notify();
                t.tls.poll_output(out);
                t.close_notify_out = true;
            }
            None => {}
            Some(e) => self.tls_failed(now, &e),
        }
        frames
    }

    /// In-order ciphertext: opened record by record into the frame reader.
    fn handle_tls_bytes(&mut self, now: Instant, data: &[u8]) {
        self.open_tls(now, |tls, r| record::open_into(tls, r, data));
    }

    /// In-order ciphertext opened by `open` into the frame reader; then its frames to the
    /// session, and any failure.
    fn open_tls(
        &mut self,
        now: Instant,
        open: impl FnOnce(&mut Tls, &mut Receiver) -> Result<(), TlsError>,
    ) {
        let (RecordLayer::Tls(t), ReceivePath::InOrder(Some(r))) =
            (&mut self.record, &mut self.receive)
        else {
            self.driver_misuse(now, "TLS bytes while the receiver is lent");
            return;
        };
        if t.failed {
            return;
        }
        let result = open(&mut t.tls, r);
        self.take_frames(now);
        self.update_numbering();
        if let Err(e) = result {
            self.tls_failed(now, &e);
        }
    }

    /// A segment of ciphertext at `offset` (TLS over segments, Minion §6).
    fn handle_tls_segment(&mut self, now: Instant, offset: u64, data: &[u8]) {
        let (RecordLayer::Tls(t), ReceivePath::TlsSegments(_)) =
            (&mut self.record, &mut self.receive)
        else {
            return;
        };
        let stats = self.utcp.get_or_insert_default();
        stats.segments_read += 1;
        stats.bytes_read += data.len() as u64;
        if t.failed {
            return;
        }
        let (mut offset, mut data) = (offset, data);
        loop {
            let (RecordLayer::Tls(t), ReceivePath::TlsSegments(r)) =
                (&mut self.record, &mut self.receive)
            else {
                return;
            };
            if t.tls.can_skip_held() {
                // The call skips a replaced range before any plaintext: a unit cut there is
                // gone, the reader starts afresh.
                r.restart_in_order();
            }
            let (records, reader) = (&mut r.records, &mut r.in_order);
            // In-order plaintext goes straight into the frame reader; what opened before an
            // error was authenticated: it counts.
            let result = t.tls.push_segment_with(
                offset,
                data,
                &mut |opened| reader.push(opened),
                &mut |record| records.push((record.offset, record.content.to_vec())),
            );
            t.held_since = t.tls.is_held().then(|| t.held_since.unwrap_or(now));
            // A CLOSE from a record delivered out of order waits until every record before
            // it was read in order: bytes merely received may be the rest of a record whose
            // header lies, never to authenticate.
            r.deliver(now, &mut self.session, t.tls.in_order_records_end());
            for range in self.session.take_records_replaced() {
                t.tls.note_replaced(range);
            }
            let resume = t.tls.can_resume_held();
            self.update_numbering();
            if let Err(e) = result {
                self.tls_failed(now, &e);
                return;
            }
            if !resume {
                return;
            }
            // Held inside a range the peer just announced, or on a copy it may have just
            // explained: move on now, not at the next segment (there may be none for a while).
            let RecordLayer::Tls(t) = &self.record else {
                return;
            };
            (offset, data) = (t.tls.in_order_offset(), &[]);
        }
    }

    /// The padder the TCP's send queue should use for this connection's inconsistent
    /// retransmissions (Hollywood §4.2), for a driver to install on the TCP connection when
    /// it has them on (`squarepeg_tcp::Endpoint::set_padder`): uCOBS padding in cleartext;
    /// under TLS, padding records sealed from record numbers the record layer reserves
    /// (docs/wire.md §5.1). `None` on a byte-stream substrate.
    pub fn padder(&mut self) -> Option<squarepeg_tcp::Padder> {
        if !matches!(self.send, SendPath::Tagged(_)) {
            return None;
        }
        Some(match &mut self.record {
            RecordLayer::Cleartext => {
                squarepeg_tcp::Padder::from_fn(squarepeg_framing::encode_padding)
            }
            RecordLayer::Tls(t) => {
                // The peer must know that a stop on unauthenticated bytes may be a splice
                // (announced before the first frame: drivers ask before any is sent).
                let bits = record_number_bits(self.substrate) | record_numbers::REPLACES;
                self.session.announce_record_numbers(bits);
                record::tls_padder(&mut t.tls)
            }
        })
    }

    /// Numbers this side's records once the peer's PARAMS asks for them (it reads out of
    /// order) or allows them while this side's tagged queue may reorder its writes
    /// (docs/wire.md §5).
    fn update_numbering(&mut self) {
        let RecordLayer::Tls(t) = &mut self.record else {
            return;
        };
        let Some(bits) = self.session.peer_record_numbers() else {
            return;
        };
        if bits & record_numbers::REPLACES != 0 {
            t.tls.expect_replacements();
        }
        if t.tls.is_sending_numbered() {
            return;
        }
        let tagged = matches!(self.send, SendPath::Tagged(_));
        if bits & record_numbers::OUT_OF_ORDER != 0 || (tagged && bits & record_numbers::READS != 0)
        {
            t.tls.send_numbered_records();
        }
    }

    /// TLS failed: the session ends with the reason; the alert saying why still goes out
    /// ([`Self::poll_transmit`]), then the FIN; what the peer still sends is read and dropped
    /// until its end or the drain timeout.
    fn tls_failed(&mut self, now: Instant, e: &TlsError) {
        tracing::debug!("TLS failed: {e}");
        if let RecordLayer::Tls(t) = &mut self.record {
            t.failed = true;
        }
        // The alert goes out, then the FIN; the peer's bytes still coming are read and
        // dropped until its end (or the drain timeout), so that no reset overtakes the alert.
        self.session
            .handle_transport_failed(now, tls_transport_error(e));
    }

    /// The next tagged write, on a tagged-write substrate: it stays the next one until
    /// [`Self::write_done`] says the substrate took it.
    pub fn poll_write(&mut self, now: Instant) -> Option<TaggedWrite<'_>> {
        self.note_running(now);
        if self.fin_sent || self.transport_closed {
            return None;
        }
        if let RecordLayer::Tls(_) = self.record {
            return self.poll_tls_write(now);
        }
        match &mut self.send {
            SendPath::Tagged(t) => t.poll_write(now, &mut self.session),
            SendPath::ByteStream => None,
        }
    }

    /// The record layer's own write (handshake flights, KeyUpdates, close_notify, alerts),
    /// if one is pending: nothing overtakes it (the last ones go at the tail).
    fn poll_tls_write_control(&self) -> Option<TaggedWrite<'_>> {
        let RecordLayer::Tls(t) = &self.record else {
            return None;
        };
        if !t.control_pending {
            return None;
        }
        let priority = if t.close_notify_requested || t.failed {
            i32::MIN
        } else {
            i32::MAX
        };
        Some(TaggedWrite {
            frame: &t.control,
            tag: WriteTag {
                priority,
                ..Default::default()
            },
        })
    }

    /// Tagged writes under TLS: the record layer's own records (handshake flights, the
    /// switch to numbered records, KeyUpdates) as writes nothing overtakes; then each frame
    /// sealed into records of its own, tagged as in cleartext once records are numbered
    /// (before that, in order: positional records may not be reordered or dropped); after
    /// the session's last frame, close_notify behind everything.
    fn poll_tls_write(&mut self, now: Instant) -> Option<TaggedWrite<'_>> {
        let (RecordLayer::Tls(t), SendPath::Tagged(sender)) = (&mut self.record, &mut self.send)
        else {
            return None;
        };
        // Ranges the padder filled since: the peer hears of them ahead of data.
        for range in t.tls.take_replaced() {
            self.session.announce_records_replaced(range);
        }
        if !t.control_pending && !sender.has_pending() {
            t.control.clear();
            let mut failure = None;
            if t.tls.is_hello_pending() {
                // Early data (0-RTT) as over a byte stream (`poll_transmit`): the ClientHello
                // and the early records are one write that nothing overtakes.
                failure = t.start_client_with_early_data(now, &mut self.session).err();
            }
            if t.tls.is_handshaking() && t.tls.may_seal_half_rtt() && !t.failed && failure.is_none()
            {
                // Server: an answer to early data rides behind the handshake flight (0.5-RTT),
                // in the same write.
                t.tls.poll_output(&mut t.control);
                t.staging.clear();
                self.session
                    .poll_transmit_batch(now, &mut t.staging, EARLY_DATA_GATHER);
                if !t.staging.is_empty() {
                    match t.tls.seal_half_rtt(&t.staging, &mut t.control) {
                        Ok(true) => {}
                        // Not possible now: the frames wait for the handshake's end, sealed
                        // first then (positional records, in order).
                        Ok(false) => t.early = Some(std::mem::take(&mut t.staging)),
                        Err(e) => failure = Some(e),
                    }
                }
            }
            t.tls.poll_output(&mut t.control);
            if !t.tls.is_handshaking()
                && !t.failed
                && failure.is_none()
                && let Some(rest) = t.early_not_taken()
            {
                // What the server did not take of the early data goes first.
                if let Err(e) = t.tls.seal(&rest, &mut t.control) {
                    failure = Some(e);
                }
            }
            if let Some(e) = failure {
                t.tls.poll_output(&mut t.control);
                t.control_pending = !t.control.is_empty();
                self.tls_failed(now, &e);
                return self.poll_tls_write_control();
            }
            if t.control.is_empty()
                && !t.close_notify_requested
                && !t.tls.is_handshaking()
                && !t.failed
                && self.session.is_send_finished()
                && t.close_placement_due(sender.placement())
            {
                // The session's last frame went out, and every message before it was sent or
                // dropped (the stream offset of what follows is known; or it never will be):
                // close_notify, then the FIN.
                t.tls.send_close_notify();
                t.close_notify_requested = true;
                t.tls.poll_output(&mut t.control);
            }
            t.control_pending = !t.control.is_empty();
        }
        if t.control_pending {
            return self.poll_tls_write_control();
        }
        if t.tls.is_handshaking() || t.failed || t.close_notify_requested {
            return None;
        }
        let tls = &mut t.tls;
        let sealed = &mut t.staging;
        let mut failure = None;
        let written = sender.poll_write_protected(now, &mut self.session, &mut |frame, tag| {
            sealed.clear();
            if let Err(e) = tls.seal(frame, sealed) {
                failure = Some(e);
                return false;
            }
            std::mem::swap(frame, sealed);
            if !tls.is_sending_numbered() {
                // Positional records must reach the wire in the order sealed, all of them.
                *tag = WriteTag {
                    priority: i32::MAX,
                    message_id: tag.message_id,
                    ..Default::default()
                };
            }
            true
        });
        if written.is_none() {
            if let Some(e) = failure {
                self.tls_failed(now, &e);
            }
            return None;
        }
        // The sealed frame is the pending write now.
        match &mut self.send {
            SendPath::Tagged(sender) => sender.poll_write(now, &mut self.session),
            SendPath::ByteStream => None,
        }
    }

    /// The substrate took the write [`Self::poll_write`] returned.
    pub fn write_done(&mut self) {
        if let RecordLayer::Tls(t) = &mut self.record
            && t.control_pending
        {
            t.control_pending = false;
            t.control.clear();
            if t.close_notify_requested {
                t.close_notify_out = true;
            }
            if t.failed {
                t.alert_out = true;
            }
            return;
        }
        if let SendPath::Tagged(t) = &mut self.send {
            t.write_done(self.utcp.get_or_insert_default());
        }
    }

    /// Whether the sending direction ends now (the TCP FIN): true once, after the session's
    /// last frame was handed out. End it once everything handed out before is written.
    pub fn poll_shutdown(&mut self) -> bool {
        let pending_write = matches!(&self.send, SendPath::Tagged(t) if t.has_pending())
            || matches!(&self.record, RecordLayer::Tls(t) if !t.may_end() || t.control_pending);
        if self.fin_sent
            || self.transport_closed
            || pending_write
            || !self.session.is_send_finished()
        {
            return false;
        }
        self.fin_sent = true;
        true
    }

    // ------------------------------------------------------------------ events, timers

    /// The next event for the application (message statuses as "Message statuses" says).
    pub fn poll_event(&mut self) -> Option<Event> {
        match &mut self.send {
            SendPath::Tagged(t) => {
                if self.session.is_drained() {
                    // The driver stops now: no report is coming any more.
                    t.settle_all();
                }
                t.poll_event(&mut self.session)
            }
            SendPath::ByteStream => self.session.poll_event(),
        }
    }

    /// Whether [`Self::poll_event`] has something (cheaper than asking it).
    pub fn has_events(&self) -> bool {
        self.session.has_events()
            || matches!(&self.send, SendPath::Tagged(t)
                if t.has_events() || (t.has_unsettled() && self.session.is_drained()))
    }

    /// When [`Self::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.session.poll_timeout(),
            self.hold_deadline(),
            self.handshake_deadline(),
            self.idle_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When an unfinished TLS handshake fails the connection (a timeout too long to add to
    /// the clock sets none).
    fn handshake_deadline(&self) -> Option<Instant> {
        match &self.record {
            RecordLayer::Tls(t) if !t.failed && t.tls.is_handshaking() => t
                .handshake_started
                .and_then(|start| start.checked_add(t.handshake_timeout)),
            _ => None,
        }
    }

    /// The connection runs at `now`: a TLS handshake's clock starts.
    fn note_running(&mut self, now: Instant) {
        if let RecordLayer::Tls(t) = &mut self.record {
            t.handshake_started.get_or_insert(now);
        }
    }

    /// Bytes were read or output taken at `now`: the idle timer starts again.
    fn note_active(&mut self, now: Instant) {
        if self.release_idle_after.is_some() {
            self.active_at = Some(now);
        }
    }

    /// When the connection, idle since its last bytes, gives back the memory it need not
    /// hold (`Config::release_idle_after`).
    fn idle_deadline(&self) -> Option<Instant> {
        self.active_at?.checked_add(self.release_idle_after?)
    }

    /// Gives back the memory of buffers that hold nothing now — the frame reader's read
    /// buffer and idle chunks, the TLS buffers, session queues grown in a burst — as the
    /// idle timer does (`Config::release_idle_after`); a driver may call it too. Nothing
    /// received or queued is dropped; the next bytes allocate again. (A receiver lent out
    /// keeps its memory: it is in use.)
    pub fn release_idle_memory(&mut self) {
        if let ReceivePath::InOrder(Some(r)) = &mut self.receive {
            r.release_idle();
        }
        if let RecordLayer::Tls(t) = &mut self.record {
            t.tls.release_idle();
            if t.staging.is_empty() {
                t.staging = Vec::new();
            }
        }
        self.session.release_idle_memory();
    }

    /// Bytes of memory held by the buffers [`Self::release_idle_memory`] would give back
    /// when empty (by capacity; not what the application's payloads keep alive).
    pub fn buffer_capacity(&self) -> usize {
        let receiver = match &self.receive {
            ReceivePath::InOrder(Some(r)) => r.buffer_capacity(),
            _ => 0,
        };
        let tls = match &self.record {
            RecordLayer::Tls(t) => t.tls.buffer_capacity() + t.staging.capacity(),
            RecordLayer::Cleartext => 0,
        };
        receiver + tls
    }

    /// Whether the idle timer gave memory back since the last call: a driver then gives
    /// back its own idle buffers too.
    pub fn take_idle_released(&mut self) -> bool {
        std::mem::take(&mut self.idle_released)
    }

    /// When a stop of the in-order TLS stream on unauthenticated bytes fails the connection.
    fn hold_deadline(&self) -> Option<Instant> {
        match &self.record {
            RecordLayer::Tls(t) if !t.failed => t.held_since.map(|since| since + record::MAX_HOLD),
            _ => None,
        }
    }

    /// Runs the timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.note_running(now);
        if self.handshake_deadline().is_some_and(|t| t <= now)
            && let RecordLayer::Tls(t) = &mut self.record
        {
            // No alert fits (RFC 8446 §6 has none for it): the FIN follows at once.
            tracing::debug!("TLS handshake timed out");
            t.failed = true;
            t.alert_out = true;
            self.session
                .handle_transport_failed(now, TransportError::Tls(TlsFailure::HandshakeTimedOut));
        }
        if self.hold_deadline().is_some_and(|t| t <= now)
            && let RecordLayer::Tls(t) = &mut self.record
            && t.tls.ends_held()
        {
            // Held too long: no announcement covers the stop (docs/wire.md §5.1).
            self.tls_failed(now, &TlsError::Decrypt);
        }
        if self.session.poll_timeout().is_some_and(|t| t <= now) {
            self.session.handle_timeout(now);
        }
        if self.idle_deadline().is_some_and(|t| t <= now) {
            self.release_idle_memory();
            self.active_at = None;
            self.idle_released = true;
        }
    }

    /// Whether the connection is finished: closed, its last frame handed out, and the peer
    /// done or the drain timer expired. The driver then flushes what it holds, closes the
    /// transport and stops.
    pub fn is_drained(&self) -> bool {
        self.session.is_drained()
    }
}

/// PARAMS `record_numbers` of a TLS connection on `substrate` (docs/wire.md §5): it reads
/// numbered records, and out of order where it reads segments.
fn record_number_bits(substrate: Substrate) -> u64 {
    if substrate.receives_in_order() {
        record_numbers::READS
    } else {
        record_numbers::READS | record_numbers::OUT_OF_ORDER
    }
}
