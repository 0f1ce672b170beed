//! The squarepeg transport API: connections carrying messages and streams,
//! with priorities, lifetimes, dependencies and squash, in the style of
//! quinn. Connections run over kernel TCP or over squarepeg's own TCP
//! (`squarepeg-tcp` on a `squarepeg-io` TUN stack, the `utcp` feature); the same
//! sans-IO connection core (`squarepeg-connection`: session, frame codec,
//! substrate adapter) runs on both, and this crate's one tokio driver drives
//! it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use squarepeg::{Connection, ConnectionConfig, Endpoint, MessageProps, Priority};
//! let server = Endpoint::bind("[::1]:0", ConnectionConfig::default()).await?;
//! let client = Connection::connect(server.local_addr()?, ConnectionConfig::default()).await?;
//! let accepted = server.accept().await?;
//! let props = MessageProps { substream: 1, priority: Priority::HIGHEST, ..Default::default() };
//! let number = client.send_message(b"hello".to_vec(), props).await?;
//! let msg = accepted.recv_message().await?;
//! assert_eq!((msg.substream, msg.number, &msg.payload[..]), (1, number, &b"hello"[..]));
//! client.close().await;
//! # Ok(()) }
//! ```
//!
//! # Late binding over kernel TCP
//!
//! The kernel cannot take back bytes it has been given, so on this
//! substrate partial reliability — expiry, squash and priority — acts only
//! on data not yet handed to the kernel; and delivery is in order. To leave
//! as much data as possible where those decisions can still be made, the
//! driver keeps the kernel's unsent queue short (`TCP_NOTSENT_LOWAT`, see
//! [`ConnectionConfig::notsent_lowat`]; by default it follows the delivery
//! rate, [`ConnectionConfig::unsent_drain`]: a few milliseconds of data,
//! between 8 and 64 KiB) and asks the session scheduler for frames only when
//! the socket is writable, at most the lowat (and
//! [`ConnectionConfig::write_batch`]) at a time. Everything else waits in
//! the session, where a more urgent message overtakes queued bulk data, a
//! newer message squashes an older one and an expired one is dropped. So an
//! urgent message waits behind at most about twice the lowat of bulk data
//! (16 KiB on an 8 Mbit/s path, 128 KiB on fast ones) plus what is in
//! flight, not behind the socket buffer.
//!
//! # Over the userspace TCP
//!
//! With the `utcp` feature (on by default), the same [`Connection`] (and [`Endpoint`]) run
//! over squarepeg's own TCP (`squarepeg-tcp`) on a `squarepeg-io` TUN [`Stack`]: open with
//! [`Connection::connect_utcp`] or listen with [`Endpoint::listen_utcp`]; everything after
//! that — messages, statuses, streams, close — is the same API. The peer may be any
//! squarepeg endpoint, over kernel or userspace TCP (the wire is TCP either way).
//!
//! ```no_run
//! # #[cfg(feature = "utcp")]
//! # async fn demo(stack: &squarepeg::Stack) -> Result<(), Box<dyn std::error::Error>> {
//! use squarepeg::{Connection, ConnectionConfig, MessageProps};
//! use std::time::Duration;
//! let conn = Connection::connect_utcp(stack, "10.77.0.1:4433".parse()?, ConnectionConfig::default()).await?;
//! let props = MessageProps { lifetime: Some(Duration::from_millis(100)), ..Default::default() };
//! conn.send_message(b"frame 1".to_vec(), props).await?;
//! let reply = conn.recv_message().await?; // as soon as its frame is complete, out of order
//! # Ok(()) }
//! ```
//!
//! What changes is the substrate's behaviour (the connection core,
//! `squarepeg_connection`, documents it): messages are delivered as soon as their frame is
//! complete, out of order, once each; streams are ordered per stream only; late binding
//! moves into the TCP's tagged send queue (priority insertion, squash, deadlines,
//! inconsistent retransmissions, Minion §4 and Hollywood §4.2); and a message status is the
//! TCP queue's verdict (`Sent` once transmitted — with a lifetime, once acknowledged —,
//! `Expired` when dropped before transmission, `Replaced` when an inconsistent
//! retransmission carried other messages in its place). [`ConnectionStats::utcp`] has the uTCP interface's counters. The TCP
//! options come from the stack's [`squarepeg_io::StackConfig::connection`] with unordered
//! receive, message writes, consistent segmentation and the uCOBS padder switched on.
//!
//! TLS works the same way ([`ConnectionConfig::tls`]): `connect_utcp` returns once the
//! handshake is done, records are numbered (docs/wire.md §5) and each frame is sealed into
//! records of its own, so the receiver opens every record whose bytes arrived and delivers
//! its messages out of order, as in cleartext ([`TlsStats::records_out_of_order`]). Until the
//! TCP has a padder that writes TLS records, inconsistent retransmissions stay off under TLS.
//!
//! **How the driver reaches the TCP (design choice).** The core needs the connection's
//! uTCP interface: segments with offsets, tagged message writes, message reports. The tokio
//! driver gets it through `squarepeg-io`'s `TcpStream` in *record mode* — unordered-receive
//! `read`s return REPORT and SEGMENT records, message-writes `write`s take MESSAGE records
//! (`squarepeg_tcp::utcp::record`) — rather than through a hook in the stack's driver
//! thread, because: (1) like Minion's socket options, it needs nothing but the ordinary
//! stream calls, so `squarepeg-io` stays a protocol-free packet driver and the stack's
//! thread never runs session code under the endpoint's lock; (2) the core stays in the
//! connection's shared state next to the application's handles, exactly as over kernel
//! TCP, which is what lets the two substrates share the `Connection` type and one driver;
//! (3) it is the interface other users of `squarepeg-io` already have. The costs: each
//! segment is copied once more (into its record), and a deadline travels as a lifetime
//! relative to the write — encoded just before the write; the TCP counts it from the next
//! time its clock is set, at most one stack driver turn later, so a message may live that
//! much longer, never shorter. The driver takes at most [`ConnectionConfig::write_batch`]
//! bytes of frames from the core at a time, and the next batch only when the last one is
//! written whole, so frames wait either in the session or in the TCP's tagged queue, where
//! late binding applies to them.
//!
//! # Framing
//!
//! Connections start in uCOBS and switch each direction to plain, length-prefixed frames
//! when the receiver reads in order and the sender never replaces retransmissions (over
//! kernel TCP both ways, by default; [`ConnectionConfig::plain_frames`]); docs/wire.md §3.
//!
//! # Backpressure
//!
//! - Messages: [`Connection::send_message`] waits while the session's send
//!   queue holds `Config::message_send_queue` bytes (each message counts its payload plus
//!   [`MESSAGE_RECORD_BYTES`] for the record kept of it, so empty messages
//!   fill the queue too);
//!   [`Connection::try_send_message`] fails with [`SendError::QueueFull`]
//!   instead.
//! - Streams: writes wait (return `Pending`) while the stream's unsent
//!   buffer is full; peer flow control drains it.
//! - Receiving: when received messages fill `Config::message_receive_queue`
//!   (counted the same way) the driver stops reading the socket, so TCP's window pushes back on the
//!   peer; stream data is bounded by the flow-control credit we give.
//!
//! # Payloads
//!
//! Payloads are [`bytes::Bytes`]. Sending takes any `Into<Bytes>` (a
//! `Vec<u8>` without a copy, a shared `Bytes` for the cost of a reference
//! count). A received [`Message`]'s payload is a slice of the chunk its
//! frame was decoded into: no allocation or copy per message, and the
//! chunk returns to a per-connection pool when its last payload is dropped
//! (see [`ConnectionConfig::read_buffer`] for the bound on memory that held
//! payloads can pin).
//!
//! # Threading
//!
//! One driver task per connection writes to the socket and reads from it
//! (over the userspace TCP: the stack's `TcpStream`); the connection core
//! (session, frame codec, substrate adapter) sits behind a mutex shared with
//! the application's handles. The driver wakes on socket readiness, on
//! application calls and on the core's timer. It is the same driver for both
//! substrates (`driver.rs`); what differs is a small adapter (`kernel.rs`,
//! `utcp.rs`). Over kernel TCP without TLS, a `recv_message` that finds
//! nothing received reads the socket itself (in the caller's task) rather
//! than wait for the driver to read and wake it
//! ([`ConnectionStats::reads_by_application`] counts those reads); whoever
//! reads holds the core's receiver, so bytes reach the core in order. Tasks
//! waiting on the connection are woken after its lock is let go.

