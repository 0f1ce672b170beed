//! Squarepeg over the userspace TCP (uTCP, Minion §4; Hollywood Ch. 4): the sans-IO glue of
//! one connection, `Session` ↔ [`Reassembler`] ↔ a [`squarepeg_tcp`] connection.
//!
//! [`UtcpConnection`] does no I/O and reads no clock. It works on a connection of a
//! [`squarepeg_tcp::Endpoint`] that the caller owns (a simulator host may hold many
//! connections on one endpoint): after anything
//! happened to the endpoint (a packet, a timer, an application call), call
//! [`UtcpConnection::drive`]; poll [`UtcpConnection::poll_event`] for the application's
//! events; and wake at the earlier of the endpoint's timer and
//! [`UtcpConnection::poll_timeout`].
//!
//! The tokio API ([`crate::Connection::connect_utcp`], [`crate::Endpoint::listen_utcp`]) runs
//! the same glue over `squarepeg-io`'s `TcpStream` in record mode instead (see the crate docs,
//! "Over the userspace TCP", for why).
//!
//! # What is delivered when (receive)
//!
//! The TCP connection runs with unordered receive (Minion §4.1): every segment is handed over
//! on arrival with its stream offset, out-of-order ones and retransmissions included. The
//! reassembler finds every uCOBS frame the moment its bytes are complete (Minion §5.3) and
//! the session takes it at once: a message is delivered as soon as its frame is complete,
//! whatever arrived before or is missing; a message that arrives twice (a retransmission, an
//! inconsistent retransmission elsewhere in the stream) is delivered once (the session's
//! message-number dedup); stream chunks are put in order per stream only, so a loss blocks
//! only the stream it hit. Frames that fail their checksum (a middlebox mixing two
//! transmissions of one range, Hollywood §4.5) are dropped and counted, never delivered;
//! over this substrate they are not a protocol violation. The reassembler's memory limit is
//! the TCP receive buffer plus one maximal frame, so no segment TCP accepts is refused.
//!
//! # Late binding in the TCP's tagged queue (send)
//!
//! Frames are pulled from the session as long as the TCP send buffer has room and written
//! each as one tagged message ([`squarepeg_tcp::Endpoint::write_message`]): priority,
//! squash key, deadline, dependency and message number go with it. From there the TCP queue
//! binds late (Minion §4.2): a more urgent frame is inserted ahead of less urgent frames not
//! yet transmitted at all, a newer message squashes an untransmitted one with the same key,
//! a message whose deadline passes before its first transmission is dropped unless a live
//! message depends on it, and a retransmission of expired messages carries live ones instead,
//! padded with a padding frame ([`squarepeg_framing::encode_padding`]) to the same length
//! (inconsistent retransmission, Hollywood §4.2). Each frame starts a segment (consistent
//! segmentation).
//!
//! Priorities: session urgency `u` (0 most urgent) becomes TCP priority `8 - u`; control
//! frames (flow credit, stream resets) get 9 and so overtake data, except the final CLOSE,
//! which goes at the tail (priority `i32::MIN`) so that it never overtakes data queued before
//! it.
//!
//! # Message statuses
//!
//! The session reports `Sent` when it hands a message over; on this substrate that is not
//! yet the end, so [`UtcpConnection::poll_event`] holds the session's status of a message
//! written to TCP and reports the TCP queue's verdict instead:
//! - dropped before its first transmission: `Expired` (deadline) or `Squashed`;
//! - transmitted, without a deadline: `Sent`;
//! - transmitted, with a deadline: `Sent` once acknowledged, `Expired` if a retransmission
//!   of its range carried other messages instead (it was *replaced*: it arrives only if its
//!   first transmission did); messages sent *as* replacements are counted in
//!   [`UtcpStats::sent_as_replacement`];
//! - still undecided when the connection ends: `Sent` if transmitted, otherwise `Discarded`.
//!
//! # Interoperation
//!
//! The wire is TCP carrying uCOBS frames, the same as the kernel substrate's: either end may
//! be a squarepeg connection over kernel TCP, or any TCP speaking uCOBS (Minion §3.3,
//! Hollywood §4.4). A kernel-TCP peer receives in order (padding frames are skipped); a
//! kernel-TCP sender never retransmits inconsistently, and this side still delivers its
//! messages out of order.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use squarepeg_framing::{
    Frame, FrameHeader, ReassembledFrame, Reassembler, ReassemblyError, encode_padding,
};
use squarepeg_session::control::ControlFrame;
use squarepeg_session::{
    Config, ConfigError, Event, MAX_FRAME_BODY, MessageNumber, MessageStatus, Role, Session,
    TransmitContent,
};
use squarepeg_tcp::utcp::record;
use squarepeg_tcp::{ConnectionHandle, Endpoint, MessageReport, Padder, WriteTag};

