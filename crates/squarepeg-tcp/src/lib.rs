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
//! (SYN cookies), RFC 6191 (TIME-WAIT reuse), RFC 7413 (TCP Fast Open), RFC 896 (Nagle, off by default), RFC 7661
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
//! # TCP Fast Open (RFC 7413)
//!
//! Off unless [`ConnectionConfig::fast_open`] is set, on the listener (server) or on the
//! connection passed to [`Endpoint::connect`] (client).
//!
//! **Client.** `connect` builds no packet; the SYN is built by the first
//! [`Endpoint::poll_transmit`], so data written between the two (`write`, `write_message`:
//! writes are accepted in SYN-SENT) rides in the SYN when the endpoint holds a cookie for the
//! server's IP address, up to the MSS remembered with the cookie (else the default MSS, §4.2)
//! less the options. Without a cookie the SYN carries a cookie request and the data follows the
//! handshake. The SYN-ACK decides: data it acknowledges is done; data it does not acknowledge
//! is sent again at once after the handshake (the server dropped it, so it arrives once); a
//! cookie in it is cached; a SYN-ACK that neither took the data nor carried the option makes
//! the client forget its cookie (§4.1.3). A SYN with data that times out is retransmitted
//! without data and without the option; if the SYN-ACK then comes (the path drops SYNs with
//! data, §7.1), the server is marked a Fast Open blackhole for
//! [`EndpointConfig::fast_open_blackhole`] (an hour by default, as Linux's first period), and
//! Fast Open connects to it are ordinary ones until then. The cache holds
//! [`EndpointConfig::fast_open_cache_size`] servers (least recently used out first);
//! [`Endpoint::fast_open_cache`] / [`Endpoint::import_fast_open_cache`] export and import its
//! cookies ([`FastOpenEntry`], with a one-line text form) so a tool can keep them across runs.
//!
//! **Server.** The cookie is 8 bytes of a keyed SHA-256 over the client's and our IP
//! addresses and the number of the current key period under the endpoint's secret (§4.1.2:
//! keys change, [`EndpointConfig::fast_open_key_period`], a day by default): a cookie is good
//! in its period and the next, and one of the previous period is answered with the current
//! one; a new secret (a new endpoint) invalidates all cookies and clients fall back to a
//! cookie request. A SYN with a
//! valid cookie and data opens a connection that goes to the accept queue at once, with its
//! data readable before the handshake completes, and the SYN-ACK acknowledges the data. A SYN
//! with an invalid cookie, or a cookie request, gets a fresh cookie in the SYN-ACK, which
//! acknowledges only the SYN (the data is dropped and sent again by the client). At most
//! [`ConnectionConfig::fast_open_max_pending`] Fast Open connections per listener may be in
//! the handshake (§5.1 `max_qlen`); beyond that a valid SYN gets an ordinary handshake (and
//! its cookie back). SYN-cookie answers (RFC 4987) are stateless and take no Fast Open data.
//! In such a connection (SYN data accepted, so the cookie vouched for the client's address)
//! the server may answer before the handshake completes (§4.2.2): data written in
//! SYN-RECEIVED goes out after the SYN-ACK, from ISS + 1, up to the initial window counting
//! the SYN-ACK as one segment, so the answer reaches the client right behind the SYN-ACK,
//! one round trip after its SYN. The SYN-ACK's retransmission timer covers that data; if the
//! SYN-ACK has to go again (a timeout, or the client's SYN again), it goes alone, the data
//! sent behind it counts as lost (a client in SYN-SENT drops it) and goes again, with
//! anything written since, once the handshake completes. The client's ACK of the SYN-ACK may
//! acknowledge data too; after a repeated SYN-ACK it gives no RTT sample (Karn). A RST in
//! SYN-RECEIVED ends it all. Other passive opens (a cookie request, an invalid cookie, an
//! ordinary SYN, a SYN cookie) send no data before ESTABLISHED.
//!
//! **Replays.** Fast Open does not stop duplicate SYN data (§6): a SYN replayed while its
//! connection exists is a duplicate of that connection (SYN-ACK again, or a challenge ACK),
//! but once the server has forgotten the connection a replayed SYN with a valid cookie opens a
//! new one and its data reaches the application again. At-most-once must come from above
//! (TLS 1.3 single-use tickets). [`EndpointStats::fast_open`] counts all of this
//! ([`FastOpenStats`]).
//!
//! # Short TIME-WAIT
//!
//! With [`ConnectionConfig::short_time_wait`] (`Some(floor)`) and timestamps negotiated,
//! TIME-WAIT lasts max(2 × RTO, floor) instead of [`ConnectionConfig::time_wait`] (NGTCP
//! §3.3.3): timestamps and RFC 6191 keep old duplicates out of the next incarnation, and 2 ×
//! RTO is long enough to answer the peer's retransmitted FIN. A SYN that reaches a TIME-WAIT
//! connection with a newer timestamp opens a new one at once (RFC 6191), whichever the
//! duration. The kernel substrate cannot do this: Linux's TIME-WAIT is a fixed 60 s
//! (`TCP_TIMEWAIT_LEN`); a client reuses a 4-tuple in TIME-WAIT only with
//! `net.ipv4.tcp_tw_reuse` (timestamps, and at least a second since the last one), and a
//! server takes a new SYN into a TIME-WAIT 4-tuple with the same timestamp rule as here.
//!
//! Path MTU: an ICMP "packet too big" (RFC 1191, RFC 8201) quoting a segment in flight
//! (RFC 5927 §4.1) lowers the send MSS, never below 552 bytes of IPv4 MTU (Linux's
//! `min_pmtu`) or IPv6's 1280, and the segments in flight that no longer fit are sent again
//! cut to size, without a congestion response; where ICMP is filtered, the third
//! retransmission timeout in a row with larger segments outstanding cuts the MSS to
//! [`ConnectionConfig::base_mss`] (black-hole detection, RFC 8899 §4.3, Linux's
//! `tcp_mtu_probing` = 1). The MSS never grows back (no probing, RFC 8899's search).
//!
//! Not implemented (yet): PRR, HyStart++, F-RTO, undo of spurious fast retransmits, ECN,
//! urgent data (URG is ignored and data delivered inline, RFC 6093), path MTU probing
//! upwards, receive buffer auto-tuning, pacing (other than Careful Resume's jump) and
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
pub mod delay;
mod endpoint;
mod error;
pub mod mem;
mod recv_buf;
pub mod resume;
mod rtt;
mod scoreboard;
mod secret;
mod send_queue;
mod seq;
mod syncookie;
pub mod trace;
pub mod utcp;
pub mod wire;

pub use config::{
    CongestionAlgorithm, ConnectionConfig, EndpointConfig, KeepaliveConfig, SynCookies,
};
pub use conn::{CloseReason, Connection, ConnectionStats, Negotiated, State};
pub use endpoint::{
    ConnectionHandle, Endpoint, EndpointStats, Event, FastOpenEntry, FastOpenStats, ListenerHandle,
    MIN_TRANSMIT_BUFFER,
};
pub use error::{DropReason, Error};
pub use mem::MemoryBudget;
pub use resume::{PathCache, PathCacheConfig, PathRecord, ResumePhase, ResumeStats, SavedPath};
pub use rtt::RttEstimator;
pub use send_queue::{
    CommittedWrite, MAX_DEPENDENCY_DEPTH, MessageReport, Pad, Padder, SendQueue, SendQueueStats,
    WriteTag,
};
pub use trace::{TraceEvent, TraceRecord};
pub use utcp::{ReceivedSegment, UnorderedStats};
pub use wire::FastOpenCookie;
