//! The send side over tagged writes (the userspace TCP's uTCP interface): frames from the
//! session become tagged writes, and the TCP queue's reports about them become the
//! messages' statuses.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use squarepeg_session::{
    ConnectionError, Event, MessageNumber, MessageStatus, Session, TransmitContent,
};
use squarepeg_tcp::{MessageReport, WriteTag};

use crate::UtcpStats;

/// TCP priority of control frames (above every urgency class).
const CONTROL_PRIORITY: i32 = 9;

/// What the TCP queue has said about a message written to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InTcp {
    /// Not yet transmitted: it may still be dropped, or placed in the range of messages
    /// already sent. `len`: its bytes as written (sealed, under TLS).
    Queued { deadline: bool, len: usize },
    /// Transmitted; a verdict (acknowledged or replaced) is still to come.
    Transmitted,
}

/// A frame for the TCP's tagged send queue, with its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedWrite<'a> {
    /// One whole frame.
    pub frame: &'a [u8],
    /// Priority, squash key, deadline, dependency and message number for the queue.
    pub tag: WriteTag,
}

#[derive(Debug, Default)]
pub(crate) struct TaggedSender {
    /// The frame taken last from the session, until the transport takes it.
    frame: Vec<u8>,
    pending: Option<WriteTag>,
    /// Messages in the TCP queue whose final status is not known yet.
    in_tcp: HashMap<MessageNumber, InTcp>,
    /// Statuses decided here, ahead of the session's events.
    events: VecDeque<Event>,
    /// Messages in `in_tcp` not yet transmitted: where they go in the stream, if anywhere,
    /// is still open.
    unplaced: usize,
    /// Messages were settled without a report of where they went.
    placement_lost: bool,
}

/// Where the TCP queue put the messages written to it, as far as its reports tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Each was sent or dropped: the stream offset of the next write is known.
    Known,
    /// Some were neither yet.
    Pending,
    /// Some were settled without a report: the offset will never be known.
    Lost,
}