/// Bytes read from the TCP connection per `read_segment` call.
const READ_CHUNK: usize = 64 * 1024;

/// TCP priority of control frames (above every urgency class).
const CONTROL_PRIORITY: i32 = 9;

/// Counters of the glue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UtcpStats {
    /// Segments (or pieces of them) read from TCP.
    pub segments_read: u64,
    /// Bytes read from TCP (duplicates included).
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

/// Errors of the glue.
#[derive(Debug, thiserror::Error)]
pub enum UtcpError {
    #[error("invalid session configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("reassembler: {0}")]
    Reassembly(#[from] ReassemblyError),
}

/// What the TCP queue has said about a message written to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InTcp {
    /// Not yet transmitted.
    Queued { deadline: bool },
    /// Transmitted; a verdict (acknowledged or replaced) is still to come.
    Transmitted,
}

/// One squarepeg connection over one userspace-TCP connection (module docs).
#[derive(Debug)]
pub struct UtcpConnection {
    handle: ConnectionHandle,
    session: Session,
    glue: Glue,
    read_buf: Vec<u8>,
    /// A frame taken from the session (in `glue.frame_buf`) that the TCP send buffer had no
    /// room for yet.
    pending: Option<WriteTag>,
}

impl UtcpConnection {
    /// The TCP settings this substrate needs on top of `base`: unordered receive,
    /// consistent segmentation, and the uCOBS padder for inconsistent retransmissions.
    pub fn tcp_config(base: squarepeg_tcp::ConnectionConfig) -> squarepeg_tcp::ConnectionConfig {
        squarepeg_tcp::ConnectionConfig {
            unordered_receive: true,
            consistent_segmentation: true,
            padder: Some(Padder(encode_padding)),
            ..base
        }
    }

    /// The glue of connection `handle` (opened, or accepted, with a config from
    /// [`Self::tcp_config`] — or unordered receive is switched on here). `recv_buffer` is the
    /// TCP receive buffer, which sizes the reassembler.
    pub fn new(
        role: Role,
        config: Config,
        ep: &mut Endpoint,
        handle: ConnectionHandle,
        recv_buffer: usize,
    ) -> Result<Self, UtcpError> {
        let session = Session::new(role, config)?;
        let glue = Glue::new(recv_buffer)?;
        if ep
            .connection(handle)
            .is_some_and(|c| !c.unordered_receive())
        {
            // Fails only for a connection already gone; the first drive reports that.
            let _ = ep.enable_unordered_receive(handle);
        }
        Ok(UtcpConnection {
            handle,
            session,
            glue,
            read_buf: vec![0; READ_CHUNK],
            pending: None,
        })
    }

    pub fn handle(&self) -> ConnectionHandle {
        self.handle
    }

    /// The session: send and receive messages, open and use streams, close.
    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    pub fn stats(&self) -> UtcpStats {
        self.glue.stats
    }

    /// Whether the session is done and the TCP connection has ended or been shut down.
    pub fn is_drained(&self) -> bool {
        self.session.is_drained()
    }