pub mod bench;
mod config;
mod connection;
mod core;
mod driver;
mod endpoint;
mod fast_open;
mod kernel;
pub mod multipath;
mod staging;
mod stream;
pub mod transaction;
mod unsent;
#[cfg(feature = "utcp")]
mod utcp;

pub use config::{ConnectionConfig, FAST_OPEN_QUEUE};
pub use connection::{Connection, ConnectionStats, TlsInfo};
pub use endpoint::{ConnectError, Endpoint};
pub use multipath::{ListenAddress, MultipathEndpoint, MultipathOptions, PathAddress, PathTcp};
pub use stream::Stream;
pub use transaction::{Preference, TransactionError, Transactor, TransportProperties};

// Every type the public signatures use.
pub use bytes::Bytes;
pub use squarepeg_connection::{
    ClosedPath, MultipathConfig, MultipathStats, PathEvent, PathId, PathInfo, Protection, TlsSetup,
    UtcpStats,
};
pub use squarepeg_framing::{CobsError, FrameError, FrameFormat, HeaderError};
/// The userspace TCP's TUN stack (`squarepeg-io`): devices, stack configuration, streams —
/// what it takes to make the [`Stack`] that [`Connection::connect_utcp`] and
/// [`Endpoint::listen_utcp`] run on.
#[cfg(feature = "utcp")]
pub use squarepeg_io as io;
#[cfg(feature = "utcp")]
pub use squarepeg_io::Stack;
pub use squarepeg_session::control::ControlError;
pub use squarepeg_session::{
    Config as SessionConfig, ConfigError, ConnectionError, MAX_MESSAGE_SIZE, MESSAGE_RECORD_BYTES,
    Message, MessageNumber, MessageProps, MessageStatus, PathPolicy, Priority, ProtocolError,
    SendError, Stats as SessionStats, StreamError, StreamId, TlsFailure, TransportError,
    transport_code,
};
/// TLS 1.3 set-ups (`squarepeg-tls`): client configurations trusting the system's roots, a
/// CA, a pinned certificate; server configurations from PEM; self-signed certificates for
/// labs and quick starts; and `rustls` itself.
pub use squarepeg_tls as tls;
pub use squarepeg_tls::{TlsError, TlsStats};
