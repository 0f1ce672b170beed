//! Configuration of the endpoint and of each connection.

use std::time::Duration;

use crate::send_queue::Padder;

/// Congestion control algorithm for a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CongestionAlgorithm {
    /// CUBIC (RFC 9438), the Linux default.
    #[default]
    Cubic,
    /// NewReno (RFC 5681, RFC 6582).
    NewReno,
}

/// Keepalive settings (RFC 9293 §3.8.4). Linux defaults: 2 h idle, 75 s interval, 9 probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeepaliveConfig {
    pub idle: Duration,
    pub interval: Duration,
    pub probes: u32,
}

impl KeepaliveConfig {
    /// Probes after `idle` without traffic, every `interval`, giving up after `probes`
    /// unanswered ones.
    pub fn new(idle: Duration, interval: Duration, probes: u32) -> Self {
        Self {
            idle,
            interval,
            probes,
        }
    }
}

impl Default for KeepaliveConfig {
    fn default() -> Self {
        KeepaliveConfig {
            idle: Duration::from_secs(7200),
            interval: Duration::from_secs(75),
            probes: 9,
        }
    }
}

/// Per-connection configuration. Defaults follow Linux where the RFCs leave a choice, so that
/// the peer sees a familiar TCP; each option can be switched off for interop and middlebox tests.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ConnectionConfig {
    /// Path MTU used to derive the advertised MSS (RFC 9293 §3.7.1).
    pub mtu: u16,
    /// Advertised MSS override; `None` derives it from `mtu`.
    pub mss: Option<u16>,
    /// Smallest peer MSS accepted; smaller values are clamped up (Linux `tcp_min_snd_mss`,
    /// against the tiny-MSS resource attack, CVE-2019-11479).
    pub min_mss: u16,
    /// The send MSS after a path MTU black hole is suspected — three retransmission
    /// timeouts in a row with larger segments outstanding (RFC 8899 §4.3; Linux
    /// `tcp_base_mss` with `tcp_mtu_probing` = 1; over IPv6 at least 1220, what the
    /// 1280-byte minimum MTU carries). `None`: no black-hole detection. ICMP "packet too big"
    /// errors lower the MSS in any case (RFC 1191, RFC 8201).
    pub base_mss: Option<u16>,
    /// Send buffer limit in bytes (queued, unsent plus unacknowledged).
    pub send_buffer: usize,
    /// Receive buffer limit in bytes: in-order unread plus out-of-order data. The advertised
    /// window never exceeds it.
    pub recv_buffer: usize,
    /// Most out-of-order ranges held; beyond it new out-of-order segments are dropped.
    pub max_ooo_ranges: usize,
    /// Offer/accept window scaling (RFC 7323 §2).
    pub window_scaling: bool,
    /// Our receive window shift; `None` picks the smallest that covers `recv_buffer`.
    pub window_scale: Option<u8>,
    /// Offer/accept timestamps (RFC 7323 §3).
    pub timestamps: bool,
    /// Offer/accept SACK (RFC 2018).
    pub sack: bool,
    /// With timestamps negotiated, drop non-RST segments that carry none (RFC 7323 §3.2 SHOULD).
    pub drop_segments_without_timestamps: bool,
    /// Nagle's algorithm (RFC 896, RFC 9293 §3.7.4); off by default (TCP_NODELAY) since
    /// squarepeg sends messages.
    pub nagle: bool,
    /// Delayed-ACK timeout (RFC 9293 §3.8.6.3, RFC 5681 §4.2: < 500 ms; Linux uses 40 ms).
    /// `None` acknowledges every segment at once.
    pub delayed_ack: Option<Duration>,
    /// Full-sized data segments acknowledged at once at the start of a connection, before
    /// delayed ACKs begin (Linux's quick-ACK mode, `TCP_MAX_QUICKACKS` = 16): the peer's slow
    /// start then grows on every segment, and an odd-sized first flight (a Fast Open
    /// server's SYN-RECEIVED data, RFC 7413 §4.2.2) is not acknowledged a delayed-ACK timeout
    /// late, which would hold back a Careful Resume jump (RFC 9959) by as much. Smaller
    /// segments (requests, answers) keep the delayed ACK, which can ride on the reply or the
    /// FIN. 0: none.
    pub quick_acks: u32,
    /// Initial RTO (RFC 6298 §2.1).
    pub initial_rto: Duration,
    /// Lower bound of the RTO. RFC 6298 §2.4 says 1 s; Linux uses 200 ms, which is the default
    /// here so that the peer sees Linux timing.
    pub min_rto: Duration,
    /// Upper bound of the RTO (RFC 6298 §2.5: at least 60 s; Linux 120 s).
    pub max_rto: Duration,
    /// SYN retransmissions before giving up (Linux `tcp_syn_retries`).
    pub syn_retries: u32,
    /// SYN-ACK retransmissions before dropping a half-open connection (Linux `tcp_synack_retries`).
    pub synack_retries: u32,
    /// Data retransmissions before the connection is declared dead (RFC 9293 §3.8.3 R2,
    /// Linux `tcp_retries2`).
    pub max_retransmissions: u32,
    /// Abort when data stays unacknowledged this long (RFC 9293 §3.8.3 user timeout, RFC 5482),
    /// or when zero-window probes go unanswered this long. A peer that answers its probes
    /// keeps its connection however long its window stays closed (unlike Linux's
    /// `TCP_USER_TIMEOUT`, which counts the closed window's whole time); with a user timeout
    /// the probes are at most a quarter of it apart.
    pub user_timeout: Option<Duration>,
    /// Keepalive (RFC 9293 §3.8.4); off by default.
    pub keepalive: Option<KeepaliveConfig>,
    /// TIME-WAIT duration (2×MSL; RFC 9293 §3.4.2 suggests MSL = 2 min, Linux uses 60 s in
    /// total). Zero skips TIME-WAIT.
    pub time_wait: Duration,
    /// Short TIME-WAIT (NGTCP §3.3.3): `Some(floor)` makes TIME-WAIT last
    /// `max(2 × RTO, floor)` (at most `time_wait`) when both ends used timestamps. TIME-WAIT
    /// does two jobs (RFC 9293 §3.6.1): keep old duplicates of this incarnation out of the
    /// next one, which PAWS and RFC 6191's timestamp check do once timestamps are on (the
    /// next incarnation's SYN must carry a newer timestamp; its segments are stamped later
    /// than any old duplicate); and be there to re-acknowledge the peer's FIN if our last ACK
    /// is lost, which needs one retransmission timeout of the peer's plus a round trip — 2 ×
    /// our RTO covers it with a back-off to spare. The floor guards against an RTO measured on
    /// a path that later slows down. `None` (the default): `time_wait` always.
    pub short_time_wait: Option<Duration>,
    /// How long a connection closed by the application waits in FIN-WAIT-2 for the peer's FIN
    /// (Linux `tcp_fin_timeout`).
    pub fin_wait2_timeout: Duration,
    /// Congestion control algorithm.
    pub congestion: CongestionAlgorithm,
    /// Initial window in segments (RFC 6928).
    pub initial_window: u32,
    /// Duplicate-ACK threshold for fast retransmit (RFC 5681 §3.2, RFC 6675 DupThresh).
    pub dupack_threshold: u32,
    /// RACK-TLP loss detection (RFC 8985) when SACK is negotiated: losses are found by time
    /// (a segment sent before one that was delivered, and older than an RTT plus a reordering
    /// window, is lost; lost retransmissions are found too), and a tail loss probe draws the
    /// ACK that reveals losses at the end of a flight instead of waiting for the RTO. Off: the
    /// DupThresh rule of RFC 6675 and the RTO alone.
    pub rack_tlp: bool,
    /// Most challenge ACKs per second (RFC 5961 §7). Counted per connection, which avoids the
    /// global-counter side channel of CVE-2016-5696.
    pub challenge_ack_limit: u32,
    /// Trace log capacity in records (see [`crate::trace`]); 0, the default, keeps no trace.
    pub trace_capacity: usize,
    /// Consistent segmentation (Hollywood §4.2): never pack bytes of two writes into one
    /// segment, so that each small write starts a new segment. Off: MSS-packing across plain
    /// writes. Messages ([`Endpoint::write_message`](crate::Endpoint::write_message)) are
    /// never packed with other writes either way.
    pub consistent_segmentation: bool,
    /// uTCP receive (Minion §4.1 `SO_UNORDERED`): hand every accepted segment to the
    /// application at once with its stream offset; acknowledgments and the window stay as
    /// standard (see [`crate::utcp`]). Can also be switched on later, but not off.
    pub unordered_receive: bool,
    /// Minion §4.2 `SO_UNORDEREDSEND`: every `write` holds message records with their tags
    /// ([`crate::utcp::record`]), for drivers that pass only bytes.
    pub message_writes: bool,
    /// Inconsistent retransmissions (Hollywood §4.2): with a padder, a retransmission whose
    /// messages will have expired on arrival carries live messages instead, padded to the same
    /// length by this function (see [`crate::SendQueue`]). `None`: retransmissions always
    /// repeat the original bytes.
    pub padder: Option<Padder>,
    /// TCP Fast Open (RFC 7413). On a connection opened with
    /// [`Endpoint::connect`](crate::Endpoint::connect): the SYN carries the data written
    /// before the first `poll_transmit` when the endpoint holds a cookie for the server, else
    /// a cookie request (see the crate documentation). On a listener: SYNs with a valid
    /// cookie have their data accepted at once, and cookie requests are answered. Off by
    /// default: data on a SYN can be replayed (RFC 7413 §6), so an application must opt in.
    pub fast_open: bool,
    /// On a listener with `fast_open`: most connections whose SYN data was accepted that have
    /// not completed the handshake yet (RFC 7413 §5.1 `max_qlen`); beyond it a SYN with a
    /// valid cookie gets an ordinary handshake (its data is acknowledged only after it is
    /// sent again).
    pub fast_open_max_pending: usize,
    /// Careful Resume (RFC 9959, [`crate::resume`]): a connection to a host the endpoint's
    /// path cache knows starts in Reconnaissance and, once the path is confirmed, jumps to
    /// half the window the earlier connection used, paced, validated before it is trusted.
    /// Off by default: it changes how fast the sender ramps up toward a host, so it is the
    /// application's choice (a transfer tool, a returning client), and behaviour without
    /// it stays that of RFC 5681 / RFC 9438 slow start. The endpoint records path state
    /// either way.
    pub careful_resume: bool,
    /// A bound on the queue this connection builds in the network ([`crate::delay`]): when
    /// every sample of a round trip shows a queue more than this above the path's base delay
    /// (one way, from the TCP timestamps, where both ends tick in milliseconds; else by RTT),
    /// the window is reduced as for a loss, once per round trip, until the queue is back under
    /// it. For a sender whose own traffic shares a deep bottleneck buffer with what must stay
    /// fast (its ACKs for the other direction, real-time messages, a tunnel's inner flows):
    /// CUBIC alone fills an ADSL modem's seconds-long queue. `None` (the default): the
    /// controller's loss-based behaviour. Too small a limit leaves the link idle after each
    /// reduction (CUBIC keeps the link busy from about 0.4 × the base RTT up), and one below
    /// the peer's delayed-ACK time (40 ms on Linux) may count that delay as a queue.
    pub queue_delay_limit: Option<Duration>,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            mtu: 1500,
            mss: None,
            min_mss: 64,
            base_mss: Some(1024),
            send_buffer: 4 << 20,
            recv_buffer: 4 << 20,
            max_ooo_ranges: 512,
            window_scaling: true,
            window_scale: None,
            timestamps: true,
            sack: true,
            drop_segments_without_timestamps: true,
            nagle: false,
            delayed_ack: Some(Duration::from_millis(40)),
            quick_acks: 16,
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(120),
            syn_retries: 6,
            synack_retries: 5,
            max_retransmissions: 15,
            user_timeout: None,
            keepalive: None,
            time_wait: Duration::from_secs(60),
            short_time_wait: None,
            fin_wait2_timeout: Duration::from_secs(60),
            congestion: CongestionAlgorithm::Cubic,
            initial_window: 10,
            dupack_threshold: 3,
            rack_tlp: true,
            challenge_ack_limit: 1000,
            trace_capacity: 0,
            consistent_segmentation: false,
            unordered_receive: false,
            message_writes: false,
            padder: None,
            fast_open: false,
            fast_open_max_pending: 16,
            careful_resume: false,
            queue_delay_limit: None,
        }
    }
}

