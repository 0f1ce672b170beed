//! Squarepeg over the userspace TCP (uTCP, Minion §4; Hollywood Ch. 4): the sans-IO glue of
//! one connection, `Session` ↔ [`Reassembler`] ↔ a [`squarepeg_tcp`] connection.
//!
//! [`UtcpConnection`] does no I/O and reads no clock. It works on a connection of a
//! [`squarepeg_tcp::Endpoint`] that the caller owns (a simulator host, or a driver over
//! `squarepeg-io`'s TUN stack, may hold many connections on one endpoint): after anything
//! happened to the endpoint (a packet, a timer, an application call), call
//! [`UtcpConnection::drive`]; poll [`UtcpConnection::poll_event`] for the application's
//! events; and wake at the earlier of the endpoint's timer and
//! [`UtcpConnection::poll_timeout`].
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
    reassembler: Reassembler,
    read_buf: Vec<u8>,
    frame_buf: Vec<u8>,
    /// A frame taken from the session that the TCP send buffer had no room for yet.
    pending: Option<WriteTag>,
    /// Messages in the TCP queue whose final status is not known yet.
    in_tcp: HashMap<MessageNumber, InTcp>,
    events: VecDeque<Event>,
    /// The peer's CLOSE, held until the stream before it is complete.
    held_close: Option<ReassembledFrame>,
    fin_sent: bool,
    transport_closed: bool,
    stats: UtcpStats,
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
        let limit = recv_buffer + Reassembler::min_limit(MAX_FRAME_BODY);
        let reassembler = Reassembler::new(MAX_FRAME_BODY, limit)?;
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
            reassembler,
            read_buf: vec![0; READ_CHUNK],
            frame_buf: Vec::new(),
            pending: None,
            in_tcp: HashMap::new(),
            events: VecDeque::new(),
            held_close: None,
            fin_sent: false,
            transport_closed: false,
            stats: UtcpStats::default(),
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
        self.stats
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
        loop {
            if let Some(e) = self.events.pop_front() {
                return Some(e);
            }
            let e = self.session.poll_event()?;
            if let Event::MessageStatus {
                number,
                status: MessageStatus::Sent,
            } = e
                && self.in_tcp.contains_key(&number)
            {
                // The TCP queue decides (see `take_reports`).
                continue;
            }
            if matches!(e, Event::ConnectionLost(_)) {
                self.settle_all();
            }
            return Some(e);
        }
    }

    /// Moves data both ways: segments from TCP into the reassembler and the session, the TCP
    /// queue's message reports into statuses, frames from the session into the TCP queue,
    /// and the end of either direction.
    pub fn drive(&mut self, now: Instant, ep: &mut Endpoint) {
        self.take_reports(ep);
        self.receive(now, ep);
        self.send(now, ep);
        self.take_reports(ep);
        if ep.connection(self.handle).is_none() && !self.transport_closed {
            self.transport_closed = true;
            self.session
                .handle_transport_closed(now, "TCP connection closed");
        }
    }

    fn receive(&mut self, now: Instant, ep: &mut Endpoint) {
        while !self.transport_closed && !self.session.receive_blocked() {
            match ep.read_segment(self.handle, &mut self.read_buf) {
                Ok(seg) if seg.len == 0 => {
                    self.transport_closed = true;
                    self.session
                        .handle_transport_closed(now, "peer closed the TCP connection");
                }
                Ok(seg) => {
                    self.stats.segments_read += 1;
                    self.stats.bytes_read += seg.len as u64;
                    let data = &self.read_buf[..seg.len];
                    if let Err(e) = self.reassembler.insert(seg.offset, data) {
                        tracing::debug!("segment refused: {e}");
                        self.stats.segments_refused += 1;
                    }
                    while let Some(frame) = self.reassembler.next_frame() {
                        match frame {
                            Ok(f) if is_close(&f.frame) => self.held_close = Some(f),
                            Ok(f) => self.session.handle_frame(now, f.frame),
                            Err(rejected) => {
                                // A mix of two transmissions, or a middlebox's doing: over an
                                // unordered substrate not the peer's fault (Hollywood §4.5).
                                tracing::debug!("{rejected}");
                                self.stats.frames_rejected += 1;
                            }
                        }
                    }
                }
                Err(squarepeg_tcp::Error::WouldBlock) => break,
                Err(e) => {
                    self.transport_closed = true;
                    self.session.handle_transport_closed(now, &e.to_string());
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
                self.session.handle_frame(now, f.frame);
            }
        }
    }

    fn send(&mut self, now: Instant, ep: &mut Endpoint) {
        if self.fin_sent || self.transport_closed {
            return;
        }
        loop {
            if let Some(tag) = self.pending {
                match ep.write_message(self.handle, &self.frame_buf, tag) {
                    Ok(()) => {
                        self.stats.frames_written += 1;
                        self.pending = None;
                        self.frame_buf.clear();
                    }
                    Err(squarepeg_tcp::Error::WouldBlock) => return,
                    Err(e) => {
                        self.pending = None;
                        self.frame_buf.clear();
                        self.transport_closed = true;
                        self.session.handle_transport_closed(now, &e.to_string());
                        return;
                    }
                }
            }
            self.frame_buf.clear();
            let Some(t) = self.session.poll_transmit(now, &mut self.frame_buf) else {
                break;
            };
            let priority = match t.priority {
                Some(p) => 8 - i32::from(p.urgency()),
                // The CLOSE must not overtake data queued before it.
                None if self.session.is_closing() => i32::MIN,
                None => CONTROL_PRIORITY,
            };
            let (tag, number) = match t.content {
                TransmitContent::Message {
                    number,
                    deadline,
                    depends_on,
                    squash_key,
                    ..
                } => (
                    WriteTag {
                        priority,
                        squash_key,
                        deadline,
                        depends_on,
                        message_id: Some(number),
                    },
                    Some(number),
                ),
                _ => (
                    WriteTag {
                        priority,
                        ..Default::default()
                    },
                    None,
                ),
            };
            if let Some(n) = number {
                // From here the TCP queue decides its status (set before the session's `Sent`
                // can be polled).
                self.in_tcp.insert(
                    n,
                    InTcp::Queued {
                        deadline: tag.deadline.is_some(),
                    },
                );
            }
            self.pending = Some(tag);
        }
        if self.session.is_send_finished() && self.pending.is_none() {
            self.fin_sent = true;
            let _ = ep.shutdown(now, self.handle);
        }
    }

    fn status(&mut self, number: MessageNumber, status: MessageStatus) {
        self.events
            .push_back(Event::MessageStatus { number, status });
    }

    fn take_reports(&mut self, ep: &mut Endpoint) {
        while let Ok(Some(report)) = ep.poll_report(self.handle) {
            let id = report.id();
            let Some(&state) = self.in_tcp.get(&id) else {
                continue;
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