    /// The session's next timer (the endpoint has its own).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.session.poll_timeout()
    }

    /// The session's timer fired.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.session.poll_timeout().is_some_and(|t| t <= now) {
            self.session.handle_timeout(now);
        }
    }

    /// The next event for the application, message statuses corrected as the module docs say.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.glue.poll_event(&mut self.session)
    }

    /// Moves data both ways: segments from TCP into the reassembler and the session, the TCP
    /// queue's message reports into statuses, frames from the session into the TCP queue,
    /// and the end of either direction.
    pub fn drive(&mut self, now: Instant, ep: &mut Endpoint) {
        self.take_reports(ep);
        self.receive(now, ep);
        self.send(now, ep);
        self.take_reports(ep);
        if ep.connection(self.handle).is_none() && !self.glue.transport_closed {
            self.glue
                .transport_closed(now, &mut self.session, "TCP connection closed");
        }
    }

    fn receive(&mut self, now: Instant, ep: &mut Endpoint) {
        while !self.glue.transport_closed && !self.session.receive_blocked() {
            match ep.read_segment(self.handle, &mut self.read_buf) {
                Ok(seg) if seg.len == 0 => {
                    self.glue.transport_closed(
                        now,
                        &mut self.session,
                        "peer closed the TCP connection",
                    );
                }
                Ok(seg) => {
                    let data = &self.read_buf[..seg.len];
                    self.glue
                        .handle_segment(now, &mut self.session, seg.offset, data);
                }
                Err(squarepeg_tcp::Error::WouldBlock) => break,
                Err(e) => {
                    self.glue
                        .transport_closed(now, &mut self.session, &e.to_string());
                }
            }
        }
    }

    fn send(&mut self, now: Instant, ep: &mut Endpoint) {
        if self.glue.fin_sent || self.glue.transport_closed {
            return;
        }
        loop {
            if let Some(tag) = self.pending {
                match ep.write_message(self.handle, &self.glue.frame_buf, tag) {
                    Ok(()) => {
                        self.glue.stats.frames_written += 1;
                        self.pending = None;
                    }
                    Err(squarepeg_tcp::Error::WouldBlock) => return,
                    Err(e) => {
                        self.pending = None;
                        self.glue
                            .transport_closed(now, &mut self.session, &e.to_string());
                        return;
                    }
                }
            }
            let Some(tag) = self.glue.next_frame(now, &mut self.session) else {
                break;
            };
            self.pending = Some(tag);
        }
        if self.glue.wants_fin(&self.session) {
            self.glue.fin_sent = true;
            let _ = ep.shutdown(now, self.handle);
        }
    }

    fn take_reports(&mut self, ep: &mut Endpoint) {
        while let Ok(Some(report)) = ep.poll_report(self.handle) {
            self.glue.handle_report(report);
        }
    }
}

/// The glue without its transport: what [`UtcpConnection`] (on an endpoint it is given) and
/// the tokio driver (through `squarepeg-io`'s `TcpStream` in record mode) share. Every method
/// takes the session, so that the tokio driver can keep the session where the application's
/// handles reach it.
#[derive(Debug)]
pub(crate) struct Glue {
    reassembler: Reassembler,
    /// The frame taken last from the session.
    frame_buf: Vec<u8>,
    /// Messages in the TCP queue whose final status is not known yet.
    in_tcp: HashMap<MessageNumber, InTcp>,
    events: VecDeque<Event>,
    /// The peer's CLOSE, held until the stream before it is complete.
    held_close: Option<ReassembledFrame>,
    pub(crate) fin_sent: bool,
    pub(crate) transport_closed: bool,
    pub(crate) stats: UtcpStats,
}

impl Glue {
    /// `recv_buffer` is the TCP receive buffer, which sizes the reassembler.
    pub(crate) fn new(recv_buffer: usize) -> Result<Self, UtcpError> {
        let limit = recv_buffer + Reassembler::min_limit(MAX_FRAME_BODY);
        Ok(Glue {
            reassembler: Reassembler::new(MAX_FRAME_BODY, limit)?,
            frame_buf: Vec::new(),
            in_tcp: HashMap::new(),
            events: VecDeque::new(),
            held_close: None,
            fin_sent: false,
            transport_closed: false,
            stats: UtcpStats::default(),
        })
    }

