//! Per-connection configuration of the tokio driver.

use std::time::Duration;

use squarepeg_connection::TlsSetup;
use squarepeg_session::{Config, ConfigError};

/// Configuration of a [`crate::Connection`] and its driver. Start from
/// `ConnectionConfig::default()` and change fields (the struct may gain fields, so it is not
/// built with a literal outside this crate).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConnectionConfig {
    /// The session core's limits (windows, queues, chunk size).
    pub session: Config,
    /// Switch each direction to plain frames (no byte stuffing, markers or checksum,
    /// docs/wire.md §3) where both ends allow it: the receiver reads in order and the
    /// sender never replaces retransmitted bytes. Off: uCOBS both ways.
    pub plain_frames: bool,
    /// Over the userspace TCP: when a retransmission would carry only messages that will
    /// arrive after their deadline, the TCP sends live messages in their place, padded to the
    /// same length (inconsistent retransmissions, Hollywood §4.2; reported as
    /// `MessageStatus::Replaced`). Off: every byte is retransmitted as first sent. No effect
    /// over kernel TCP, nor yet over TLS (the TCP's padder writes uCOBS padding, not TLS
    /// records; until a record padder exists, TLS connections retransmit consistently).
    pub inconsistent_retransmissions: bool,
    /// `TCP_NOTSENT_LOWAT` in bytes: the kernel keeps about twice this much
    /// unsent data at most; the rest waits in the session scheduler, where
    /// priorities, squash and lifetimes still apply. `None` leaves the
    /// system default (the whole send buffer). An urgent message waits
    /// behind at most about twice this (plus what is in flight): on slow
    /// paths a smaller value binds later (16 KiB is 16 ms at 8 Mbit/s).
    /// With [`unsent_drain`](Self::unsent_drain) set, this is the largest
    /// lowat the driver uses.
    pub notsent_lowat: Option<u32>,
    /// When set (with `notsent_lowat`), the lowat follows the connection's
    /// delivery rate (`TCP_INFO`, read every 50 ms): what the path carries
    /// in this time, at least 8 KiB and at most `notsent_lowat`. The kernel
    /// then holds a few milliseconds of unsent data on any path: enough to
    /// bridge a late wake-up of the driver, little for an urgent message
    /// to wait behind. `None`: `notsent_lowat` as set. (Linux only;
    /// elsewhere the fixed value.)
    pub unsent_drain: Option<Duration>,
    /// Bytes of frames gathered into one write system call (at most the
    /// lowat: the driver's batch is committed like the kernel's unsent
    /// data).
    pub write_batch: usize,
    /// Bytes read from the transport per system call. Received payloads are
    /// slices of shared chunks of about this size (no copy or allocation
    /// per message); while chunks kept alive by payloads the application
    /// (or the receive queue) still holds exceed
    /// `session.message_receive_queue` plus four reads, further payloads
    /// are copied out instead, so held payloads cannot pin unbounded
    /// memory.
    pub read_buffer: usize,
    /// Message statuses kept for [`crate::Connection::next_message_status`]
    /// before the oldest are dropped (counted in
    /// [`crate::ConnectionStats::statuses_lagged`]). 0 turns status
    /// reporting off.
    pub status_queue: usize,
    /// TLS 1.3: a client set-up for [`crate::Connection::connect`] and
    /// [`crate::Connection::connect_utcp`], a server set-up for [`crate::Endpoint::bind`] and
    /// [`crate::Endpoint::listen_utcp`]; see [`crate::tls`] for making one (trusted roots, a
    /// CA, a pinned certificate, a self-signed certificate). Over the userspace TCP records are
    /// numbered and opened out of order (docs/wire.md §5). `None`: cleartext.
    pub tls: Option<TlsSetup>,
    /// TCP Fast Open (RFC 7413) over kernel TCP. A client connects with
    /// `TCP_FASTOPEN_CONNECT`: its first write (the ClientHello, with early data when it
    /// returns to a server it holds a TLS ticket from) rides on the SYN once the kernel holds
    /// a cookie from the server, and the kernel falls back to an ordinary handshake when
    /// it does not (first contact, a refused cookie, a path that drops SYNs with data). A
    /// server listens with a Fast Open queue of [`FAST_OPEN_QUEUE`] pending connections;
    /// the host must allow it (`net.ipv4.tcp_fastopen` with bit 2 set, e.g. 3; Linux's
    /// default, 1, allows clients only). Off by default.
    ///
    /// Over the userspace TCP ([`crate::Connection::connect_utcp`],
    /// [`crate::Connection::connect_utcp_with_messages`]) the stack's own Fast Open (RFC
    /// 7413) carries the connection's first write (the ClientHello with any early data, or
    /// PARAMS in cleartext) on the SYN once the stack holds a cookie from the server; a
    /// stack's listeners answer Fast Open when its connection configuration enables it
    /// (`squarepeg_io::StackConfig::connection`).
    pub fast_open: bool,
    /// A TLS handshake not complete this long after the connection started fails it
    /// (`TlsFailure::HandshakeTimedOut`): a server that never answers, or bytes put in the
    /// stream that the handshake would wait on for ever, must not hold it open.
    pub handshake_timeout: Duration,
    /// After this long without bytes read or written, the connection gives back the memory
    /// of its empty buffers (read and write buffers, idle receive chunks, TLS buffers,
    /// queues grown in a burst): a server's idle connections hold a few KiB each rather than
    /// what their busiest moment needed (`ConnectionStats::buffer_bytes`). The next bytes
    /// allocate again. `None`: never.
    pub release_idle_after: Option<Duration>,
    /// When the peer stops answering — a path that blackholes, a NAT or firewall that
    /// forgot the connection, a host that vanished — the connection fails with
    /// `TransportError::TimedOut` about this long after (an application otherwise waits for
    /// ever on an idle connection, and about 15 minutes for data to be acknowledged). An
    /// idle connection is checked with keepalive probes (the first after a third of it, then
    /// every sixth; an answering peer keeps it open, and the probes keep NAT mappings
    /// alive); data sent and not acknowledged for this long ends it too, whatever ACKs of
    /// nothing new come meanwhile (over kernel TCP the driver reads `TCP_INFO`; the
    /// userspace TCP takes it as its user timeout). A peer
    /// that answers but keeps its window closed (its application does not read) is alive:
    /// its connection stays — over the userspace TCP also one that stops answering its
    /// zero-window probes is found (over kernel TCP that is left to the kernel's persist
    /// timer). At least 1 s; `None`: the system's (or the userspace stack's) defaults. A
    /// multipath session's own detection (`MultipathOptions`) is faster.
    pub dead_peer_timeout: Option<Duration>,
}