impl TaggedSender {
    /// The next write: the one not yet taken, or a new frame from the session.
    pub(crate) fn poll_write(
        &mut self,
        now: Instant,
        session: &mut Session,
    ) -> Option<TaggedWrite<'_>> {
        self.poll_write_protected(now, session, &mut |_, _| true)
    }

    /// Like [`Self::poll_write`], with `protect` applied to each new frame and its tag before
    /// it is handed out (the record layer seals it into a TLS record there). If `protect`
    /// fails (returns false), nothing is handed out.
    pub(crate) fn poll_write_protected(
        &mut self,
        now: Instant,
        session: &mut Session,
        protect: &mut dyn FnMut(&mut Vec<u8>, &mut WriteTag) -> bool,
    ) -> Option<TaggedWrite<'_>> {
        if self.pending.is_none() {
            let mut tag = self.next_frame(now, session)?;
            if !protect(&mut self.frame, &mut tag) {
                return None;
            }
            if let Some(id) = tag.message_id
                && let Some(InTcp::Queued { len, .. }) = self.in_tcp.get_mut(&id)
            {
                *len = self.frame.len();
            }
            self.pending = Some(tag);
        }
        let tag = self.pending?;
        Some(TaggedWrite {
            frame: &self.frame,
            tag,
        })
    }

    /// The transport took the write [`Self::poll_write`] returned.
    pub(crate) fn write_done(&mut self, stats: &mut UtcpStats) {
        if self.pending.take().is_some() {
            stats.frames_written += 1;
        }
    }

    /// Takes the next frame from the session into `frame`; returns its TCP tag.
    ///
    /// Priorities: session urgency `u` (0 most urgent) becomes TCP priority `8 - u`;
    /// control frames (flow credit, stream resets) get 9 and so overtake data, except the
    /// final CLOSE, which goes at the tail (priority `i32::MIN`) so that it never overtakes
    /// data queued before it.
    fn next_frame(&mut self, now: Instant, session: &mut Session) -> Option<WriteTag> {
        self.frame.clear();
        let t = session.poll_transmit(now, &mut self.frame)?;
        let priority = match t.priority {
            Some(p) => 8 - i32::from(p.urgency()),
            // Handing out the CLOSE moves the session from closing to closed, so both
            // states count.
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
                let before = self.in_tcp.insert(
                    number,
                    InTcp::Queued {
                        deadline: deadline.is_some(),
                        len: self.frame.len(),
                    },
                );
                if !matches!(before, Some(InTcp::Queued { .. })) {
                    self.unplaced += 1;
                }
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

    /// The next event of `session`, message statuses corrected: a message written to the
    /// TCP gets the TCP queue's verdict instead of the session's `Sent`.
    pub(crate) fn poll_event(&mut self, session: &mut Session) -> Option<Event> {
        loop {
            if let Some(e) = self.events.pop_front() {
                return Some(e);
            }
            let e = session.poll_event()?;
            if let Event::MessageStatus {
                numbers,
                status: MessageStatus::Sent,
            } = &e
                && numbers.clone().any(|n| self.in_tcp.contains_key(&n))
            {
                // Those in the TCP's queue get its verdict later; the rest of the run goes
                // on now (`self.events` is empty here, so the order holds).
                for n in numbers.clone() {
                    if !self.in_tcp.contains_key(&n) {
                        self.status(n, MessageStatus::Sent);
                    }
                }
                continue;
            }
            // A graceful close of ours hands the CLOSE to the TCP behind everything queued
            // there, which still goes out: those messages are settled by their reports, or
            // when the connection ends (`settle_all` from the connection). Any other end
            // stops the queue now.
            if let Event::ConnectionLost(reason) = &e
                && *reason != ConnectionError::LocallyClosed
            {
                self.settle_all();
            }
            return Some(e);
        }
    }

    /// Whether a write was handed out and not yet taken.
    pub(crate) fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Whether messages in the TCP queue still wait for a verdict.
    pub(crate) fn has_unsettled(&self) -> bool {
        !self.in_tcp.is_empty()
    }

    /// Whether the stream offset of a write after everything written so far is known.
    pub(crate) fn placement(&self) -> Placement {
        if self.placement_lost {
            Placement::Lost
        } else if self.unplaced > 0 {
            Placement::Pending
        } else {
            Placement::Known
        }
    }

    fn status(&mut self, number: MessageNumber, status: MessageStatus) {
        Event::push_status(&mut self.events, number, status);
    }

    /// A report of the TCP queue about a message written to it. Returns the bytes written
    /// that will not extend the TCP stream: those of a message dropped unsent, or sent inside
    /// the range of expired ones (inconsistent retransmissions, Hollywood §4.2).
    pub(crate) fn handle_report(&mut self, report: MessageReport, stats: &mut UtcpStats) -> u64 {
        let id = report.id();
        let Some(&state) = self.in_tcp.get(&id) else {
            return 0;
        };
        let mut withdrawn = 0;
        if let InTcp::Queued { len, .. } = state {
            // Dropped, or sent in place of expired messages: no stream bytes of its own.
            if matches!(
                report,
                MessageReport::Sent {
                    replacement: true,
                    ..
                } | MessageReport::Expired { .. }
                    | MessageReport::Squashed { .. }
            ) {
                withdrawn = len as u64;
            }
            self.unplaced -= 1;
        }
        match report {
            MessageReport::Sent { replacement, .. } => {
                if replacement {
                    stats.sent_as_replacement += 1;
                }
                if matches!(state, InTcp::Queued { deadline: true, .. }) {
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
                stats.expired_in_tcp += 1;
                self.in_tcp.remove(&id);
                self.status(id, MessageStatus::Expired);
            }
            MessageReport::Squashed { .. } => {
                stats.squashed_in_tcp += 1;
                self.in_tcp.remove(&id);
                self.status(id, MessageStatus::Squashed);
            }
            MessageReport::Replaced { .. } => {
                stats.replaced += 1;
                self.in_tcp.remove(&id);
                self.status(id, MessageStatus::Replaced);
            }
        }
        withdrawn
    }

    /// The connection ended: messages still waiting for a verdict get their last status.
    pub(crate) fn settle_all(&mut self) {
        self.placement_lost |= self.unplaced > 0;
        self.unplaced = 0;
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
