//! Hand-offs between the application's calls and the driver that do not take the
//! connection's lock: messages the application sends wait in an [`Outbox`] until the driver
//! (or any call that locks the connection) moves them into the session, and messages
//! received wait in an [`Inbox`] the driver fills in batches.
//!
//! Why: the driver holds the connection's lock while it encodes a batch of frames or hands a
//! read's frames to the session (tens of microseconds with small messages), and an
//! application call that finds the lock taken sleeps on a futex and is woken by a system call
//! — measured with `message_profile peg 64`, half the context switches of a transfer and a
//! fifth of its CPU. With the two boxes, the application's per-message calls take only a
//! lock held for a few instructions. A multipath session does not use the outbox (see
//! [`Outbox::new`]); it does use the inbox.
//!
//! Invariants:
//! - Messages in the outbox are newer than every message in the session, and are numbered
//!   in order from the session's next number: only the outbox hands out numbers while it
//!   holds messages, and anything that queues into the session directly drains it first,
//!   holding its lock (see `Shared::queue_directly`).
//! - The outbox admits a message only if it fits the send queue's limit counting the
//!   session's queued bytes as last seen (never fewer than the session holds: the figure is
//!   set when messages move in and lowered only by the driver after it took some out), so
//!   the session never refuses one for room ([`Session::send_admitted_message`]).
//! - Messages in the inbox are older than every message in the session: it is filled only
//!   with the connection locked, from the session's front.
//!
//! [`Session::send_admitted_message`]: squarepeg_session::Session::send_admitted_message

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use squarepeg_session::{
    MAX_MESSAGE_SIZE, Message, MessageNumber, MessageProps, Received, message_queue_cost,
};

/// A message the application queued, not yet in the session.
pub(crate) struct Staged {
    pub(crate) number: MessageNumber,
    pub(crate) payload: Bytes,
    pub(crate) props: MessageProps,
    /// When it was queued (only read for a message with a lifetime).
    pub(crate) queued_at: Instant,
}

/// Messages sent by the application on their way into the session.
pub(crate) struct Outbox {
    pub(crate) messages: VecDeque<Staged>,
    /// What `messages` count against the send queue (`message_queue_cost`).
    bytes: usize,
    /// The number the next message gets.
    next_number: MessageNumber,
    /// The session's queued message bytes as last seen (at least what it holds).
    session_bytes: usize,
    /// `Config::message_send_queue`.
    limit: usize,
    /// The session takes messages (it is neither closing nor closed).
    open: bool,
    /// Messages may wait here at all (not for a multipath session, see [`Outbox::new`]).
    enabled: bool,
    /// Every message must wake the driver (writes leave as the TCP's tagged queue takes
    /// them: the driver does not come back for more on its own).
    wake_every: bool,
}

/// What [`Outbox::stage`] did.
pub(crate) enum Staging {
    /// Queued with this number; `wake`: the driver must be woken.
    Staged { number: MessageNumber, wake: bool },
    /// Not here: the message needs the session (a dependency or squash key, the queue looks
    /// full, the session is closing, the payload is too large); take the connection's lock.
    Locked(Bytes),
}

impl Outbox {
    /// `enabled`: false for a multipath session, whose every message goes to the session
    /// at once. Measured in `peg lab failover` (seed 1, 7 runs each): with the outbox, 3 runs
    /// had 9–28 of the call's messages late in the download's first second (none without);
    /// taking the connection's lock and dispatching at each send brought it back to none.
    /// Why is not understood yet: the outbox itself is drained within 3 ms of a send there
    /// (logged in 6 runs), so the messages are not waiting in it.
    pub(crate) fn new(
        next_number: MessageNumber,
        session_bytes: usize,
        limit: usize,
        wake_every: bool,
        enabled: bool,
    ) -> Self {
        Self {
            messages: VecDeque::new(),
            bytes: 0,
            next_number,
            session_bytes,
            limit,
            open: true,
            enabled,
            wake_every,
        }
    }

