//! Session configuration and protocol constants.

use std::time::Duration;

use squarepeg_framing::DEFAULT_MAX_BODY;

/// The largest frame body every endpoint accepts (docs/wire.md §2.1).
pub const MAX_FRAME_BODY: usize = DEFAULT_MAX_BODY;

/// The largest message payload: a frame body less the longest message
/// header (2 bytes and two 8-byte varints) and the 4-byte CRC.
pub const MAX_MESSAGE_SIZE: usize = MAX_FRAME_BODY - 22;

/// Limits a sender assumes before the peer's PARAMS frame arrives
/// (docs/wire.md §2.2). A receiver's configured windows are at least these.
pub const DEFAULT_INITIAL_MAX_DATA: u64 = 64 * 1024;
/// See [`DEFAULT_INITIAL_MAX_DATA`].
pub const DEFAULT_INITIAL_MAX_STREAM_DATA: u64 = 16 * 1024;
/// See [`DEFAULT_INITIAL_MAX_DATA`].
pub const DEFAULT_INITIAL_MAX_STREAMS: u64 = 8;

/// Configuration of one [`crate::Session`]. Every buffer the peer or the
/// application can grow has a bound here.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Largest stream chunk payload. Large writes are cut into chunks of this
    /// size so urgent messages can slip in between (late binding).
    pub chunk_size: usize,
    /// Bytes of one stream the peer may send beyond what we have read.
    pub stream_receive_window: u64,
    /// Bytes of all streams the peer may send beyond what we have read.
    pub connection_receive_window: u64,
    /// Streams the peer may have open at once.
    pub max_concurrent_peer_streams: u64,
    /// Unsent bytes the application may buffer per stream.
    pub stream_send_buffer: usize,
    /// Bytes of messages queued for sending (not yet handed to the
    /// transport), each counted as [`crate::message_queue_cost`] (its payload and the
    /// record kept of it); `send_message` fails with `QueueFull` beyond it.
    pub message_send_queue: usize,
    /// Bytes of received messages waiting for the application, counted as
    /// [`crate::message_queue_cost`]; beyond it
    /// [`crate::Session::receive_blocked`] asks the driver to stop reading.
    pub message_receive_queue: usize,
    /// Width of the message-number window used to drop duplicates.
    pub dedup_window: u64,
    /// How long a closed session waits for the peer to finish closing.
    pub drain_timeout: Duration,
    /// When the session spans several connections: which carries a message without a
    /// [`crate::MessageProps::path`] of its own (default: the lowest-RTT one, for latency).
    pub message_path: crate::PathPolicy,
    /// … and which carries a stream's data unless set per stream (default: aggregate, for
    /// throughput).
    pub stream_path: crate::PathPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            chunk_size: 16 * 1024,
            stream_receive_window: 1 << 20,
            connection_receive_window: 16 << 20,
            max_concurrent_peer_streams: 100,
            stream_send_buffer: 1 << 20,
            message_send_queue: 8 << 20,
            message_receive_queue: 8 << 20,
            dedup_window: 1 << 16,
            drain_timeout: Duration::from_secs(3),
            message_path: crate::PathPolicy::LowestRtt,
            stream_path: crate::PathPolicy::Aggregate,
        }
    }
}

/// A configuration value out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid session config: {0}")]
pub struct ConfigError(pub &'static str);

impl Config {
    /// Checks the values against the protocol's requirements.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.chunk_size == 0 || self.chunk_size > MAX_MESSAGE_SIZE {
            return Err(ConfigError("chunk_size must be 1..=MAX_MESSAGE_SIZE"));
        }
        if self.stream_receive_window < DEFAULT_INITIAL_MAX_STREAM_DATA {
            return Err(ConfigError(
                "stream_receive_window below DEFAULT_INITIAL_MAX_STREAM_DATA",
            ));
        }
        if self.connection_receive_window < DEFAULT_INITIAL_MAX_DATA {
            return Err(ConfigError(
                "connection_receive_window below DEFAULT_INITIAL_MAX_DATA",
            ));
        }
        if self.max_concurrent_peer_streams < DEFAULT_INITIAL_MAX_STREAMS {
            return Err(ConfigError(
                "max_concurrent_peer_streams below DEFAULT_INITIAL_MAX_STREAMS",
            ));
        }
        if self.dedup_window == 0 || self.stream_send_buffer == 0 {
            return Err(ConfigError(
                "dedup_window and stream_send_buffer must be > 0",
            ));
        }
        Ok(())
    }
}
