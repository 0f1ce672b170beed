//! A sans-IO TCP endpoint (RFC 9293 and companions) with the uTCP and Hollywood extensions.
//!
//! [`Endpoint`] is fed whole IPv4/IPv6 packets (as a TUN device carries them) and the current
//! time, and is polled for packets to send, its next timer and application events. It does no
//! I/O and reads no clock; randomness comes from the secret key in [`EndpointConfig`].
//!
//! Standards implemented, each cited where its rules live:
//! RFC 9293 (state machine, RST rules, TIME-WAIT, silly window avoidance, delayed ACKs,
//! keepalive), RFC 7323 (window scale, timestamps, PAWS), RFC 2018/2883 (SACK, D-SACK
//! tolerance), RFC 6298 (RTO), RFC 6675 (SACK loss recovery) with RFC 6582 (NewReno) when SACK
//! is off, RFC 3042 (limited transmit), RFC 5681 / RFC 9438 (NewReno and CUBIC congestion
//! control), RFC 3465 (byte counting), RFC 6928 (IW10), RFC 6528 (ISNs), RFC 5961 (challenge
//! ACKs), RFC 4987 (SYN cookies), RFC 6191 (TIME-WAIT reuse), RFC 896 (Nagle, off by default).

pub mod cc;
mod config;
mod conn;
mod endpoint;
mod error;
mod recv_buf;
mod rtt;
mod scoreboard;
mod secret;
mod send_queue;
mod syncookie;
pub mod wire;

pub use config::{
    CongestionAlgorithm, ConnectionConfig, EndpointConfig, KeepaliveConfig, SynCookies,
};
pub use conn::{CloseReason, Connection, ConnectionStats, Negotiated, State};
pub use endpoint::{ConnectionHandle, Endpoint, EndpointStats, Event, ListenerHandle};
pub use error::{DropReason, Error};
pub use rtt::RttEstimator;
pub use send_queue::{CommittedWrite, SendQueue, WriteTag};