    /// Queues a message here if it needs nothing of the session's state to be numbered.
    pub(crate) fn stage(
        &mut self,
        payload: Bytes,
        props: &MessageProps,
        queued_at: Instant,
    ) -> Staging {
        let queued = self.session_bytes + self.bytes;
        // The session's own rule (`Session::message_queue_has_room`): a message always fits
        // an empty queue.
        let cost = message_queue_cost(payload.len());
        let room = queued == 0 || queued + cost <= self.limit;
        if !self.enabled
            || !self.open
            || !room
            || payload.len() > MAX_MESSAGE_SIZE
            || props.depends_on.is_some()
            || props.squash_key.is_some()
        {
            return Staging::Locked(payload);
        }
        let number = self.next_number;
        self.next_number += 1;
        // The first message since the driver last took them: it may be waiting. Later ones
        // find it woken already (it drains the outbox whenever it takes output). A lifetime
        // may bring the earliest deadline, which the driver's timer must learn.
        let wake = self.messages.is_empty() || self.wake_every || props.lifetime.is_some();
        self.bytes += cost;
        self.messages.push_back(Staged {
            number,
            payload,
            props: props.clone(),
            queued_at,
        });
        Staging::Staged { number, wake }
    }

    /// Moves the staged messages into `into` (empty); `session_bytes`: what the session
    /// holds now, to which they are about to be added.
    pub(crate) fn take_all(&mut self, into: &mut VecDeque<Staged>, session_bytes: usize) {
        debug_assert!(into.is_empty());
        std::mem::swap(&mut self.messages, into);
        self.session_bytes = session_bytes + self.bytes;
        self.bytes = 0;
    }

    /// The session queued a message itself (numbered `number`, the outbox being empty) or
    /// sent some: its next number and queued bytes now.
    pub(crate) fn resync(&mut self, next_number: MessageNumber, session_bytes: usize) {
        if self.messages.is_empty() {
            self.next_number = next_number;
        }
        self.session_bytes = session_bytes;
    }

    pub(crate) fn set_open(&mut self, open: bool) {
        self.open = open;
    }

    /// Gives back the queue's memory if it is empty (an idle connection).
    pub(crate) fn release_idle(&mut self) {
        if self.messages.is_empty() {
            self.messages = VecDeque::new();
        }
    }
}

/// Received messages taken out of the session, oldest first, for the application's receive
/// calls: single ones and runs as they were read (`Session::poll_received`), each message of
/// a run cut out only when the application takes it (one record moved per read rather than
/// per message).
#[derive(Default)]
pub(crate) struct Inbox {
    entries: VecDeque<Received>,
    /// Messages and payload bytes in `entries`.
    messages: usize,
    bytes: usize,
}

/// Messages and bytes after which the inbox takes no more: the receive queue's bound grows
/// by this much (and one run's messages, at most 16 KiB, taken whole). Large enough that the
/// application locks the connection rarely, small enough to stay in the caches.
const INBOX_MESSAGES: usize = 1024;
const INBOX_BYTES: usize = 64 * 1024;

impl Inbox {
    pub(crate) fn pop(&mut self) -> Option<Message> {
        let m = Received::pop_message(&mut self.entries)?;
        self.messages -= 1;
        self.bytes -= m.payload.len();
        Some(m)
    }

    /// Gives back the queue's memory if it is empty (an idle connection).
    pub(crate) fn release_idle(&mut self) {
        if self.entries.is_empty() {
            self.entries = VecDeque::new();
        }
    }

    /// Whether more messages may be moved in.
    pub(crate) fn has_room(&self) -> bool {
        self.messages < INBOX_MESSAGES && self.bytes < INBOX_BYTES
    }

    pub(crate) fn push(&mut self, r: Received) {
        if r.is_empty() {
            return;
        }
        self.messages += r.len();
        self.bytes += r.payload_len();
        self.entries.push_back(r);
    }
}