/// Pending Fast Open connections a listener accepts (RFC 7413 §5.1: the queue bounds the
/// state a SYN flood with valid cookies can create; beyond it, ordinary handshakes).
pub const FAST_OPEN_QUEUE: u32 = 256;

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            session: Config::default(),
            plain_frames: true,
            inconsistent_retransmissions: true,
            // Late binding against throughput: a smaller lowat leaves more
            // data in the session, where a more urgent message still
            // overtakes it (an urgent message waits behind about twice the
            // lowat plus one write batch), but wakes the driver to refill
            // the kernel more often (once per lowat/2 bytes sent, roughly).
            // Throughput is not limited by it as long as the driver refills
            // before the kernel runs dry: bytes in flight are bounded by
            // cwnd and the peer's window, not by the lowat. Measured on
            // loopback (docs/results.md, "Messages over kernel TCP"): 16,
            // 64 and 256 KiB and no lowat at all gave the same CPU per byte
            // and the same number of send calls, because loopback sends
            // each write at once and the unsent queue stays near empty.
            // 64 KiB keeps the worst-case wait of an urgent message near
            // 1 ms at 1 Gbit/s while costing one wake-up per 32 KiB; it is
            // the maximum the adaptive lowat below uses.
            notsent_lowat: Some(64 * 1024),
            // 4 ms: 64 KiB (the maximum) from about 130 Mbit/s up, so
            // loopback and fast paths are unchanged; 8 KiB at 8 Mbit/s,
            // where a fixed 64 KiB held an urgent message 64 ms longer
            // (docs/results.md, Minion §8.3 experiment over kernel TCP).
            unsent_drain: Some(Duration::from_millis(4)),
            // 64 KiB: as fast as 256 KiB on loopback (same CPU per byte
            // at 1 and 16 KiB messages), and a quarter of the memory.
            write_batch: 64 * 1024,
            read_buffer: 64 * 1024,
            status_queue: 1 << 16,
            tls: None,
            fast_open: false,
            handshake_timeout: Duration::from_secs(10),
            // The core's default (`squarepeg_connection::Config`): 1 s.
            release_idle_after: squarepeg_connection::Config::default().release_idle_after,
            // As QUIC stacks' idle timeouts (quinn's default 30 s), but only for a peer
            // that stopped answering: an idle connection whose peer answers the probes
            // stays open.
            dead_peer_timeout: Some(Duration::from_secs(30)),
        }
    }
}

