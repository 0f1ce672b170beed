//! Per-connection configuration of the tokio driver.

use squarepeg_session::Config;

/// Configuration of a [`crate::Connection`] and its driver.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// The session core's limits (windows, queues, chunk size).
    pub session: Config,
    /// `TCP_NOTSENT_LOWAT` in bytes: the kernel keeps about twice this much
    /// unsent data at most; the rest waits in the session scheduler, where
    /// priorities, squash and lifetimes still apply. `None` leaves the
    /// system default (the whole send buffer).
    pub notsent_lowat: Option<u32>,
    /// Bytes of frames gathered into one write system call.
    pub write_batch: usize,
    /// Bytes read from the socket per system call.
    pub read_buffer: usize,
    /// Message statuses kept for [`crate::Connection::next_message_status`]
    /// before the oldest are dropped (counted in
    /// [`crate::ConnectionStats::statuses_lagged`]). 0 turns status
    /// reporting off.
    pub status_queue: usize,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            session: Config::default(),
            notsent_lowat: Some(64 * 1024),
            write_batch: 64 * 1024,
            read_buffer: 64 * 1024,
            status_queue: 1 << 16,
        }
    }
}
