//! The squarepeg transport API: connections carrying messages and streams,
//! with priorities, lifetimes, dependencies and squash, in the style of
//! quinn. This version runs over kernel TCP; the same session core
//! (`squarepeg-session`) will run over squarepeg's own TCP.
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
//! [`ConnectionConfig::notsent_lowat`]; a non-blocking write then stops
//! being accepted once about twice that many bytes are unsent) and asks the
//! session scheduler for frames only when the socket is writable, at most
//! [`ConnectionConfig::write_batch`] bytes at a time. Everything else waits
//! in the session, where a more urgent message overtakes queued bulk data,
//! a newer message squashes an older one and an expired one is dropped. So
//! an urgent message waits behind at most about twice the lowat plus one
//! write batch of bulk data (192 KiB with the defaults), not behind the
//! socket buffer.
//!
//! # Backpressure
//!
//! - Messages: [`Connection::send_message`] waits while the session's send
//!   queue holds `Config::message_send_queue` bytes;
//!   [`Connection::try_send_message`] fails with [`SendError::QueueFull`]
//!   instead.
//! - Streams: writes wait (return `Pending`) while the stream's unsent
//!   buffer is full; peer flow control drains it.
//! - Receiving: when received messages fill `Config::message_receive_queue`
//!   the driver stops reading the socket, so TCP's window pushes back on the
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
//! One driver task per connection owns the socket; the session sits behind
//! a mutex shared with the application's handles. The driver wakes on socket
//! readiness, on application calls and on the session's timer.

pub mod bench;
mod config;
mod connection;
mod driver;
mod endpoint;
mod stream;

pub use config::ConnectionConfig;
pub use connection::{Connection, ConnectionStats};
pub use endpoint::{ConnectError, Endpoint};
pub use stream::Stream;

pub use bytes::Bytes;
pub use squarepeg_session::{
    Config as SessionConfig, ConnectionError, MAX_MESSAGE_SIZE, Message, MessageNumber,
    MessageProps, MessageStatus, Priority, SendError, Stats as SessionStats, StreamError, StreamId,
    transport_code,
};