impl ConnectionConfig {
    /// The connection core's part of this configuration.
    pub(crate) fn core_config(&self) -> squarepeg_connection::Config {
        let mut c = squarepeg_connection::Config::default();
        c.session = self.session.clone();
        c.read_buffer = self.read_buffer;
        c.plain_frames = self.plain_frames;
        c.tls = self.tls.clone();
        c.handshake_timeout = self.handshake_timeout;
        c.release_idle_after = self.release_idle_after;
        c
    }

    /// This configuration with TLS as a client that checks the server's certificate with
    /// `config` against `server_name`.
    pub fn with_tls_client(
        mut self,
        config: std::sync::Arc<squarepeg_tls::rustls::ClientConfig>,
        server_name: impl Into<String>,
    ) -> Self {
        self.tls = Some(TlsSetup::Client {
            config,
            server_name: server_name.into(),
        });
        self
    }

    /// This configuration with TLS as a server with `config` (its certificate and key).
    pub fn with_tls_server(
        mut self,
        config: std::sync::Arc<squarepeg_tls::rustls::ServerConfig>,
    ) -> Self {
        self.tls = Some(TlsSetup::Server { config });
        self
    }

    /// Checks the values, and that the TLS side (if any) is `role`'s.
    pub(crate) fn check(&self, role: squarepeg_connection::Role) -> Result<(), ConfigError> {
        self.core_config().validate()?;
        if self
            .dead_peer_timeout
            .is_some_and(|t| t < Duration::from_secs(1))
        {
            return Err(ConfigError(
                "dead_peer_timeout must be at least 1 s (None: the system's defaults)",
            ));
        }
        match &self.tls {
            Some(t) if t.is_client() != (role == squarepeg_connection::Role::Client) => {
                Err(ConfigError(if t.is_client() {
                    "a TLS client set-up cannot accept connections: use with_tls_server"
                } else {
                    "a TLS server set-up cannot open connections: use with_tls_client"
                }))
            }
            _ => Ok(()),
        }
    }
}

/// The keepalive schedule [`ConnectionConfig::dead_peer_timeout`] sets for a connection with
/// nothing outstanding, on either substrate: the first probe after a third of `timeout`, then
/// one every sixth, failing after as many as fit in it. With `whole_seconds` both times are
/// rounded down to whole seconds (at least one), as the kernel's socket options take them.
/// Returns (idle, interval, probes).
pub(crate) fn dead_peer_keepalive(
    timeout: Duration,
    whole_seconds: bool,
) -> (Duration, Duration, u32) {
    let round = |d: Duration| {
        if whole_seconds {
            Duration::from_secs(d.as_secs().max(1))
        } else {
            d
        }
    };
    let idle = round(timeout / 3);
    let interval = round(timeout / 6);
    let probes = timeout.saturating_sub(idle).as_nanos() / interval.as_nanos().max(1);
    (idle, interval, probes.clamp(1, u128::from(u32::MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same schedule on both substrates; the kernel's in whole seconds.
    #[test]
    fn the_dead_peer_keepalive_schedule() {
        let s = Duration::from_secs;
        assert_eq!(dead_peer_keepalive(s(30), false), (s(10), s(5), 4));
        assert_eq!(dead_peer_keepalive(s(30), true), (s(10), s(5), 4));
        assert_eq!(
            dead_peer_keepalive(s(3), false),
            (s(1), Duration::from_millis(500), 4)
        );
        // Half a second rounds up to the socket option's one: two probes fit.
        assert_eq!(dead_peer_keepalive(s(3), true), (s(1), s(1), 2));
    }
}