/// When the endpoint answers SYNs with SYN cookies (RFC 4987 §3.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SynCookies {
    /// Never; SYNs beyond the backlog are dropped.
    Never,
    /// When a listener's SYN backlog is full (Linux `tcp_syncookies = 1`).
    #[default]
    WhenBacklogFull,
    /// For every SYN (Linux `tcp_syncookies = 2`), useful for tests.
    Always,
}

/// Endpoint-wide configuration.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// Secret key for ISNs (RFC 6528), timestamp offsets and SYN cookies. Give every endpoint
    /// a fresh random key; the core takes it from the caller because it reads no randomness.
    pub secret: [u8; 32],
    /// Most connections (any state) held at once.
    pub max_connections: usize,
    /// Most half-open (SYN-RECEIVED) connections over all listeners.
    pub max_half_open: usize,
    /// SYN cookie policy.
    pub syn_cookies: SynCookies,
    /// Verify IP and TCP checksums of incoming packets; switch off when a driver has already
    /// verified them (checksum offload).
    pub verify_checksums: bool,
    /// TTL / hop limit of outgoing packets.
    pub ttl: u8,
    /// Bound of the queue of replies (RSTs) not tied to a connection.
    pub max_pending_replies: usize,
    /// The endpoint's own addresses. Packets to any other destination are dropped as
    /// [`NotLocal`](crate::DropReason::NotLocal) without a reply. Empty: every destination is
    /// ours (a TUN device routed only to us).
    pub local_addresses: Vec<std::net::IpAddr>,
    /// Most servers whose TCP Fast Open state (cookie, MSS, blackhole mark) the client keeps;
    /// the least recently used is forgotten first.
    pub fast_open_cache_size: usize,
    /// How long Fast Open stays off towards a server after a SYN with data went unanswered
    /// while the same SYN without data got through (RFC 7413 §4.1.3, Linux's TFO blackhole
    /// detection, whose first period is an hour).
    pub fast_open_blackhole: Duration,
    /// How often the server's Fast Open cookie key changes (RFC 7413 §4.1.2 asks servers to
    /// change it regularly, so that a cookie once learned does not open the server for ever):
    /// a cookie is accepted during the period it was made in and the next one, so for one to
    /// two periods, and a client that presents one of the previous period gets the new one in
    /// the SYN-ACK. `None`: one key for the endpoint's life (Linux's default, where the key
    /// changes only when an administrator sets `tcp_fastopen_key`).
    pub fast_open_key_period: Option<Duration>,
    /// The per-host path state kept for RFC 9040 temporal sharing and Careful Resume
    /// ([`crate::resume::PathCache`]): bounded in entries, entries expire.
    pub path_cache: crate::resume::PathCacheConfig,
    /// Memory budget over all connections (Linux `tcp_mem`): payload bytes held in send
    /// queues and receive buffers. Each connection keeps a floor in each direction; above
    /// `pressure` receive windows stop opening, at `limit` nothing more is admitted above the
    /// floors (writes come back short, received data beyond it is dropped, out-of-order data
    /// first). See [`crate::mem`] for the exact bound.
    pub memory: crate::mem::MemoryBudget,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            secret: [0x5a; 32],
            max_connections: 65536,
            max_half_open: 4096,
            syn_cookies: SynCookies::WhenBacklogFull,
            verify_checksums: true,
            ttl: 64,
            max_pending_replies: 256,
            local_addresses: Vec::new(),
            fast_open_cache_size: 1024,
            fast_open_blackhole: Duration::from_secs(3600),
            fast_open_key_period: Some(Duration::from_secs(24 * 3600)),
            path_cache: crate::resume::PathCacheConfig::default(),
            memory: crate::mem::MemoryBudget::default(),
        }
    }
}