    /// The next event of `session`, message statuses corrected as the module docs say.
    pub(crate) fn poll_event(&mut self, session: &mut Session) -> Option<Event> {
        loop {
            if let Some(e) = self.events.pop_front() {
                return Some(e);
            }
            let e = session.poll_event()?;
            if let Event::MessageStatus {
                number,
                status: MessageStatus::Sent,
            } = e
                && self.in_tcp.contains_key(&number)
            {
                // The TCP queue decides (see `handle_report`).
                continue;
            }
            if matches!(e, Event::ConnectionLost(_)) {
                self.settle_all();
            }
            return Some(e);
        }
    }

    /// The TCP connection ended (or failed): tell the session, once.
    pub(crate) fn transport_closed(&mut self, now: Instant, session: &mut Session, why: &str) {
        if !self.transport_closed {
            self.transport_closed = true;
            session.handle_transport_closed(now, why);
        }
    }

    /// A received segment (or piece of one) at stream offset `offset`.
    pub(crate) fn handle_segment(
        &mut self,
        now: Instant,
        session: &mut Session,
        offset: u64,
        data: &[u8],
    ) {
        self.stats.segments_read += 1;
        self.stats.bytes_read += data.len() as u64;
        if let Err(e) = self.reassembler.insert(offset, data) {
            tracing::debug!("segment refused: {e}");
            self.stats.segments_refused += 1;
        }
        while let Some(frame) = self.reassembler.next_frame() {
            match frame {
                Ok(f) if is_close(&f.frame) => self.held_close = Some(f),
                Ok(f) => session.handle_frame(now, f.frame),
                Err(rejected) => {
                    // A mix of two transmissions, or a middlebox's doing: over an
                    // unordered substrate not the peer's fault (Hollywood §4.5).
                    tracing::debug!("{rejected}");
                    self.stats.frames_rejected += 1;
                }
            }
        }
        // The peer's CLOSE ends the session, so it is taken only once everything sent
        // before it has arrived: it must not overtake frames still being retransmitted.
        if self
            .held_close
            .as_ref()
            .is_some_and(|f| self.reassembler.in_order_offset() > f.offset)
            && let Some(f) = self.held_close.take()
        {
            session.handle_frame(now, f.frame);
        }
    }

    /// Takes the next frame from the session into `frame_buf`; returns its TCP tag.
    fn next_frame(&mut self, now: Instant, session: &mut Session) -> Option<WriteTag> {
        self.frame_buf.clear();
        let t = session.poll_transmit(now, &mut self.frame_buf)?;
        let priority = match t.priority {
            Some(p) => 8 - i32::from(p.urgency()),
            // The CLOSE must not overtake data queued before it. (Handing out the CLOSE
            // moves the session from closing to closed, so both states count.)
            None if session.is_closing() || session.is_send_finished() => i32::MIN,
            None => CONTROL_PRIORITY,
        };
        let tag = match t.content {
            TransmitContent::Message {
                number,
                deadline,
                depends_on,
                squash_key,
                ..
            } => {
                // From here the TCP queue decides its status (set before the session's
                // `Sent` can be polled).
                self.in_tcp.insert(
                    number,
                    InTcp::Queued {
                        deadline: deadline.is_some(),
                    },
                );
                WriteTag {
                    priority,
                    squash_key,
                    deadline,
                    depends_on,
                    message_id: Some(number),
                }
            }
            _ => WriteTag {
                priority,
                ..Default::default()
            },
        };
        Some(tag)
    }

    /// Whether the session has sent its last frame and the TCP FIN is due.
    pub(crate) fn wants_fin(&self, session: &Session) -> bool {
        !self.fin_sent && !self.transport_closed && session.is_send_finished()
    }

