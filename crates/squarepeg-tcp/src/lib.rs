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
//! is off, RFC 8985 (RACK-TLP loss detection and tail loss probes, with SACK), RFC 3042
//! (limited transmit), RFC 5681 / RFC 9438 (NewReno and CUBIC congestion control), RFC 3465
//! (byte counting), RFC 6928 (IW10), RFC 6528 (ISNs), RFC 5961 (challenge ACKs), RFC 4987
//! (SYN cookies), RFC 6191 (TIME-WAIT reuse), RFC 896 (Nagle, off by default), RFC 7661
//! (pipeACK and the non-validated phase of an application-limited flow: its loss response
//! stops at the initial window), RFC 3522 / RFC 3708 / RFC 4015 (a spurious retransmission
//! timeout, found by the timestamp echo or by D-SACKs, is undone), RFC 9040 (temporal sharing:
//! the endpoint keeps RTT and window per remote host, [`resume::PathCache`]) with RFC 9959
//! (Careful Resume from that state, paced; [`ConnectionConfig::careful_resume`], off by default).
//!
//! Loss recovery keeps one record per transmitted segment (its send time and transmission
//! order): the RFC 6675 scoreboard and `pipe` decide what to send; with SACK, RACK (RFC 8985
//! §6) decides what is lost by time, which tolerates reordering and finds lost
//! retransmissions, and a tail loss probe (§7) draws the ACK that reveals losses at the end of
//! a flight instead of waiting for the RTO. [`ConnectionConfig::rack_tlp`] switches back to the
//! DupThresh rule for scripted comparisons. Windows are sized in bytes (RFC 5681) but also
//! counted in segments, so that small segments (message traffic without Nagle) cannot
//! multiply the packets a window lets loose, as Linux, which counts cwnd in packets, never
//! does.
//!
//! A per-connection [`trace`] (off by default) records every transmission, acknowledgment,
//! timeout, probe and state change with the congestion state after it; the simulation tests
//! and `examples/trace.rs` read it.
//!
//! The uTCP / Hollywood extensions ([`utcp`], Minion §4, Hollywood §4.2–4.3): unordered
//! receive (every accepted segment handed to the application at once with its stream offset,
//! [`Endpoint::read_segment`]); tagged message writes into the [`SendQueue`], which keeps
//! them split into committed (sequence numbers fixed) and pending parts, with priority
//! insertion, squash, deadlines, same-length replacement of expired messages in
//! retransmissions (inconsistent retransmissions, with a padder), and per-message reports
//! ([`Endpoint::poll_report`]); both also as record streams over `read`/`write`
//! ([`utcp::record`]). Stream offsets, SRTT and RTTVAR are exposed on [`Connection`].
//!
//! Not implemented (yet): PRR, HyStart++, F-RTO, undo of spurious fast retransmits, ECN,
//! TCP Fast Open, urgent data (URG is ignored and data delivered inline, RFC 6093), path MTU
//! discovery / ICMP, receive buffer auto-tuning, pacing (other than Careful Resume's jump) and
//! segmentation offloads.
//!
//! ```
//! use std::time::Instant;
//! use squarepeg_tcp::{ConnectionConfig, Endpoint, EndpointConfig, Event};
//!
//! let now = Instant::now();
//! let endpoint = |secret| {
//!     let mut config = EndpointConfig::default();
//!     config.secret = secret;
//!     Endpoint::new(config, now)
//! };
//! let (mut client, mut server) = (endpoint([1; 32]), endpoint([2; 32]));
//! let addr = "10.0.0.2:80".parse().unwrap();
//! let listener = server.listen(addr, 16, ConnectionConfig::default()).unwrap();
//! let conn = client
//!     .connect(now, "10.0.0.1:0".parse().unwrap(), addr, ConnectionConfig::default())
//!     .unwrap();
//! client.write(conn, b"hello").unwrap();
//! let mut buf = [0u8; 1500];
//! let mut accepted = None;
//! let mut got = Vec::new();
//! // Move packets both ways until the server has the message (a driver would use TUN here).
//! for _ in 0..10 {
//!     while let Some(n) = client.poll_transmit(now, &mut buf) {
//!         let _ = server.handle_packet(now, &buf[..n]);
//!     }
//!     while let Some(n) = server.poll_transmit(now, &mut buf) {
//!         let _ = client.handle_packet(now, &buf[..n]);
//!     }
//!     while let Some(ev) = server.poll_event() {
//!         if let Event::Incoming(l) = ev {
//!             accepted = server.accept(l);
//!         }
//!     }
//!     if let Some(c) = accepted {
//!         if let Ok(n) = server.read(c, &mut buf) {
//!             got.extend_from_slice(&buf[..n]);
//!         }
//!     }
//! }
//! assert_eq!(got, b"hello");
//! ```

pub mod audit;
pub mod cc;
mod config;
mod conn;
mod cwv;
mod endpoint;
mod error;
mod recv_buf;
pub mod resume;
mod rtt;
mod scoreboard;
mod secret;
mod send_queue;
mod syncookie;
pub mod trace;
pub mod utcp;
pub mod wire;

pub use config::{
    CongestionAlgorithm, ConnectionConfig, EndpointConfig, KeepaliveConfig, SynCookies,
};
pub use conn::{CloseReason, Connection, ConnectionStats, Negotiated, State};
pub use endpoint::{
    ConnectionHandle, Endpoint, EndpointStats, Event, ListenerHandle, MIN_TRANSMIT_BUFFER,
};
pub use error::{DropReason, Error};
pub use resume::{PathCache, PathCacheConfig, PathRecord, ResumePhase, ResumeStats, SavedPath};
pub use rtt::RttEstimator;
pub use send_queue::{
    CommittedWrite, MAX_DEPENDENCY_DEPTH, MessageReport, Pad, Padder, SendQueue, SendQueueStats,
    WriteTag,
};
pub use trace::{TraceEvent, TraceRecord};
pub use utcp::{ReceivedSegment, UnorderedStats};
