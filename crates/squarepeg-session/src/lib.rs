//! Sans-IO session core of squarepeg: messages with priority, lifetime,
//! dependency and squash; ordered reliable streams with flow control; and
//! the late-binding send scheduler that chooses, frame by frame, what the
//! transport carries next.
//!
//! A [`Session`] is one connection. It does no I/O and reads no clock: the
//! driver feeds it decoded frames ([`Session::handle_frame`]) and the time,
//! asks it for the next frame to send ([`Session::poll_transmit`]) and for
//! its next timer ([`Session::poll_timeout`]). The same core runs over kernel
//! TCP (frames in order) and, later, over squarepeg's own TCP, where frames
//! arrive out of order and duplicated and where the send metadata returned
//! with each frame ([`Transmit`]) feeds the TCP's tagged send queue
//! (Minion §4.2, Hollywood §4.2).
//!
//! # Priorities
//!
//! Eight strict urgency classes, modelled on RFC 9218 §4.1: urgency 0 is
//! the most urgent, 7 the least, 3 the default. A frame of a more urgent
//! class is always chosen before any frame of a less urgent one; control
//! frames go before all classes. Within a class, sub-streams (for messages)
//! and streams take turns by deficit round robin, fair by bytes.
//!
//! # Messages
//!
//! [`Session::send_message`] returns the message number (per connection,
//! from 0). A message carries a sub-stream id, a priority, an optional
//! lifetime (deadline = queue time + lifetime), an optional dependency (the
//! number of an earlier message) and an optional squash key. Only the
//! sub-stream id and the number travel on the wire (Hollywood §4.2, §7.2).
//! Each message ends in exactly one [`MessageStatus`]: `Sent` (handed to the
//! transport), `Expired`, `Squashed` or `Discarded` (connection closed), reported in
//! [`Event::MessageStatus`] runs of consecutive numbers (a batch sent together is one
//! event). Each queued or received message counts its payload plus
//! [`MESSAGE_RECORD_BYTES`] against the queue limits of [`Config`].
//!
//! - Expiry: a queued message whose deadline passed is dropped, unless a
//!   queued message that is still needed depends on it, or a message that
//!   depends on it was already sent. A message whose dependency was dropped
//!   is dropped too (Hollywood §7.2).
//! - Squash: a new message with the same squash key as a queued one
//!   replaces it, under the same dependency rule (Minion §4.2).

//!
//! # Driver contract
//!
//! A driver (the tokio one in `squarepeg`, a simulator, later the
//! userspace-TCP one):
//!
//! - passes every decoded frame to [`Session::handle_frame`] and, on an
//!   in-order substrate, every framing error to
//!   [`Session::handle_decode_error`] (a protocol violation there);
//! - asks [`Session::poll_transmit`] for frames only when the transport can
//!   take more, so the scheduler decides as late as possible;
//! - calls [`Session::handle_timeout`] at [`Session::poll_timeout`];
//! - stops reading while [`Session::receive_blocked`];
//! - drains [`Session::poll_event`] after each round (events caused by the
//!   peer are bounded per frame it sends);
//! - reports the transport's end with [`Session::handle_transport_closed`],
//!   ends its sending direction once [`Session::is_send_finished`] and its
//!   buffer is written, and stops at [`Session::is_drained`].

mod config;
pub mod control;
mod error;
mod hash;
mod scheduler;
mod session;
mod stream;
mod table;
mod window;

pub use config::{
    Config, ConfigError, DEFAULT_INITIAL_MAX_DATA, DEFAULT_INITIAL_MAX_STREAM_DATA,
    DEFAULT_INITIAL_MAX_STREAMS, MAX_FRAME_BODY, MAX_MESSAGE_SIZE,
};
pub use error::{
    ConnectionError, ProtocolError, SendError, StreamError, TlsFailure, TransportError,
    transport_code,
};
pub use session::{
    Event, FittedBatch, MAX_RECORDS_REPLACED, MESSAGE_RECORD_BYTES, Message, MessageProps,
    MessageStatus, Received, Role, Session, Stats, Transmit, TransmitContent, message_queue_cost,
};
/// The received-message run type [`Received::Run`] holds.
pub use squarepeg_framing::MessageRun;
pub use stream::ReadOutcome;

/// Which of a session's connections carries a message's or a stream's frames, when the
/// session spans several (a `squarepeg_connection::MultipathConnection`, TCPLS's steering);
/// a session over one connection ignores it. A frame whose connection died is re-sent on
/// another whatever its policy: steering never loses data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PathPolicy {
    /// Whichever connection has room first: bulk spreads over all of them (aggregation).
    #[default]
    Aggregate,
    /// The connection with the lowest smoothed RTT.
    LowestRtt,
    /// The connections in turn, frame by frame.
    RoundRobin,
    /// This connection (a `PathId`'s number); the lowest-RTT one while it is gone.
    Pinned(u64),
    /// Sent on the two lowest-RTT connections: the first copy to arrive wins and the receiver
    /// drops the other (message numbers and stream offsets).
    Redundant,
}

/// A message number: assigned by the sender per connection, from 0.
pub type MessageNumber = u64;

/// A stream id: client-initiated streams are even, server-initiated odd.
pub type StreamId = u64;

/// An urgency class, 0 (most urgent) to 7 (least), default 3; the scale of
/// RFC 9218 §4.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(u8);

impl Priority {
    /// Number of classes.
    pub const LEVELS: usize = 8;
    /// Urgency 0.
    pub const HIGHEST: Self = Self(0);
    /// Urgency 3.
    pub const DEFAULT: Self = Self(3);
    /// Urgency 7.
    pub const LOWEST: Self = Self(7);

    /// The class of `urgency`, or `None` above 7.
    pub const fn new(urgency: u8) -> Option<Self> {
        if urgency < Self::LEVELS as u8 {
            Some(Self(urgency))
        } else {
            None
        }
    }

    /// The urgency, 0..=7.
    pub const fn urgency(self) -> u8 {
        self.0
    }

    fn index(self) -> usize {
        self.0 as usize
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::DEFAULT
    }
}