    /// Appends `record::MESSAGE` records of frames from the session to `out` until it holds
    /// `max` bytes or the session has nothing to send (record mode: the write side of
    /// `squarepeg-io`'s `TcpStream` with `message_writes`). A deadline becomes a lifetime
    /// counted from `now`: encode just before writing.
    pub(crate) fn poll_records(
        &mut self,
        now: Instant,
        session: &mut Session,
        out: &mut Vec<u8>,
        max: usize,
    ) {
        if self.fin_sent || self.transport_closed {
            return;
        }
        while out.len() < max {
            let Some(tag) = self.next_frame(now, session) else {
                break;
            };
            let meta = record::MessageMeta {
                priority: tag.priority,
                squash_key: tag.squash_key,
                lifetime: tag.deadline.map(|d| d.saturating_duration_since(now)),
                depends_on: tag.depends_on,
                message_id: tag.message_id,
            };
            record::encode_message(&meta, &self.frame_buf, out);
            self.stats.frames_written += 1;
        }
    }

    /// What one `read` of a `TcpStream` in record mode (unordered receive) returned.
    pub(crate) fn handle_records(
        &mut self,
        now: Instant,
        session: &mut Session,
        buf: &[u8],
    ) -> Result<(), record::RecordError> {
        for r in record::decode_read(buf) {
            match r? {
                record::ReadRecord::Segment { offset, data } => {
                    self.handle_segment(now, session, offset, data)
                }
                record::ReadRecord::Report(report) => self.handle_report(report),
            }
        }
        Ok(())
    }

    fn status(&mut self, number: MessageNumber, status: MessageStatus) {
        self.events
            .push_back(Event::MessageStatus { number, status });
    }

    /// A report of the TCP queue about a message written to it.
    pub(crate) fn handle_report(&mut self, report: MessageReport) {
        let id = report.id();
        let Some(&state) = self.in_tcp.get(&id) else {
            return;
        };
        match report {
            MessageReport::Sent { replacement, .. } => {
                if replacement {
                    self.stats.sent_as_replacement += 1;
                }
                if state == (InTcp::Queued { deadline: true }) {
                    self.in_tcp.insert(id, InTcp::Transmitted);
                } else {
                    self.in_tcp.remove(&id);
                    self.status(id, MessageStatus::Sent);
                }
            }
            MessageReport::Acked { .. } => {
                self.in_tcp.remove(&id);
                self.status(id, MessageStatus::Sent);
            }
            MessageReport::Expired { .. } => {
                self.stats.expired_in_tcp += 1;
                self.in_tcp.remove(&id);
                self.status(id, MessageStatus::Expired);
            }
            MessageReport::Squashed { .. } => {
                self.stats.squashed_in_tcp += 1;
                self.in_tcp.remove(&id);
                self.status(id, MessageStatus::Squashed);
            }
            MessageReport::Replaced { .. } => {
                self.stats.replaced += 1;
                self.in_tcp.remove(&id);
                self.status(id, MessageStatus::Expired);
            }
        }
    }

    /// The connection ended: messages still waiting for a verdict get their last status.
    fn settle_all(&mut self) {
        let mut left: Vec<(MessageNumber, InTcp)> = self.in_tcp.drain().collect();
        left.sort_unstable_by_key(|&(n, _)| n);
        for (n, state) in left {
            let status = match state {
                InTcp::Transmitted => MessageStatus::Sent,
                InTcp::Queued { .. } => MessageStatus::Discarded,
            };
            self.status(n, status);
        }
    }
}

/// Whether `frame` is a CLOSE or APPLICATION_CLOSE.
fn is_close(frame: &Frame) -> bool {
    frame.header == FrameHeader::Control
        && matches!(
            ControlFrame::decode(&frame.payload),
            Ok(ControlFrame::Close { .. } | ControlFrame::ApplicationClose { .. })
        )
}
