//! One TCP connection: the transmission control block and the RFC 9293 state machine.
//!
//! Sequence numbers are kept unwrapped as positions relative to the initial sequence numbers
//! ([`SndPos`]: 0 = ISS, which the SYN occupies; data byte `d` is at `d + 1`; [`RcvPos`]
//! likewise relative to IRS), typed by space so that the two cannot be mixed (`crate::seq`).
//! The wire's 32-bit modular arithmetic is confined to `Seq::unwrap` (SEG.SEQ, SEG.ACK and
//! SACK edges in) and `Pos::wire` (out), so comparisons below are plain integer comparisons.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::cc::{AckEvent, CongestionControl, new_controller};
use crate::config::ConnectionConfig;
use crate::cwv::PipeAck;
use crate::delay::{DelayBound, DelaySample, RoundVerdict, SenderState, Stamps};
use crate::error::{DropReason, Error};
use crate::recv_buf::RecvBuffer;
use crate::resume::{Action as ResumeAction, CarefulResume, Observer, PathRecord, ResumeStats};
use crate::rtt::RttEstimator;
use crate::scoreboard::{Delivered, Scoreboard, Transmission};
use crate::send_queue::{MessageReport, Padder, SendQueue, SendQueueStats, WriteTag};
use crate::seq::{Pos, RcvPos, RcvSeq, Seq, SndPos, SndSeq};
use crate::trace::{TraceEvent, TraceLog, TraceRecord};
use crate::utcp::{ReceivedSegment, Unordered, UnorderedStats, record};
use crate::wire::{
    self, FastOpenCookie, MAX_SACK_BLOCKS, OutHeader, OutOptions, Segment, TcpFlags,
};

/// Connection states (RFC 9293 §3.3.2). LISTEN belongs to listeners, not connections.
/// CLOSED carries why the connection closed; TIME-WAIT's is always [`CloseReason::Normal`]
/// (its deadline is `Timer::TimeWait` in the connection's timer table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    SynSent,
    SynReceived,
    Established,
    FinWait1,
    FinWait2,
    CloseWait,
    Closing,
    LastAck,
    TimeWait,
    Closed(CloseReason),
}

impl State {
    /// Synchronized states (RFC 9293 §3.5.2 group 3).
    pub fn is_synchronized(self) -> bool {
        !matches!(self, State::SynSent | State::SynReceived | State::Closed(_))
    }

    /// Whether the connection has closed (CLOSED, any reason).
    pub fn is_closed(self) -> bool {
        matches!(self, State::Closed(_))
    }

    /// Why the connection closed: the reason in CLOSED, [`CloseReason::Normal`] in TIME-WAIT
    /// (both FINs done), `None` before.
    pub fn close_reason(self) -> Option<CloseReason> {
        match self {
            State::Closed(r) => Some(r),
            State::TimeWait => Some(CloseReason::Normal),
            _ => None,
        }
    }
}

/// Why a connection closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// Both directions finished with FINs.
    Normal,
    /// The peer sent an acceptable RST in a synchronized state.
    Reset,
    /// The peer refused the connection (RST in SYN-SENT, RFC 9293 §3.10.7.3).
    Refused,
    /// Retransmissions, SYN retries, keepalive or the user timeout gave up.
    TimedOut,
    /// Aborted locally (RST sent).
    Aborted,
}

impl CloseReason {
    pub(crate) fn error(self) -> Error {
        match self {
            CloseReason::Normal => Error::Closed,
            CloseReason::Reset => Error::ConnectionReset,
            CloseReason::Refused => Error::ConnectionRefused,
            CloseReason::TimedOut => Error::TimedOut,
            CloseReason::Aborted => Error::Aborted,
        }
    }
}

/// Options in force on a connection after the handshake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Negotiated {
    /// Largest payload we send per segment, before per-segment options.
    pub send_mss: u16,
    /// Peer's window shift (applied to windows it sends), if window scaling is on.
    pub send_window_scale: Option<u8>,
    /// Our window shift (applied to windows we send), if window scaling is on.
    pub recv_window_scale: Option<u8>,
    pub timestamps: bool,
    pub sack: bool,
}

/// Per-connection statistics.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ConnectionStats {
    pub state: State,
    pub srtt: Option<Duration>,
    pub rttvar: Duration,
    pub rto: Duration,
    pub min_rtt: Option<Duration>,
    pub congestion: &'static str,
    pub cwnd: u64,
    pub ssthresh: u64,
    pub bytes_in_flight: u64,
    pub pipe: u64,
    pub in_recovery: bool,
    pub send_mss: u16,
    pub packets_sent: u64,
    pub bytes_sent: u64,
    pub packets_retransmitted: u64,
    pub bytes_retransmitted: u64,
    pub fast_retransmits: u64,
    pub rto_timeouts: u64,
    /// Time spent waiting for retransmission timeouts that fired (from arming to expiry),
    /// SYN timeouts included: what timeouts cost this connection.
    pub rto_wait: Duration,
    pub sack_holes: usize,
    pub dup_acks_received: u64,
    pub dsacks_received: u64,
    pub packets_received: u64,
    pub bytes_received: u64,
    pub ooo_bytes: usize,
    pub recv_window: u64,
    pub send_window: u64,
    pub zero_window_probes: u64,
    /// Times an ICMP "packet too big" lowered the send MSS (RFC 1191, RFC 8201), and times
    /// timeouts of full-sized segments did (black-hole detection, RFC 8899 §4.3).
    pub path_mtu_reductions: u64,
    pub path_mtu_black_holes: u64,
    /// Tail loss probes sent (RFC 8985 §7), and those that repaired a loss.
    pub tail_loss_probes: u64,
    pub tail_loss_repairs: u64,
    pub keepalive_probes: u64,
    pub challenge_acks: u64,
    pub paws_rejected: u64,
    pub send_buffered: usize,
    pub recv_buffered: usize,
    /// Trace records dropped because the trace log was full (see [`crate::trace`]).
    pub trace_dropped: u64,
    /// Message handling of the send queue (expiry, squash, replacements).
    pub send_queue: SendQueueStats,
    /// Retransmitted segments that carried replacement messages (Hollywood §4.2).
    pub inconsistent_retransmissions: u64,
    /// Retransmission timeouts found spurious and undone (Eifel, RFC 3522 / RFC 4015, or
    /// D-SACK, RFC 3708).
    pub spurious_rtos_undone: u64,
    /// Loss responses that stopped at the initial window because the flow was application
    /// limited (RFC 7661 non-validated phase, see `Connection::congestion_event`).
    pub app_limited_floors: u64,
    /// Window reductions for a standing queue above
    /// [`ConnectionConfig::queue_delay_limit`](crate::ConnectionConfig::queue_delay_limit)
    /// (see [`crate::delay`]).
    pub queue_delay_reductions: u64,
    /// Times the bound took the path's base delay to have moved: a reduction shortened no
    /// queue, or the queue stayed with the window at its floor.
    pub queue_delay_rebases: u64,
    /// The unordered receive path (zero unless it is on).
    pub unordered: UnorderedStats,
    /// Careful Resume from cached path state (RFC 9959; all zero unless
    /// [`ConnectionConfig::careful_resume`](crate::ConnectionConfig::careful_resume) is on and
    /// the endpoint knew the host).
    pub resume: ResumeStats,
}

#[derive(Clone, Debug, Default)]
struct Counters {
    packets_sent: u64,
    bytes_sent: u64,
    packets_retransmitted: u64,
    bytes_retransmitted: u64,
    fast_retransmits: u64,
    rto_timeouts: u64,
    dup_acks: u64,
    dsacks: u64,
    packets_received: u64,
    bytes_received: u64,
    zero_window_probes: u64,
    path_mtu_reductions: u64,
    path_mtu_black_holes: u64,
    keepalive_probes: u64,
    challenge_acks: u64,
    paws_rejected: u64,
    tail_loss_probes: u64,
    tail_loss_repairs: u64,
    rto_wait: Duration,
    inconsistent_retransmissions: u64,
    spurious_rtos_undone: u64,
    app_limited_floors: u64,
    queue_delay_reductions: u64,
    queue_delay_rebases: u64,
}

/// Events a connection reports to its endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnEvent {
    Established,
    Readable,
    Writable,
    PeerFin,
    Closed(CloseReason),
}

/// What a connection learned about TCP Fast Open (RFC 7413) that the endpoint keeps (its
/// per-server cache) or counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FastOpenNote {
    /// A SYN went out with a cookie request.
    CookieRequested,
    /// A SYN went out with a cookie and this many bytes of data.
    SynData(usize),
    /// The server sent a cookie (and its MSS) in its SYN-ACK.
    CookieLearned(FastOpenCookie, Option<u16>),
    /// The server's MSS, from a SYN-ACK without a cookie.
    ServerMss(Option<u16>),
    /// The SYN-ACK acknowledged all the data on the SYN.
    SynDataAcked,
    /// The SYN-ACK acknowledged the SYN but not (all) its data: it is sent again.
    SynDataNotAcked,
    /// We sent a cookie and the SYN-ACK neither took the data nor carried the option: the
    /// cookie is no good (RFC 7413 §4.1.3), forget it.
    ForgetCookie,
    /// The SYN with data timed out, the SYN without data got through: Fast Open is off to
    /// this server for a while (RFC 7413 §4.1.3).
    Blackhole,
    /// A SYN with data timed out (retransmitted without it).
    SynDataTimeout,
}

/// Fast Open on an active open (RFC 7413 §4.2).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClientFastOpen {
    /// The cached cookie; `None` sends a cookie request.
    pub cookie: Option<FastOpenCookie>,
    /// The server's MSS remembered with the cookie, which bounds the data on the SYN.
    pub mss: Option<u16>,
    /// Data bytes the SYN carried (0 until it is sent).
    syn_data: u64,
    /// The SYN with data timed out and was sent again without it.
    syn_data_timed_out: bool,
}

impl ClientFastOpen {
    pub(crate) fn new(cookie: Option<FastOpenCookie>, mss: Option<u16>) -> Self {
        ClientFastOpen {
            cookie,
            mss,
            syn_data: 0,
            syn_data_timed_out: false,
        }
    }
}

/// A connection timer. Each has one deadline in [`Timers`]; `handle_timeout` dispatches
/// the expired ones in [`Timer::ALL`]'s order. Adding a timer is a variant here, its place
/// in that order and its arm in the dispatch (the compiler asks for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// TIME-WAIT's end (RFC 9293 §3.6: 2 MSL, or the configured time).
    TimeWait,
    /// How long FIN-WAIT-2 waits for the peer's FIN after the application closed.
    FinWait2,
    /// The delayed ACK (RFC 9293 §3.8.6.3).
    DelayedAck,
    /// RACK's reordering timer (RFC 8985 §6.2): when segments sent before RACK.xmit_ts may
    /// be deemed lost.
    Reordering,
    /// The tail loss probe's timeout, PTO (RFC 8985 §7.2).
    LossProbe,
    /// The retransmission timeout (RFC 6298), also for SYN and SYN-ACK retries.
    Retransmission,
    /// The zero-window probe (RFC 9293 §3.8.6.1).
    Persist,
    /// Keep-alive (RFC 9293 §3.8.4).
    Keepalive,
    /// When the next paced segment may leave (Careful Resume's Unvalidated phase, RFC 9959);
    /// its expiry only makes the connection send again.
    Pacing,
}

impl Timer {
    /// Every timer, in dispatch order: the ones that end the connection first, the loss
    /// probe before the retransmission timeout it may replace.
    pub(crate) const ALL: [Timer; 9] = [
        Timer::TimeWait,
        Timer::FinWait2,
        Timer::DelayedAck,
        Timer::Reordering,
        Timer::LossProbe,
        Timer::Retransmission,
        Timer::Persist,
        Timer::Keepalive,
        Timer::Pacing,
    ];
}

/// The deadlines of a connection's timers: the one place that arms, cancels and reports
/// them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timers {
    at: [Option<Instant>; Timer::ALL.len()],
}

impl Timers {
    /// Arms `timer` for `at` (re-arming moves it).
    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.at[timer as usize] = Some(at);
    }

    /// Arms `timer` for `at`, or cancels it with `None`.
    pub(crate) fn arm(&mut self, timer: Timer, at: Option<Instant>) {
        self.at[timer as usize] = at;
    }

    pub(crate) fn cancel(&mut self, timer: Timer) {
        self.at[timer as usize] = None;
    }

    pub(crate) fn get(&self, timer: Timer) -> Option<Instant> {
        self.at[timer as usize]
    }

    pub(crate) fn is_armed(&self, timer: Timer) -> bool {
        self.at[timer as usize].is_some()
    }

    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.at.iter().flatten().min().copied()
    }

    /// Whether `timer` has expired by `now`; if so it is disarmed.
    pub(crate) fn take_expired(&mut self, timer: Timer, now: Instant) -> bool {
        let slot = &mut self.at[timer as usize];
        if slot.is_some_and(|t| t <= now) {
            *slot = None;
            true
        } else {
            false
        }
    }
}

/// RACK state (RFC 8985 §6).
#[derive(Clone, Copy, Debug)]
struct Rack {
    /// RACK.xmit_ts and RACK.end_seq: the most recently sent segment delivered so far.
    xmit: Option<Transmission>,
    /// RACK.rtt: the round trip of that segment.
    rtt: Duration,
    /// RACK.reordering_seen.
    reordering_seen: bool,
    /// RACK.reo_wnd_mult and RACK.reo_wnd_persist (§6.2 step 3).
    reo_wnd_mult: u32,
    reo_wnd_persist: u32,
    /// RACK.dsack_round: SND.NXT when the window was last widened.
    dsack_round: Option<SndPos>,
}

impl Default for Rack {
    fn default() -> Self {
        Rack {
            xmit: None,
            rtt: Duration::ZERO,
            reordering_seen: false,
            reo_wnd_mult: 1,
            reo_wnd_persist: 0,
            dsack_round: None,
        }
    }
}

/// Tail loss probe state (RFC 8985 §7).
#[derive(Clone, Copy, Debug)]
struct Tlp {
    /// TLP.end_seq: SND.NXT after the probe, while a probe episode is open.
    end_seq: Option<SndPos>,
    /// TLP.is_retrans: the probe resent the last segment.
    is_retrans: bool,
    /// The PTO fired: send a probe.
    pending: bool,
    /// An RTT sample arrived since the last probe (§7.3 condition 2).
    sampled: bool,
    /// The range a retransmitted probe resent, for the detection of a spurious timeout that
    /// follows it (RFC 3708: every retransmission of the episode must be D-SACKed).
    probe: Option<(SndPos, SndPos)>,
}

impl Default for Tlp {
    fn default() -> Self {
        Tlp {
            end_seq: None,
            is_retrans: false,
            pending: false,
            sampled: true,
            probe: None,
        }
    }
}

/// What a retransmission timeout took away, kept until the timeout proves needed or spurious
/// (RFC 3522 Eifel detection with timestamps, RFC 3708 detection with D-SACK; the RFC 4015
/// response restores the congestion state).
#[derive(Debug)]
struct RtoUndo {
    /// The congestion controller as it was before the first timeout of the series (`None`:
    /// a controller that keeps no snapshot, whose timeouts are not undone).
    cc: Option<Box<dyn CongestionControl>>,
    /// TSval of the first retransmission after the timeout (RFC 3522 §2: RetransmitTS).
    retransmit_ts: u32,
    /// A retransmitted tail loss probe was outstanding at the timeout: an Eifel verdict on
    /// the timeout says nothing about whether the probe repaired a loss.
    probe_open: bool,
    /// SND.UNA at the timeout.
    una: SndPos,
    /// The first acceptable ACK after the timeout has not been seen yet (Eifel looks at that
    /// one only, RFC 3522 §2).
    first_ack_pending: bool,
    /// Ranges retransmitted since the timeout and not yet reported as duplicates by a D-SACK
    /// (RFC 3708 §3: the timeout was spurious once every retransmission is D-SACKed).
    retransmitted: Vec<(SndPos, SndPos)>,
    /// More retransmissions than `MAX_UNDO_RANGES`: D-SACK detection given up.
    overflow: bool,
}

/// Retransmitted ranges an [`RtoUndo`] follows for D-SACK detection.
const MAX_UNDO_RANGES: usize = 64;

/// Worst-case delayed-ACK timer of the peer, added to the PTO of a one-segment flight whose
/// ACK the peer may delay (RFC 8985 §7.2 WCDelAckT).
const WC_DEL_ACK: Duration = Duration::from_millis(200);
/// Added to 2*SRTT in the PTO of a longer flight so that timer granularity and small jitter
/// on very short paths do not trigger probes (Linux TCP_TIMEOUT_MIN).
const PTO_SLACK: Duration = Duration::from_millis(2);

#[derive(Clone, Copy, Debug)]
struct Recovery {
    /// RecoveryPoint (RFC 6675) / `recover` (RFC 6582): HighData at entry.
    point: SndPos,
    /// Partial ACKs so far (RFC 6582 §3.2 step 5).
    partial_acks: u32,
}

/// What the handshake learned from the peer's SYN.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerSyn {
    pub irs: RcvSeq,
    pub mss: Option<u16>,
    pub window_scale: Option<u8>,
    pub sack_permitted: bool,
    pub timestamps: Option<(u32, u32)>,
    pub window: u16,
}

/// Endpoint-wide context a connection needs for output.
#[derive(Clone, Debug)]
pub(crate) struct Shared {
    pub epoch: Instant,
    pub ttl: u8,
    /// The endpoint's memory budget (crate::mem).
    pub mem: crate::mem::MemPool,
}

/// Timestamp ticks by which a segment may be older than TS.Recent and still pass PAWS.
const PAWS_WINDOW: u32 = 1;
/// 24 days, after which TS.Recent is considered stale (RFC 7323 §5.5).
const PAWS_IDLE: Duration = Duration::from_secs(24 * 24 * 3600);
/// Rate limit for ACKs answering out-of-window segments (Linux `tcp_invalid_ratelimit`),
/// which stops ACK storms between desynchronized peers.
const INVALID_ACK_INTERVAL: Duration = Duration::from_millis(500);

/// `now + d`, saturating far in the future instead of panicking on absurd configured durations.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u32::MAX as u64)))
        .unwrap_or(now)
}

/// Wrapping "a < b" for 32-bit timestamps (RFC 7323 §5.2).
fn ts_before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// Window for SYN and SYN-ACK: the free space, at most 65535, rounded down to a multiple of the
/// MSS as Linux does (64240 for MSS 1460), so that the peer sees the familiar value.
pub(crate) fn initial_window(space: usize, mss: u16) -> u16 {
    let w = space.min(65535);
    let mss = mss as usize;
    (if w > mss { w - w % mss } else { w }) as u16
}

fn default_mss(addr: &SocketAddr) -> u16 {
    // RFC 9293 §3.7.1: 536 for IPv4 without an MSS option; IPv6 minimum MTU 1280 - 60.
    if addr.is_ipv4() { 536 } else { 1220 }
}

pub struct Connection {
    local: SocketAddr,
    remote: SocketAddr,
    cfg: ConnectionConfig,
    shared: Shared,
    /// This connection's charge against the endpoint's memory budget (crate::mem).
    mem: crate::mem::ConnMem,
    state: State,
    passive: bool,

    // Send sequence space (RFC 9293 §3.3.1), unwrapped.
    iss: SndSeq,
    snd_una: SndPos,
    snd_nxt: SndPos,
    snd_wnd: u64,
    /// SEG.SEQ and SEG.ACK of the last window update (in the peer's space and ours).
    snd_wl1: RcvPos,
    snd_wl2: SndPos,
    max_snd_wnd: u64,
    queue: SendQueue,
    /// The application asked to send a FIN after the queued data.
    fin_queued: bool,
    /// Position of our FIN once sent.
    fin_seq: Option<SndPos>,

    // Receive sequence space, unwrapped.
    irs: RcvSeq,
    rcv_nxt: RcvPos,
    /// Right edge of the window last advertised (RCV.NXT + RCV.WND when it was sent).
    rcv_adv: RcvPos,
    recv: RecvBuffer,
    /// uTCP receive: segments handed to the application on arrival (Minion §4.1).
    unordered: Option<Box<Unordered>>,
    /// Position of the peer's FIN when it arrived out of order or in order.
    peer_fin_at: Option<RcvPos>,
    peer_fin_processed: bool,
    /// Estimate of the peer's segment size, for delayed ACKs (largest payload seen).
    rcv_mss: usize,
    /// The peer's current segment size, for "every second segment" ACKs: follows smaller
    /// segments too once two in a row have the same size (Linux tcp_measure_rcv_mss).
    ack_mss: usize,
    /// Payload of the last data segment received.
    last_seg_len: usize,
    /// RCV.NXT when we last sent an ACK (for "every second full-sized segment").
    rcv_acked: RcvPos,
    /// In-order data segments still to be acknowledged at once (quick-ACK mode at the start
    /// of the connection; [`ConnectionConfig::quick_acks`]).
    quick_acks_left: u32,

    // Options.
    snd_wscale: u8,
    rcv_wscale: u8,
    wscale_ok: bool,
    sack_ok: bool,
    ts_ok: bool,
    ts_offset: u32,
    ts_recent: u32,
    ts_recent_valid: bool,
    ts_recent_age: Instant,
    /// RCV.NXT carried by the last ACK we sent (Last.ACK.sent of RFC 7323 §4.3).
    last_ack_sent: RcvPos,
    /// Our SYN options as offered (to answer a simultaneous open identically).
    offered_mss: u16,
    /// Largest payload per segment before options (effective send MSS, RFC 9293 §3.7.1).
    snd_mss: u16,
    /// Receiver-side SACK blocks as stream offsets, most recent first (RFC 2018 §4).
    sack_recent: Vec<(u64, u64)>,
    /// Duplicate range to report as a D-SACK in the next ACK (RFC 2883 §4), positions.
    dsack: Option<(RcvPos, RcvPos)>,

    // Loss recovery and congestion control.
    sb: Scoreboard,
    dupacks: u32,
    /// Duplicate ACKs without any SACK block although SACK was negotiated.
    plain_dupacks: u32,
    recovery: Option<Recovery>,
    /// RFC 6582 `recover`: no new recovery until SND.UNA passes it.
    recover: SndPos,
    /// Bytes by which the last cumulative ACK advanced SND.UNA (RFC 6582 §4.1 heuristic).
    last_ack_advance: u64,
    /// Segments that cumulative ACK covered (the RFC 6582 §4.1 heuristic counts segments).
    last_ack_segments: u64,
    /// NewReno window inflation in bytes (RFC 6582 §3.2), used without SACK.
    reno_inflation: i64,
    /// One retransmission allowed regardless of cwnd (fast retransmit, RTO).
    force_retransmit: bool,
    /// After an RTO, until everything then outstanding is acknowledged (RFC 6675 §5.1).
    rto_recovery: bool,
    rack: Rack,
    tlp: Tlp,
    /// Set at a retransmission timeout, until it proves needed or spurious.
    rto_undo: Option<RtoUndo>,
    /// What the flow gets acknowledged per round trip (RFC 7661 §4.2).
    pipe_ack: PipeAck,
    rtt: RttEstimator,
    cc: Box<dyn CongestionControl>,
    /// The bound on the queue this connection builds, if configured.
    delay_bound: Option<DelayBound>,
    /// The window before the bound's last reduction: given back if the reduction proves to
    /// have shortened no queue. Every loss response (and timeout) clears it.
    delay_undo: Option<u64>,
    /// Largest flight since the last ACK (decides whether cwnd limited the sender).
    max_flight_recent: u64,
    /// Careful Resume from cached path state (RFC 9959), while a saved state is in use.
    resume: Option<Box<CarefulResume>>,
    /// What the path carried per round trip, for the endpoint's path cache (RFC 9040).
    observer: Observer,

    /// Every timer of the connection, in one table ([`Timers`]).
    timers: Timers,
    /// When the retransmission timer was last armed (to count the time spent waiting for it).
    rto_armed_at: Instant,
    persist_backoff: u32,
    /// Position of an outstanding zero-window probe byte.
    zwp_seq: Option<SndPos>,
    /// When the first zero-window probe that no ACK has answered yet was sent: with a user
    /// timeout, probing a closed window for that long without an answer ends the connection
    /// (a peer that answers its probes is alive, however long it keeps the window closed).
    probe_unanswered_since: Option<Instant>,
    keepalive_sent: u32,
    /// Consecutive retransmission timeouts (also SYN / SYN-ACK retries).
    rto_count: u32,
    /// When the oldest unacknowledged data was first outstanding (user timeout).
    unacked_since: Option<Instant>,
    last_send: Option<Instant>,

    // Output requests.
    ack_now: bool,
    syn_pending: bool,
    rst_pending: bool,
    zwp_pending: bool,
    keepalive_pending: bool,
    last_invalid_ack: Option<Instant>,
    /// RST answering an unacceptable ACK: <SEQ=SEG.ACK><CTL=RST> (wire value).
    rst_reply_pending: Option<u32>,
    /// When the (first, not retransmitted) SYN or SYN-ACK went out, for the first RTT sample.
    syn_sent_at: Option<Instant>,
    /// Send what the window allows despite sender SWS avoidance (override timer fired).
    sws_override: bool,
    challenge_window_start: Option<Instant>,
    challenge_count: u32,

    // Application side.
    user_closed: bool,
    readable_armed: bool,
    writable_armed: bool,
    events: Vec<ConnEvent>,
    ip_id: u32,
    counters: Counters,
    /// The latest time the connection was called with (for trace records of calls that take
    /// no time, such as state changes inside `write`).
    clock: Instant,
    trace: Option<Box<TraceLog>>,

    // TCP Fast Open (RFC 7413).
    /// Active open with Fast Open: what goes in the SYN, until the SYN-ACK.
    fo_client: Option<ClientFastOpen>,
    /// Passive open whose SYN data was accepted (its application may read before the
    /// handshake completes).
    fo_passive: bool,
    /// A Fast Open passive open may send data in SYN-RECEIVED (RFC 7413 §4.2.2): set with
    /// `fo_passive`, cleared when the SYN-ACK has to go again (its data then waits for the
    /// handshake), so once cleared with `fo_passive` set, the SYN-ACK went more than once.
    fo_early_send: bool,
    /// Cookie our SYN-ACK carries (answer to a cookie request or an invalid cookie).
    fo_reply_cookie: Option<FastOpenCookie>,
    /// Notes for the endpoint's Fast Open cache and counters.
    fo_notes: Vec<FastOpenNote>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("state", &self.state)
            .field("snd_una", &self.snd_una)
            .field("snd_nxt", &self.snd_nxt)
            .field("rcv_nxt", &self.rcv_nxt)
            .finish_non_exhaustive()
    }
}

pub(crate) struct NewConnection {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub cfg: ConnectionConfig,
    pub shared: Shared,
    pub iss: u32,
    pub ts_offset: u32,
    pub ip_id: u32,
    pub now: Instant,
}

impl Connection {
    fn new(n: NewConnection, state: State, passive: bool) -> Connection {
        let cfg = n.cfg;
        let ip_overhead = wire::ip_header_len(&n.local) as u16 + wire::TCP_HEADER as u16;
        let offered_mss = cfg
            .mss
            .unwrap_or_else(|| cfg.mtu.saturating_sub(ip_overhead))
            .max(cfg.min_mss);
        let rcv_wscale = crate::endpoint::rcv_wscale_for(&cfg);
        let snd_mss = default_mss(&n.remote).min(offered_mss);
        let rtt = RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto);
        let cc = new_controller(cfg.congestion, snd_mss as u64, cfg.initial_window);
        let mem = crate::mem::ConnMem::new(n.shared.mem.clone());
        Connection {
            local: n.local,
            remote: n.remote,
            shared: n.shared,
            mem,
            state,
            passive,
            iss: Seq::new(n.iss),
            snd_una: Pos::ZERO,
            snd_nxt: Pos::ZERO,
            snd_wnd: 0,
            snd_wl1: Pos::ZERO,
            snd_wl2: Pos::ZERO,
            max_snd_wnd: 0,
            queue: SendQueue::new(cfg.send_buffer, !cfg.consistent_segmentation),
            fin_queued: false,
            fin_seq: None,
            irs: Seq::new(0),
            rcv_nxt: Pos::ZERO,
            rcv_adv: Pos::ZERO,
            recv: RecvBuffer::new(cfg.max_ooo_ranges),
            unordered: None,
            peer_fin_at: None,
            peer_fin_processed: false,
            rcv_mss: 536.min(offered_mss as usize),
            ack_mss: 536.min(offered_mss as usize),
            last_seg_len: 0,
            rcv_acked: Pos::ZERO,
            quick_acks_left: cfg.quick_acks,
            snd_wscale: 0,
            rcv_wscale,
            wscale_ok: false,
            sack_ok: false,
            ts_ok: false,
            ts_offset: n.ts_offset,
            ts_recent: 0,
            ts_recent_valid: false,
            ts_recent_age: n.now,
            last_ack_sent: Pos::ZERO,
            offered_mss,
            snd_mss,
            sack_recent: Vec::new(),
            dsack: None,
            sb: Scoreboard::default(),
            dupacks: 0,
            plain_dupacks: 0,
            recovery: None,
            recover: Pos::ZERO,
            last_ack_advance: 0,
            last_ack_segments: 0,
            reno_inflation: 0,
            force_retransmit: false,
            rto_recovery: false,
            rack: Rack::default(),
            tlp: Tlp::default(),
            rto_undo: None,
            pipe_ack: PipeAck::default(),
            rtt,
            cc,
            max_flight_recent: 0,
            resume: None,
            observer: Observer::default(),
            delay_bound: cfg.queue_delay_limit.map(DelayBound::new),
            delay_undo: None,
            timers: Timers::default(),
            rto_armed_at: n.now,
            persist_backoff: 0,
            zwp_seq: None,
            keepalive_sent: 0,
            rto_count: 0,
            unacked_since: None,
            last_send: None,
            ack_now: false,
            syn_pending: true,
            rst_pending: false,
            zwp_pending: false,
            probe_unanswered_since: None,
            keepalive_pending: false,
            last_invalid_ack: None,
            rst_reply_pending: None,
            syn_sent_at: None,
            sws_override: false,
            challenge_window_start: None,
            challenge_count: 0,
            user_closed: false,
            readable_armed: true,
            writable_armed: false,
            events: Vec::new(),
            ip_id: n.ip_id,
            counters: Counters::default(),
            clock: n.now,
            trace: (cfg.trace_capacity > 0).then(|| Box::new(TraceLog::new(cfg.trace_capacity))),
            fo_client: None,
            fo_passive: false,
            fo_early_send: false,
            fo_reply_cookie: None,
            fo_notes: Vec::new(),
            cfg,
        }
    }

    /// Active open (RFC 9293 §3.10.1): SYN-SENT with a SYN to send.
    pub(crate) fn new_active(n: NewConnection) -> Connection {
        let mut c = Connection::new(n, State::SynSent, false);
        c.init_unordered();
        c.snd_nxt = Pos::ZERO;
        c
    }

    /// Passive open after a SYN to a listener (RFC 9293 §3.10.7.2): SYN-RECEIVED with a SYN-ACK
    /// to send.
    pub(crate) fn new_passive(n: NewConnection, syn: &PeerSyn) -> Connection {
        let now = n.now;
        let mut c = Connection::new(n, State::SynReceived, true);
        c.init_unordered();
        c.accept_peer_syn(now, syn);
        c
    }

    /// Active open with TCP Fast Open (RFC 7413 §4.2): the first SYN carries `fo`'s cookie
    /// and the data queued by then, or a cookie request.
    pub(crate) fn new_active_fast_open(n: NewConnection, fo: ClientFastOpen) -> Connection {
        let mut c = Connection::new_active(n);
        c.fo_client = Some(fo);
        c
    }

    /// Passive open for a SYN with a valid Fast Open cookie (RFC 7413 §4.3): its data is
    /// accepted at once, the SYN-ACK acknowledges it, and the application may read it
    /// before the handshake completes, and answer before then too (§4.2.2,
    /// `fo_early_send_allowed`).
    pub(crate) fn new_passive_fast_open(
        n: NewConnection,
        syn: &PeerSyn,
        data: &[u8],
    ) -> Connection {
        let now = n.now;
        let mut c = Connection::new_passive(n, syn);
        c.fo_passive = true;
        c.fo_early_send = true;
        // The data is accepted into the window our SYN-ACK offers.
        c.rcv_adv = c.rcv_nxt + c.syn_window() as u64;
        // A FIN on the SYN is left for the peer to send again after the handshake: taking it
        // here would move SYN-RECEIVED to CLOSE-WAIT before our SYN is acknowledged.
        c.process_text(now, RcvPos::AFTER_SYN, data, false);
        c
    }

    /// Sets the cookie the SYN-ACK carries (RFC 7413 §4.1.2).
    pub(crate) fn set_fast_open_reply(&mut self, cookie: FastOpenCookie) {
        self.fo_reply_cookie = Some(cookie);
    }

    pub(crate) fn take_fast_open_notes(&mut self) -> std::vec::Drain<'_, FastOpenNote> {
        self.fo_notes.drain(..)
    }

    /// The SYN-ACK of a Fast Open active open (RFC 7413 §4.2): what it acknowledged of the
    /// SYN's data, the cookie it carried. Returns the position acknowledged. Data it did not
    /// acknowledge becomes unsent again (SND.NXT moves back to SEG.ACK) and goes out as
    /// ordinary data once ESTABLISHED: the server dropped it (§4.3), so it arrives once.
    fn fast_open_syn_ack(&mut self, seg: &Segment<'_>, ack: SndPos) -> SndPos {
        let Some(fo) = self.fo_client.take() else {
            return SndPos::AFTER_SYN;
        };
        let data_acked = ack.get().saturating_sub(1).min(fo.syn_data);
        let all_acked = fo.syn_data > 0 && data_acked == fo.syn_data;
        if fo.syn_data > 0 {
            self.fo_notes.push(if all_acked {
                FastOpenNote::SynDataAcked
            } else {
                FastOpenNote::SynDataNotAcked
            });
        }
        match seg.options.fast_open {
            Some(c) if !c.is_request() => self
                .fo_notes
                .push(FastOpenNote::CookieLearned(c, seg.options.mss)),
            _ if fo.cookie.is_some() && fo.syn_data > 0 && !all_acked && !fo.syn_data_timed_out => {
                self.fo_notes.push(FastOpenNote::ForgetCookie)
            }
            _ => self.fo_notes.push(FastOpenNote::ServerMss(seg.options.mss)),
        }
        if fo.syn_data_timed_out && !all_acked {
            self.fo_notes.push(FastOpenNote::Blackhole);
        }
        let acked = SndPos::of_offset(data_acked);
        if data_acked > 0 {
            self.queue.ack(data_acked);
        }
        self.snd_nxt = acked;
        acked
    }

    /// TIME-WAIT's length: `time_wait`, or with [`ConnectionConfig::short_time_wait`] and
    /// timestamps on both ends, max(2 × RTO, floor) (see there for why that is enough).
    fn time_wait_duration(&self) -> Duration {
        match self.cfg.short_time_wait {
            Some(floor) if self.ts_ok => (self.rtt.current_rto() * 2)
                .max(floor)
                .min(self.cfg.time_wait),
            _ => self.cfg.time_wait,
        }
    }

    /// A connection re-created from a valid SYN cookie (RFC 4987 §3.6): ESTABLISHED at once.
    pub(crate) fn new_from_cookie(
        n: NewConnection,
        syn: &PeerSyn,
        our_tsval: Option<u32>,
    ) -> Connection {
        let now = n.now;
        let mut c = Connection::new(n, State::SynReceived, true);
        c.init_unordered();
        c.accept_peer_syn(now, syn);
        c.syn_pending = false;
        // Our SYN-ACK was sent statelessly with an unscaled window of this size.
        c.rcv_adv = c.rcv_nxt + c.syn_window() as u64;
        c.snd_nxt = SndPos::AFTER_SYN;
        c.snd_una = SndPos::AFTER_SYN;
        c.last_ack_sent = c.rcv_nxt;
        c.rcv_acked = c.rcv_nxt;
        if our_tsval.is_none() {
            c.ts_ok = false;
        }
        c.set_state(State::Established);
        c.update_keepalive(now);
        c
    }

    fn accept_peer_syn(&mut self, now: Instant, syn: &PeerSyn) {
        self.irs = syn.irs;
        self.rcv_nxt = RcvPos::AFTER_SYN;
        self.rcv_acked = RcvPos::AFTER_SYN;
        // RFC 7323 §2.2: the window in a SYN is never scaled.
        self.snd_wnd = syn.window as u64;
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = Pos::ZERO;
        self.snd_wl2 = Pos::ZERO;
        // Window scaling only if both sides sent the option (RFC 7323 §2.2); shift > 14 is
        // treated as 14 (§2.3).
        match (self.cfg.window_scaling, syn.window_scale) {
            (true, Some(ws)) => {
                self.wscale_ok = true;
                self.snd_wscale = ws.min(14);
            }
            _ => {
                self.wscale_ok = false;
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
            }
        }
        self.sack_ok = self.cfg.sack && syn.sack_permitted;
        if let (true, Some((tsval, _))) = (self.cfg.timestamps, syn.timestamps) {
            self.ts_ok = true;
            self.ts_recent = tsval;
            self.ts_recent_valid = true;
            self.ts_recent_age = now;
        } else {
            self.ts_ok = false;
        }
        // Effective send MSS (RFC 9293 §3.7.1): the peer's MSS option, or the default.
        let peer_mss = syn.mss.unwrap_or_else(|| default_mss(&self.remote));
        self.snd_mss = peer_mss.max(self.cfg.min_mss).min(self.local_mss_limit());
        self.cc.set_mss(self.effective_mss() as u64);
    }

    /// An ICMP "packet too big" quoting our segment numbered `seq` (the wire value): a link
    /// on the path carries packets of at most `mtu` bytes (RFC 1191 §6, RFC 8201 §4). It is
    /// believed only if `seq` is in flight (RFC 5927 §4.1: an attacker must guess the window
    /// to shrink our segments); the send MSS then drops to what fits — never below a floor,
    /// 552 bytes for IPv4 (Linux's `min_pmtu`, against forged tiny MTUs) and 1280 for IPv6
    /// (RFC 8201 §4) — and the segments in flight that no longer fit, which the link
    /// dropped, are retransmitted cut to size. Not a congestion signal: the window stays
    /// (as Linux's `tcp_simple_retransmit`). Returns whether the error was believed.
    pub(crate) fn on_packet_too_big(&mut self, now: Instant, mtu: u32, seq: u32) -> bool {
        if !self.state.is_synchronized() || self.state == State::TimeWait {
            return false;
        }
        let quoted = self.snd_pos(seq);
        if quoted < self.snd_una || quoted >= self.snd_nxt {
            return false;
        }
        let floor = if self.local.is_ipv6() { 1280 } else { 552 };
        let overhead = (wire::ip_header_len(&self.local) + wire::TCP_HEADER) as u32;
        let mss = (mtu.clamp(floor, u32::from(u16::MAX)) - overhead)
            .max(u32::from(self.cfg.min_mss)) as u16;
        if mss >= self.snd_mss {
            return true;
        }
        tracing::debug!(local = %self.local, remote = %self.remote, mtu, mss, "path MTU lowered");
        self.snd_mss = mss;
        self.cc.set_mss(self.effective_mss() as u64);
        self.counters.path_mtu_reductions += 1;
        self.sb.mark_larger_lost(self.effective_mss() as u64);
        self.update_send_timers(now);
        true
    }

    /// After a retransmission timeout (`rto_count` counts it): black-hole detection (RFC
    /// 8899 §4.3, as Linux with `tcp_mtu_probing` = 1). A link that drops full-sized packets
    /// without an ICMP error — ICMP filtered on the way back, common on the corporate paths
    /// and VPNs squarepeg is for — looks like a path that lost everything: the third timeout
    /// in a row with a segment larger than [`ConnectionConfig::base_mss`] outstanding cuts
    /// the send MSS to it (IPv6: at least the 1280-byte minimum MTU's), for the rest of the
    /// connection (no probing back up). A path that only lost three times in a row keeps
    /// working with smaller segments.
    fn detect_mtu_black_hole(&mut self) {
        let Some(base) = self.cfg.base_mss else {
            return;
        };
        let base = if self.local.is_ipv6() {
            base.max(1280 - 60)
        } else {
            base
        };
        if self.rto_count != 3 || self.snd_mss <= base {
            return;
        }
        // Payloads at the base size (the options every segment carries come off it).
        let options = u64::from(self.snd_mss) - self.effective_mss() as u64;
        if self.sb.largest_payload() <= u64::from(base).saturating_sub(options) {
            return;
        }
        tracing::debug!(local = %self.local, remote = %self.remote, mss = base, "path MTU black hole");
        self.snd_mss = base.max(self.cfg.min_mss);
        self.cc.set_mss(self.effective_mss() as u64);
        self.counters.path_mtu_black_holes += 1;
    }

    /// Largest payload our own MTU allows.
    fn local_mss_limit(&self) -> u16 {
        let ip_overhead = wire::ip_header_len(&self.local) as u16 + wire::TCP_HEADER as u16;
        self.cfg
            .mtu
            .saturating_sub(ip_overhead)
            .max(self.cfg.min_mss)
    }

    /// Payload per segment after the options every segment carries (timestamps), which is
    /// what congestion control counts as SMSS (Linux `mss_cache`).
    fn effective_mss(&self) -> usize {
        let ts = if self.ts_ok { 12 } else { 0 };
        (self.snd_mss as usize).saturating_sub(ts).max(1)
    }

    // ---------------------------------------------------------------- accessors

    pub fn state(&self) -> State {
        self.state
    }
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
    pub fn remote_addr(&self) -> SocketAddr {
        self.remote
    }
    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.state.close_reason()
    }
    /// Stream offset (ISN-relative, 0 = first data byte) of the next byte `read` returns.
    pub fn read_offset(&self) -> u64 {
        self.recv.read_offset()
    }
    /// Stream offset the next written byte will get, if no later write overtakes it.
    pub fn write_offset(&self) -> u64 {
        self.queue.end()
    }
    /// Stream offset of the first unacknowledged byte.
    pub fn acked_offset(&self) -> u64 {
        self.queue.una()
    }
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }
    pub fn rttvar(&self) -> Duration {
        self.rtt.rttvar()
    }
    /// Bytes readable now (in unordered mode: bytes of segments not yet read).
    pub fn readable(&self) -> usize {
        match &self.unordered {
            Some(u) => u.bytes(),
            None => self.recv.readable(),
        }
    }

    /// Whether unordered receive is on (Minion §4.1).
    pub fn unordered_receive(&self) -> bool {
        self.unordered.is_some()
    }
    /// Whether retransmissions may carry replacements (a padder is set).
    pub fn has_padder(&self) -> bool {
        self.cfg.padder.is_some()
    }
    pub(crate) fn set_padder(&mut self, padder: Option<Padder>) {
        self.cfg.padder = padder;
    }
    /// Free space in the send buffer (and under the endpoint's memory budget).
    pub fn writable(&self) -> usize {
        self.queue.free().min(self.send_room())
    }
    /// Whether the peer's FIN has been received.
    pub fn peer_fin(&self) -> bool {
        self.peer_fin_processed
    }

    pub fn negotiated(&self) -> Negotiated {
        Negotiated {
            send_mss: self.effective_mss() as u16,
            send_window_scale: self.wscale_ok.then_some(self.snd_wscale),
            recv_window_scale: self.wscale_ok.then_some(self.rcv_wscale),
            timestamps: self.ts_ok,
            sack: self.sack_ok,
        }
    }

    pub fn stats(&self) -> ConnectionStats {
        let flight = self.flight();
        ConnectionStats {
            state: self.state,
            srtt: self.rtt.srtt(),
            rttvar: self.rtt.rttvar(),
            rto: self.rtt.current_rto(),
            min_rtt: self.rtt.min_rtt(),
            congestion: self.cc.name(),
            cwnd: self.cc.cwnd(),
            ssthresh: self.cc.ssthresh(),
            bytes_in_flight: flight,
            pipe: self.sb.pipe(flight),
            in_recovery: self.recovery.is_some(),
            send_mss: self.effective_mss() as u16,
            packets_sent: self.counters.packets_sent,
            bytes_sent: self.counters.bytes_sent,
            packets_retransmitted: self.counters.packets_retransmitted,
            bytes_retransmitted: self.counters.bytes_retransmitted,
            fast_retransmits: self.counters.fast_retransmits,
            rto_timeouts: self.counters.rto_timeouts,
            rto_wait: self.counters.rto_wait,
            sack_holes: self.sb.holes(),
            dup_acks_received: self.counters.dup_acks,
            dsacks_received: self.counters.dsacks,
            packets_received: self.counters.packets_received,
            bytes_received: self.counters.bytes_received,
            ooo_bytes: self.recv.ooo_bytes(),
            recv_window: self.rcv_adv.saturating_sub(self.rcv_nxt),
            send_window: self.snd_wnd,
            zero_window_probes: self.counters.zero_window_probes,
            path_mtu_reductions: self.counters.path_mtu_reductions,
            path_mtu_black_holes: self.counters.path_mtu_black_holes,
            tail_loss_probes: self.counters.tail_loss_probes,
            tail_loss_repairs: self.counters.tail_loss_repairs,
            keepalive_probes: self.counters.keepalive_probes,
            challenge_acks: self.counters.challenge_acks,
            paws_rejected: self.counters.paws_rejected,
            send_buffered: self.queue.len(),
            recv_buffered: self.recv.used(),
            trace_dropped: self.trace.as_ref().map_or(0, |t| t.dropped),
            send_queue: self.queue.stats(),
            inconsistent_retransmissions: self.counters.inconsistent_retransmissions,
            spurious_rtos_undone: self.counters.spurious_rtos_undone,
            app_limited_floors: self.counters.app_limited_floors,
            queue_delay_reductions: self.counters.queue_delay_reductions,
            queue_delay_rebases: self.counters.queue_delay_rebases,
            unordered: self
                .unordered
                .as_ref()
                .map(|u| u.stats())
                .unwrap_or_default(),
            resume: self.resume_stats(),
        }
    }

    /// Panics if the connection's state is inconsistent: the receive buffer, send queue and
    /// scoreboard each agree with their own counts, SND.UNA <= SND.NXT, and received data
    /// lies below RCV.NXT or within the window last advertised. For fuzzing and tests
    /// ([`Endpoint::check_invariants`](crate::Endpoint::check_invariants)).
    pub(crate) fn check_invariants(&self) {
        self.recv.check_invariants();
        self.queue.check_invariants();
        self.sb.check_invariants();
        assert!(
            self.snd_una <= self.snd_nxt,
            "SND.UNA {:?} beyond SND.NXT {:?}",
            self.snd_una,
            self.snd_nxt
        );
        if self.state.is_synchronized() {
            // Stream offset o is sequence position o + 1 (the SYN takes position 0).
            assert!(
                RcvPos::of_offset(self.recv.next()) <= self.rcv_nxt.max(RcvPos::AFTER_SYN),
                "in-order point {} beyond RCV.NXT {:?}",
                self.recv.next(),
                self.rcv_nxt
            );
            let right = self.rcv_adv.max(self.rcv_nxt);
            if let Some(&(_, end)) = self.recv.ooo_ranges().last() {
                assert!(
                    RcvPos::of_offset(end) <= right,
                    "out-of-order data up to {end} beyond the window edge {right:?}"
                );
            }
        }
    }

    pub(crate) fn take_events(&mut self) -> std::vec::Drain<'_, ConnEvent> {
        // Message reports are read like segments in unordered mode.
        self.wake_reader_if_unordered();
        self.events.drain(..)
    }

    /// Drains the trace log (empty when tracing is off).
    pub(crate) fn take_trace(&mut self) -> Vec<TraceRecord> {
        self.trace.as_mut().map_or_else(Vec::new, |t| t.take())
    }

    /// Appends a trace record, if tracing is on.
    fn trace(&mut self, event: TraceEvent) {
        if self.trace.is_none() {
            return;
        }
        let flight = self.flight();
        let record = TraceRecord {
            time: self.clock,
            event,
            state: self.state,
            cwnd: self.cc.cwnd(),
            ssthresh: self.cc.ssthresh(),
            srtt: self.rtt.srtt(),
            rttvar: self.rtt.rttvar(),
            rto: self.rtt.current_rto(),
            bytes_in_flight: flight,
            pipe: self.sb.pipe(flight),
            snd_una: self.snd_una.get().saturating_sub(1),
            snd_nxt: self.snd_nxt.get().saturating_sub(1),
            send_window: self.snd_wnd,
            retransmissions: self.counters.packets_retransmitted,
            in_recovery: self.recovery.is_some(),
        };
        if let Some(log) = self.trace.as_mut() {
            log.push(record);
        }
    }

    fn set_state(&mut self, to: State) {
        if self.state != to {
            let from = self.state;
            self.state = to;
            self.trace(TraceEvent::State { from, to });
        }
    }

    pub(crate) fn is_passive(&self) -> bool {
        self.passive
    }

    pub(crate) fn has_pending_rst(&self) -> bool {
        self.rst_pending
    }

    /// Right edge of the peer's offered window. The window is relative to the ACK that carried
    /// it (SND.WL2), not to SND.UNA: an old segment may advance SND.UNA without being allowed to
    /// update the window (RFC 9293 §3.10.7.4), and SND.UNA + SND.WND would then overshoot.
    fn send_right_edge(&self) -> SndPos {
        self.snd_wl2 + self.snd_wnd
    }

    fn flight(&self) -> u64 {
        self.snd_nxt - self.snd_una
    }

    fn wire_seq(&self, pos: SndPos) -> u32 {
        pos.wire(self.iss).get()
    }

    fn wire_ack(&self) -> u32 {
        self.rcv_nxt.wire(self.irs).get()
    }

    /// A sequence number of ours from the wire (SEG.ACK, a SACK edge), unwrapped near
    /// SND.UNA; negative when before the ISS.
    fn snd_pos(&self, wire: u32) -> SndPos {
        SndSeq::new(wire).unwrap(self.iss, self.snd_una)
    }

    /// SEG.ACK unwrapped.
    fn seg_ack(&self, seg: &Segment<'_>) -> SndPos {
        self.snd_pos(seg.ack)
    }

    /// SEG.SEQ unwrapped near RCV.NXT; negative when before the IRS.
    fn seg_seq(&self, seg: &Segment<'_>) -> RcvPos {
        RcvSeq::new(seg.seq).unwrap(self.irs, self.rcv_nxt)
    }

    fn ts_now(&self, now: Instant) -> u32 {
        let ms = now.saturating_duration_since(self.shared.epoch).as_millis() as u32;
        ms.wrapping_add(self.ts_offset)
    }

    // ---------------------------------------------------------------- application side

    pub(crate) fn read(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        if self.unordered.is_some() {
            return self.read_records(buf);
        }
        if self.recv.readable() == 0 {
            self.check_end_of_stream()?;
            return Ok(0);
        }
        let before_window = self.rcv_adv.saturating_sub(self.rcv_nxt);
        let n = self.recv.read(buf);
        if self.recv.readable() == 0 {
            self.readable_armed = true;
        }
        self.after_consume(before_window);
        Ok(n)
    }

    /// With nothing to read: `Ok` at the end of the stream, the close error, or `WouldBlock`
    /// (arming the next `Readable` event).
    fn check_end_of_stream(&mut self) -> Result<(), Error> {
        if self.peer_fin_processed {
            return Ok(());
        }
        if let Some(reason) = self.close_reason() {
            return match reason {
                CloseReason::Normal => Ok(()),
                r => Err(r.error()),
            };
        }
        self.readable_armed = true;
        Err(Error::WouldBlock)
    }

    /// Window update after the application consumed data (RFC 9293 §3.8.6.2.2): send one when
    /// the window we could offer has at least doubled and is worth a segment, as Linux does in
    /// tcp_cleanup_rbuf, so that a sender blocked on a small window resumes.
    fn after_consume(&mut self, before_window: u64) {
        if self.state.is_synchronized() && !self.peer_fin_processed {
            let now_offer = self.free_space() as u64;
            let buff = self.recv_buffer_now();
            let worth = if buff < self.cfg.recv_buffer {
                (self.rcv_mss as u64).min((buff / 2).max(1) as u64)
            } else {
                self.rcv_mss as u64
            };
            if before_window * 2 <= buff as u64
                && now_offer >= 2 * before_window.max(1)
                && now_offer >= worth
            {
                self.ack_now = true;
            }
        }
    }

    // ------------------------------------------------------------ uTCP receive (Minion §4.1)

    fn init_unordered(&mut self) {
        if self.cfg.unordered_receive {
            // Nothing is held yet.
            let _ = self.enable_unordered();
        }
    }

    /// Switches on unordered receive: from now on every accepted segment is handed to the
    /// application at once. What the buffer holds is handed over first, as segments.
    pub(crate) fn enable_unordered(&mut self) -> Result<(), Error> {
        if self.unordered.is_some() {
            return Ok(());
        }
        let mut u = Box::new(Unordered::new(self.cfg.recv_buffer / 4));
        for (offset, data) in self.recv.drop_content() {
            let end = offset + data.len() as u64;
            u.deliver(offset, &data, &[(offset, end)], true);
        }
        self.unordered = Some(u);
        self.wake_reader_if_unordered();
        Ok(())
    }

    /// Hands a segment's accepted bytes (stream offset `offset`) to the application, noting
    /// which of them are new (`new`).
    fn deliver_unordered(&mut self, offset: u64, data: &[u8], new: &[(u64, u64)]) {
        // The new bytes were admitted (process_text); copies of old ones only if they fit.
        let old_ok = data.len() <= self.recv_room();
        if !old_ok && data.len() as u64 > new.iter().map(|(s, e)| e - s).sum::<u64>() {
            self.mem.note_drop();
        }
        if let Some(u) = self.unordered.as_mut()
            && u.deliver(offset, data, new, old_ok)
        {
            self.wake_reader_if_unordered();
        }
    }

    fn wake_reader_if_unordered(&mut self) {
        if (self.unordered.as_ref().is_some_and(|u| !u.is_empty())
            || (self.unordered.is_some() && self.queue.pending_reports() > 0))
            && self.readable_armed
        {
            self.readable_armed = false;
            self.events.push(ConnEvent::Readable);
        }
    }

    /// Whether data arrived that the application has not read.
    fn has_unread(&self) -> bool {
        match &self.unordered {
            Some(u) => !u.is_empty() || self.recv.readable() > 0,
            None => self.recv.readable() > 0,
        }
    }

    /// Reads the next received segment (or the part of it that fits) into `buf`.
    pub(crate) fn read_segment(&mut self, buf: &mut [u8]) -> Result<ReceivedSegment, Error> {
        if buf.is_empty() {
            return Err(Error::ReadBufferTooSmall(0));
        }
        let Some(u) = self.unordered.as_mut() else {
            return Err(Error::NotUnordered);
        };
        let before_window = self.rcv_adv.saturating_sub(self.rcv_nxt);
        match u.read(buf) {
            Some(seg) => {
                self.consume_unordered(before_window);
                Ok(seg)
            }
            None => {
                self.check_end_of_stream()?;
                Ok(ReceivedSegment {
                    offset: self.recv.next(),
                    len: 0,
                })
            }
        }
    }

    /// After the application read segments: in-order bytes no unread segment covers count as
    /// consumed, which opens the window as reading in order would.
    fn consume_unordered(&mut self, before_window: u64) {
        let Some(u) = self.unordered.as_ref() else {
            return;
        };
        let to = u.consumed_to(self.recv.read_offset(), self.recv.next());
        let empty = u.is_empty();
        if self.recv.consume_to(to) > 0 {
            self.after_consume(before_window);
        }
        if empty {
            self.readable_armed = true;
        }
    }

    /// `read` in unordered mode: report records, then segment records (see [`crate::utcp`]).
    fn read_records(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        if buf.len() < crate::utcp::MIN_READ_BUFFER {
            return Err(Error::ReadBufferTooSmall(buf.len()));
        }
        let mut n = 0;
        while buf.len() - n >= record::REPORT_LEN {
            let Some(r) = self.queue.poll_report() else {
                break;
            };
            record::encode_report(&r, &mut buf[n..]);
            n += record::REPORT_LEN;
        }
        let before_window = self.rcv_adv.saturating_sub(self.rcv_nxt);
        let mut read_any = false;
        while buf.len() - n > record::SEGMENT_HEADER {
            let Some(u) = self.unordered.as_mut() else {
                break;
            };
            let (head, body) = buf[n..].split_at_mut(record::SEGMENT_HEADER);
            let Some(seg) = u.read(body) else {
                break;
            };
            record::segment_header(seg.offset, seg.len, head);
            n += record::SEGMENT_HEADER + seg.len;
            read_any = true;
        }
        if read_any {
            self.consume_unordered(before_window);
        }
        if n > 0 {
            return Ok(n);
        }
        self.check_end_of_stream()?;
        Ok(0)
    }

    /// The next message report (see [`MessageReport`]).
    pub(crate) fn poll_report(&mut self) -> Option<MessageReport> {
        self.queue.poll_report()
    }

    // ---------------------------------------------------------------- writes

    pub(crate) fn write(&mut self, data: &[u8], tag: WriteTag) -> Result<usize, Error> {
        self.check_writable()?;
        if self.cfg.message_writes {
            return self.write_records(data);
        }
        let n = self.queue.push(self.admit_write(data), tag);
        if n == 0 && !data.is_empty() {
            self.writable_armed = true;
            return Err(Error::WouldBlock);
        }
        if n < data.len() {
            self.writable_armed = true;
        }
        Ok(n)
    }

    /// Queues a whole message (Minion §4.2, Hollywood §4.2; see [`SendQueue`]).
    pub(crate) fn write_message(&mut self, data: &[u8], tag: WriteTag) -> Result<(), Error> {
        self.check_writable()?;
        let r = self.insert_admitted(data, tag, None);
        if r == Err(Error::WouldBlock) {
            self.writable_armed = true;
        }
        self.wake_reader_if_unordered();
        r
    }

    /// `write` with `message_writes`: the longest prefix of whole message records that fits.
    fn write_records(&mut self, data: &[u8]) -> Result<usize, Error> {
        let mut at = 0;
        while at < data.len() {
            let parsed =
                record::decode_message(&data[at..]).map_err(|e| Error::BadRecord(e.what))?;
            let Some((meta, body, len)) = parsed else {
                if at == 0 {
                    return Err(Error::BadRecord("a write must hold whole records"));
                }
                break;
            };
            match self.insert_admitted(body, meta.tag(), meta.lifetime) {
                Ok(()) => at += len,
                Err(Error::WouldBlock) => {
                    self.writable_armed = true;
                    if at == 0 {
                        return Err(Error::WouldBlock);
                    }
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        self.wake_reader_if_unordered();
        Ok(at)
    }

    /// Replaces the congestion controller (any [`CongestionControl`] implementation).
    pub(crate) fn set_congestion_control(&mut self, mut cc: Box<dyn CongestionControl>) {
        cc.set_mss(self.effective_mss() as u64);
        self.cc = cc;
    }

    pub(crate) fn queue_mut(&mut self) -> &mut SendQueue {
        &mut self.queue
    }

    fn check_writable(&self) -> Result<(), Error> {
        if let Some(r) = self.close_reason() {
            return Err(r.error());
        }
        if self.fin_queued {
            return Err(Error::SendShutdown);
        }
        Ok(())
    }

    /// Half-close: FIN after the queued data (RFC 9293 §3.10.4).
    pub(crate) fn shutdown(&mut self, now: Instant) -> Result<(), Error> {
        self.clock = self.clock.max(now);
        if let Some(r) = self.close_reason() {
            return Err(r.error());
        }
        if self.fin_queued {
            return Ok(());
        }
        self.fin_queued = true;
        match self.state {
            // Before ESTABLISHED the FIN is queued and sent after the handshake with the data
            // before it (RFC 9293 §3.10.4 allows queuing until then; FIN-WAIT-1 is entered when
            // the handshake completes).
            State::SynSent | State::SynReceived => {}
            State::Established => self.set_state(State::FinWait1),
            State::CloseWait => self.set_state(State::LastAck),
            _ => {}
        }
        Ok(())
    }

    /// Full close by the application: FIN, and the handle is released. Unread data or data
    /// arriving later makes it an abort with RST (RFC 9293 §3.6.1, RFC 2525 §2.17).
    pub(crate) fn close(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        self.user_closed = true;
        if self.close_reason().is_some() {
            return;
        }
        if self.has_unread() || self.state == State::SynSent {
            self.abort(now);
            return;
        }
        let _ = self.shutdown(now);
        if self.state == State::FinWait2 {
            self.timers
                .set(Timer::FinWait2, later(now, self.cfg.fin_wait2_timeout));
        }
    }

    /// Abort: RST to the peer (unless not yet synchronized with it) and CLOSED
    /// (RFC 9293 §3.10.5).
    pub(crate) fn abort(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        if self.close_reason().is_some() {
            return;
        }
        // RFC 9293 §3.10.5: in SYN-SENT no RST is sent; otherwise send one.
        self.rst_pending = self.state != State::SynSent && self.state != State::TimeWait;
        self.enter_closed(CloseReason::Aborted, false);
    }

    // ---------------------------------------------------------------- state changes

    fn enter_closed(&mut self, reason: CloseReason, notify: bool) {
        tracing::debug!(local = %self.local, remote = %self.remote, from = ?self.state, ?reason, "closed");
        // A connection closes once: a later reason (TIME-WAIT's end) keeps the first.
        let reason = match self.close_reason() {
            Some(first) => first,
            None => {
                if notify {
                    self.events.push(ConnEvent::Closed(reason));
                }
                reason
            }
        };
        self.set_state(State::Closed(reason));
        self.timers = Timers::default();
        self.tlp.pending = false;
        self.ack_now = false;
        self.syn_pending = false;
        self.zwp_pending = false;
        self.keepalive_pending = false;
    }

    fn enter_time_wait(&mut self, now: Instant) {
        tracing::debug!(local = %self.local, remote = %self.remote, from = ?self.state, "TIME-WAIT");
        let first_close = self.close_reason().is_none();
        self.set_state(State::TimeWait);
        // Only the delayed ACK survives into TIME-WAIT; its own timer is set below.
        for t in Timer::ALL {
            if t != Timer::DelayedAck {
                self.timers.cancel(t);
            }
        }
        self.tlp.pending = false;
        if first_close {
            self.events.push(ConnEvent::Closed(CloseReason::Normal));
        }
        self.timers
            .set(Timer::TimeWait, later(now, self.time_wait_duration()));
    }

    fn established(&mut self, now: Instant) {
        tracing::debug!(
            local = %self.local,
            remote = %self.remote,
            negotiated = ?self.negotiated(),
            "established"
        );
        self.set_state(if self.fin_queued {
            State::FinWait1
        } else {
            State::Established
        });
        self.syn_pending = false;
        self.rto_count = 0;
        self.update_keepalive(now);
        self.events.push(ConnEvent::Established);
        if self.queue.free() > 0 {
            self.events.push(ConnEvent::Writable);
        }
    }

    fn update_keepalive(&mut self, now: Instant) {
        self.keepalive_sent = 0;
        let at = match self.cfg.keepalive {
            Some(k) if matches!(self.state, State::Established | State::CloseWait) => {
                Some(later(now, k.idle))
            }
            _ => None,
        };
        self.timers.arm(Timer::Keepalive, at);
    }

    // ---------------------------------------------------------------- timers

    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        let expiry = if self.close_reason().is_none() {
            self.queue.next_expiry()
        } else {
            None
        };
        [expiry, self.timers.next()].into_iter().flatten().min()
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        if self.close_reason().is_none() {
            // Hollywood §4.2: messages whose deadline passed before they were sent are dropped.
            self.queue.expire(now);
        }
        // In `Timer::ALL`'s order; a handler may cancel a later timer (a loss probe replaces
        // the retransmission timeout) or end the connection.
        for timer in Timer::ALL {
            if !self.timers.take_expired(timer, now) {
                continue;
            }
            match timer {
                Timer::TimeWait => {
                    self.enter_closed(CloseReason::Normal, false);
                    return;
                }
                Timer::FinWait2 => {
                    if self.state == State::FinWait2 {
                        self.enter_closed(CloseReason::Normal, true);
                        return;
                    }
                }
                Timer::DelayedAck => self.ack_now = true,
                Timer::Reordering => {
                    // RACK's reordering timer (RFC 8985 §6.2): segments sent before the last
                    // delivered one whose time has come are lost.
                    if self.rack_enabled() && self.state.is_synchronized() && self.rack_detect(now)
                    {
                        self.maybe_enter_recovery(now);
                    }
                }
                Timer::LossProbe => {
                    if self.tlp_may_probe() {
                        // The probe goes out next; the RTO restarts when it does (RFC 8985 §7.3).
                        self.tlp.pending = true;
                        self.timers.cancel(Timer::Retransmission);
                    }
                }
                Timer::Retransmission => {
                    self.counters.rto_wait += now.saturating_duration_since(self.rto_armed_at);
                    self.on_rto(now);
                }
                Timer::Persist => self.on_persist(now),
                Timer::Keepalive => self.on_keepalive(now),
                Timer::Pacing => {}
            }
        }
    }

    fn on_rto(&mut self, now: Instant) {
        match self.state {
            State::SynSent | State::SynReceived => {
                let limit = if self.state == State::SynSent {
                    self.cfg.syn_retries
                } else {
                    self.cfg.synack_retries
                };
                if self.rto_count >= limit {
                    self.enter_closed(CloseReason::TimedOut, true);
                    return;
                }
                if self.state == State::SynReceived {
                    self.fo_synack_again(now, self.rto_count == 0);
                }
                self.rto_count += 1;
                self.counters.rto_timeouts += 1;
                self.rtt.back_off();
                self.syn_pending = true;
            }
            State::Closed(_) | State::TimeWait => {}
            _ => {
                if self.flight() == 0 {
                    return;
                }
                let user_timeout_hit = match (self.cfg.user_timeout, self.unacked_since) {
                    (Some(limit), Some(since)) => now.saturating_duration_since(since) >= limit,
                    _ => false,
                };
                if self.rto_count >= self.cfg.max_retransmissions || user_timeout_hit {
                    self.enter_closed(CloseReason::TimedOut, true);
                    return;
                }
                tracing::debug!(
                    local = %self.local,
                    remote = %self.remote,
                    count = self.rto_count + 1,
                    rto = ?self.rtt.current_rto(),
                    flight = self.flight(),
                    "retransmission timeout"
                );
                // RFC 5681 §3.1: ssthresh is reduced only on the first timeout of a series.
                if self.rto_count == 0 {
                    // Keep what the timeout takes away, to give it back if the timeout proves
                    // spurious (RFC 3522 / RFC 3708 detection, RFC 4015 response). An open
                    // retransmitted loss probe is the episode's first retransmission.
                    let probe = self.tlp.end_seq.and(self.tlp.probe);
                    self.rto_undo = Some(RtoUndo {
                        cc: self.cc.snapshot(),
                        retransmit_ts: self.ts_now(now),
                        probe_open: probe.is_some(),
                        una: self.snd_una,
                        first_ack_pending: true,
                        retransmitted: probe.into_iter().collect(),
                        overflow: false,
                    });
                    self.cc.on_rto(now, self.flight());
                    if let Some(r) = self.resume.as_mut() {
                        let action = r.on_rto();
                        self.apply_resume(action);
                    }
                }
                // A timeout's response stands: the queue bound gives nothing back over it (and
                // no verdict until the timeout's recovery is over).
                self.delay_undo = None;
                self.rto_count += 1;
                self.counters.rto_timeouts += 1;
                // RFC 6298 §5.5: back off the timer.
                self.rtt.back_off();
                self.trace(TraceEvent::Rto {
                    backoff: self.rto_count,
                });
                self.sb.mark_all_lost();
                self.detect_mtu_black_hole();
                self.recovery = None;
                self.reno_inflation = 0;
                self.dupacks = 0;
                self.plain_dupacks = 0;
                // RFC 6582 §4 / RFC 6675 §5.1: no fast recovery for data sent before the RTO.
                self.recover = self.snd_nxt;
                self.rto_recovery = true;
                self.force_retransmit = true;
                // RFC 8985 §7.4: an RTO ends any loss probe episode; every outstanding segment
                // is already deemed lost, so RACK has nothing to wait for.
                self.tlp = Tlp {
                    sampled: self.tlp.sampled,
                    ..Tlp::default()
                };
                self.timers.cancel(Timer::Reordering);
                // A zero-window probe byte is now plain retransmittable data.
                self.zwp_seq = None;
            }
        }
        // RFC 6298 §5.6: restart the timer with the backed-off RTO on (re)transmission; armed
        // when the segment goes out.
    }

    fn on_keepalive(&mut self, now: Instant) {
        let Some(k) = self.cfg.keepalive else { return };
        if !matches!(self.state, State::Established | State::CloseWait) {
            return;
        }
        if self.flight() > 0 || !self.queue.is_empty() {
            // Not idle: retransmission handles liveness.
            self.timers.set(Timer::Keepalive, later(now, k.idle));
            return;
        }
        if self.keepalive_sent >= k.probes {
            // RFC 9293 §3.8.4: connection dead; Linux sends a RST on giving up.
            self.rst_pending = true;
            self.enter_closed(CloseReason::TimedOut, true);
            return;
        }
        self.keepalive_sent += 1;
        self.keepalive_pending = true;
        self.timers.set(Timer::Keepalive, later(now, k.interval));
    }

    /// The persist timer fired: the next zero-window probe goes out, unless the probes have
    /// gone unanswered for the user timeout. Only unanswered probes count: Linux (5.11 and
    /// later) counts the whole time the window stays closed against `TCP_USER_TIMEOUT`, which
    /// also ends a connection whose peer is alive but does not read for that long.
    fn on_persist(&mut self, now: Instant) {
        if let (Some(limit), Some(since)) = (self.cfg.user_timeout, self.probe_unanswered_since)
            && now.saturating_duration_since(since) >= limit
        {
            self.enter_closed(CloseReason::TimedOut, true);
            return;
        }
        self.zwp_pending = true;
    }

    /// Arms or disarms the retransmission and persist timers after sending or ACK processing.
    fn update_send_timers(&mut self, now: Instant) {
        if !self.state.is_synchronized() {
            return;
        }
        let usable = self.send_right_edge().saturating_sub(self.snd_nxt);
        let only_probe_out = self.flight() == 0 || self.zwp_seq == Some(self.snd_una);
        let has_unsent =
            SndPos::of_offset(self.queue.end()) > self.snd_nxt || self.zwp_seq.is_some();
        // A zero window, or a window too small for sender SWS avoidance with nothing in flight
        // (no ACK will come to reopen it), is served by the persist / override timer.
        let blocked = self.snd_wnd == 0 || usable < self.effective_mss() as u64;
        if blocked && only_probe_out && has_unsent && self.fin_seq.is_none() {
            // Persist timer (RFC 9293 §3.8.6.1): first probe after one RTO, then exponential.
            self.timers.cancel(Timer::Retransmission);
            self.timers.cancel(Timer::LossProbe);
            if !self.timers.is_armed(Timer::Persist) && !self.zwp_pending {
                let shift = self.persist_backoff.min(16);
                let mut d = self
                    .rtt
                    .current_rto()
                    .saturating_mul(1 << shift)
                    .min(self.cfg.max_rto);
                if let Some(limit) = self.cfg.user_timeout {
                    // Probes often enough that a peer gone silent is found about one user
                    // timeout after its first unanswered probe, not a back-off later.
                    d = d.min(limit / 4);
                }
                self.timers.set(Timer::Persist, later(now, d));
            }
            return;
        }
        self.timers.cancel(Timer::Persist);
        self.zwp_pending = false;
        if self.flight() == 0 {
            self.timers.cancel(Timer::Retransmission);
        } else if !self.timers.is_armed(Timer::Retransmission) && !self.tlp.pending {
            self.arm_rto(now);
        }
        // The loss probe timer runs while a probe could help (RFC 8985 §7.2).
        if self.tlp_may_probe() && !self.tlp.pending {
            if !self.timers.is_armed(Timer::LossProbe) {
                self.timers.set(Timer::LossProbe, self.pto_deadline(now));
            }
        } else {
            self.timers.cancel(Timer::LossProbe);
        }
    }

    /// Whether a tail loss probe may be sent (RFC 8985 §7.2, §7.3): SACK and RACK in use, data
    /// outstanding, no recovery under way (fast recovery, RTO recovery, or SACKed data that
    /// RACK is already watching), no probe episode open, and an RTT sample since the last probe.
    fn tlp_may_probe(&self) -> bool {
        self.rack_enabled()
            && self.state.is_synchronized()
            && self.state != State::TimeWait
            && self.flight() > 0
            && self.recovery.is_none()
            && !self.rto_recovery
            && self.sb.sacked_bytes() == 0
            && self.tlp.end_seq.is_none()
            && self.tlp.sampled
            && self.snd_wnd > 0
            && self.zwp_seq.is_none()
    }

    /// When the probe timeout expires (RFC 8985 §7.2): two SRTTs, plus the peer's worst-case
    /// delayed ACK when only one segment is out (its ACK may be delayed), never after the RTO.
    fn pto_deadline(&self, now: Instant) -> Instant {
        let pto = match self.rtt.srtt() {
            Some(srtt) => {
                let extra = if self.flight() <= self.effective_mss() as u64 {
                    WC_DEL_ACK
                } else {
                    PTO_SLACK
                };
                srtt.saturating_mul(2).saturating_add(extra)
            }
            None => Duration::from_secs(1),
        };
        let rto_at = self
            .timers
            .get(Timer::Retransmission)
            .unwrap_or_else(|| later(now, self.rtt.current_rto()));
        later(now, pto).min(rto_at)
    }

    fn arm_rto(&mut self, now: Instant) {
        let mut at = later(now, self.rtt.current_rto());
        if let (Some(limit), Some(since)) = (self.cfg.user_timeout, self.unacked_since)
            && self.state.is_synchronized()
        {
            at = at.min(later(since, limit).max(now));
        }
        self.timers.set(Timer::Retransmission, at);
        self.rto_armed_at = now;
    }

    // ---------------------------------------------------------------- input

    /// Processes a segment in SYN-SENT (RFC 9293 §3.10.7.3).
    fn on_segment_syn_sent(&mut self, now: Instant, seg: &Segment<'_>) -> Result<(), DropReason> {
        let flags = seg.flags;
        // First: the ACK bit.
        let mut ack_ok = false;
        if flags.ack() {
            let ack = self.seg_ack(seg);
            // SEG.ACK =< ISS or SEG.ACK > SND.NXT: unacceptable.
            if ack <= Pos::ZERO || ack > self.snd_nxt {
                if !flags.rst() {
                    self.rst_reply_pending = Some(seg.ack);
                }
                return Err(DropReason::BadAck);
            }
            ack_ok = true;
        }
        // Second: the RST bit (acceptable only with an acceptable ACK; RFC 5961 §3.2 applies
        // the same rule).
        if flags.rst() {
            if ack_ok {
                self.enter_closed(CloseReason::Refused, true);
                return Ok(());
            }
            return Err(DropReason::RstIgnored);
        }
        // Fourth: the SYN bit.
        if !flags.syn() {
            return Err(DropReason::InvalidForState);
        }
        let syn = PeerSyn {
            irs: RcvSeq::new(seg.seq),
            mss: seg.options.mss,
            window_scale: seg.options.window_scale,
            sack_permitted: seg.options.sack_permitted,
            timestamps: seg.options.timestamps,
            window: seg.window,
        };
        // Options we did not offer cannot be used even if the peer sends them.
        self.accept_peer_syn(now, &syn);
        // The window in our SYN applies from RCV.NXT on.
        self.rcv_adv = self.rcv_nxt + self.syn_window() as u64;
        if ack_ok {
            // Our SYN is acknowledged: ESTABLISHED (RFC 9293 §3.10.7.3), with what it
            // acknowledged of Fast Open data on the SYN.
            let ack = self.seg_ack(seg);
            self.snd_una = self.fast_open_syn_ack(seg, ack);
            self.sb.ack(SndPos::AFTER_SYN, &mut Delivered::default());
            // The SYN's round trip: timed exactly if it was sent once, else from the echoed
            // timestamp, which names the transmission (RFC 7323 §4.2) but only to the
            // millisecond.
            let echo = seg
                .options
                .timestamps
                .filter(|_| self.ts_ok)
                .map(|(_, tsecr)| self.ts_now(now).wrapping_sub(tsecr))
                .filter(|&ms| (ms as i32) >= 0);
            if self.rto_count == 0
                && let Some(sent) = self.syn_sent_at
            {
                self.rtt.on_sample(now.saturating_duration_since(sent));
            } else if let Some(ms) = echo {
                self.rtt
                    .on_coarse_sample(Duration::from_millis(u64::from(ms)));
            } else if self.rto_count > 0 && self.rtt.srtt().is_none() {
                // RFC 6298 §5.7: after a SYN timeout, start data transfer with RTO = 3 s.
                self.rtt = RttEstimator::new(
                    Duration::from_secs(3).max(self.cfg.initial_rto),
                    self.cfg.min_rto,
                    self.cfg.max_rto,
                );
            }
            self.timers.cancel(Timer::Retransmission);
            self.snd_wl1 = Pos::ZERO;
            self.snd_wl2 = self.snd_una;
            self.established(now);
            self.ack_now = true;
            // Data in the SYN-ACK (rare) continues at "sixth, check the URG bit".
            if !seg.payload.is_empty() || flags.fin() {
                self.process_text(now, RcvPos::AFTER_SYN, seg.payload, flags.fin());
            }
            Ok(())
        } else {
            // Simultaneous open (RFC 9293 §3.10.7.3, figure 8): SYN-RECEIVED, send SYN,ACK
            // with our original ISS. Data on our SYN was not acknowledged: it goes again after
            // the handshake.
            if self.fo_client.take().is_some_and(|fo| fo.syn_data > 0) {
                self.fo_notes.push(FastOpenNote::SynDataNotAcked);
            }
            self.snd_nxt = SndPos::AFTER_SYN;
            self.set_state(State::SynReceived);
            self.syn_pending = true;
            self.timers.cancel(Timer::Retransmission);
            Ok(())
        }
    }

    /// A duplicate ACK overtaken by a later segment (Linux tcp_disordered_ack): a pure ACK at
    /// RCV.NXT that acknowledges nothing new and would not update the window, stamped less
    /// than an RTO before TS.Recent. PAWS guards against old duplicates of data; dropping
    /// such an ACK only loses a duplicate-ACK signal (found by the simulator, seed 27749: with
    /// jitter, PAWS dropped a third of the duplicate ACKs a NewReno sender needed).
    fn disordered_ack(&self, seg: &Segment<'_>, seq: RcvPos, tsval: u32) -> bool {
        let pure = seg.flags.ack()
            && seg.payload.is_empty()
            && !seg.flags.syn()
            && !seg.flags.fin()
            && seq == self.rcv_nxt;
        let duplicate = self.seg_ack(seg) == self.snd_una;
        let no_window_update = ((seg.window as u64) << self.snd_wscale) <= self.snd_wnd;
        let age_ms = self.ts_recent.wrapping_sub(tsval);
        let recent = u128::from(age_ms) <= self.rtt.current_rto().as_millis();
        pure && duplicate && no_window_update && recent
    }

    /// RFC 6191: in TIME-WAIT, a new SYN may reopen the 4-tuple if its timestamp is newer
    /// than TS.Recent, or (without timestamps) its sequence number is beyond RCV.NXT.
    pub(crate) fn time_wait_accepts_syn(&self, seg: &Segment<'_>) -> bool {
        match (self.ts_ok && self.ts_recent_valid, seg.options.timestamps) {
            (true, Some((tsval, _))) => ts_before(self.ts_recent, tsval),
            (true, None) => false,
            (false, _) => self.seg_seq(seg) > self.rcv_nxt,
        }
    }

    /// Drops a TIME-WAIT connection whose 4-tuple a new SYN reuses.
    pub(crate) fn force_closed(&mut self) {
        self.enter_closed(CloseReason::Normal, false);
    }

    /// Sets the send window from the ACK that completed a SYN-cookie handshake.
    pub(crate) fn set_window_from_ack(&mut self, seg: &Segment<'_>) {
        self.snd_wnd = (seg.window as u64) << self.snd_wscale;
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = RcvPos::AFTER_SYN;
        self.snd_wl2 = SndPos::AFTER_SYN;
    }

    /// Processes an incoming segment for this connection.
    pub(crate) fn handle_segment(
        &mut self,
        now: Instant,
        seg: &Segment<'_>,
    ) -> Result<(), DropReason> {
        self.counters.packets_received += 1;
        self.clock = self.clock.max(now);
        self.queue.resolve(now);
        match self.state {
            State::Closed(_) => return Err(DropReason::InvalidForState),
            State::SynSent => return self.on_segment_syn_sent(now, seg),
            _ => {}
        }
        let flags = seg.flags;
        // A retransmitted SYN in SYN-RECEIVED: our SYN-ACK was lost, send it again.
        if self.state == State::SynReceived
            && flags.syn()
            && !flags.ack()
            && !flags.rst()
            && RcvSeq::new(seg.seq) == self.irs
        {
            self.syn_pending = true;
            self.fo_synack_again(now, false);
            return Ok(());
        }
        // Simultaneous open (RFC 9293 §3.10.7.3 figure 8): the peer's SYN-ACK arrives in
        // SYN-RECEIVED. Its SYN is already counted in RCV.NXT, so the sequence check would
        // reject it; accept it as the ACK of our SYN, as Linux does.
        if self.state == State::SynReceived
            && !self.passive
            && flags.syn()
            && flags.ack()
            && !flags.rst()
            && RcvSeq::new(seg.seq) == self.irs
            && self.seg_ack(seg) == self.snd_nxt
        {
            self.snd_una = SndPos::AFTER_SYN;
            self.sb.ack(SndPos::AFTER_SYN, &mut Delivered::default());
            self.timers.cancel(Timer::Retransmission);
            self.snd_wnd = (seg.window as u64) << self.snd_wscale;
            self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
            self.snd_wl1 = Pos::ZERO;
            self.snd_wl2 = SndPos::AFTER_SYN;
            self.established(now);
            self.ack_now = true;
            return Ok(());
        }
        // RFC 7323 §3.2: with timestamps negotiated, non-RST segments must carry one.
        if self.ts_ok
            && seg.options.timestamps.is_none()
            && !flags.rst()
            && self.cfg.drop_segments_without_timestamps
        {
            return Err(DropReason::MissingTimestamp);
        }
        let seq = self.seg_seq(seg);
        let seg_len = u64::from(seg.seg_len());
        // PAWS (RFC 7323 §5.3 R1), before the sequence check. A segment stamped one tick
        // before TS.Recent is reordering within the peer's clock granularity, not an old
        // duplicate (Linux TCP_PAWS_WINDOW; found by the simulator, seeds 443 and 1179: with
        // jitter, PAWS dropped segments and ACKs sent a millisecond apart).
        if self.ts_ok
            && !flags.rst()
            && let Some((tsval, _)) = seg.options.timestamps
            && self.ts_recent_valid
            && ts_before(tsval.wrapping_add(PAWS_WINDOW), self.ts_recent)
            && !self.disordered_ack(seg, seq, tsval)
        {
            if now.saturating_duration_since(self.ts_recent_age) > PAWS_IDLE {
                // R1 exception (RFC 7323 §5.5): TS.Recent is stale, forget it.
                self.ts_recent_valid = false;
            } else {
                self.counters.paws_rejected += 1;
                self.send_invalid_ack(now);
                return Err(DropReason::Paws);
            }
        }
        // First check: sequence number acceptability (RFC 9293 §3.10.7.4 table).
        let rcv_nxt = self.rcv_nxt;
        let wnd = self.rcv_adv.saturating_sub(self.rcv_nxt);
        let in_window = |s: RcvPos| rcv_nxt <= s && s < rcv_nxt + wnd;
        let acceptable = match (seg_len == 0, wnd == 0) {
            (true, true) => seq == rcv_nxt,
            // A pure ACK exactly at the right edge comes from a sender that filled our window;
            // accepting it (as Linux does) keeps its acknowledgments of our data flowing.
            (true, false) => in_window(seq) || seq == rcv_nxt + wnd,
            (false, true) => false,
            (false, false) => in_window(seq) || in_window(seq + seg_len - 1u64),
        };
        let mut ack_only = false;
        if !acceptable
            && self.state == State::TimeWait
            && flags.fin()
            && !flags.rst()
            && seq + seg_len == rcv_nxt
        {
            // The peer retransmitted its FIN: our last ACK was lost. Acknowledge it again and
            // restart the 2 MSL timeout (RFC 9293 §3.10.7.4, eighth check, TIME-WAIT).
            self.ack_now = true;
            self.timers
                .set(Timer::TimeWait, later(now, self.time_wait_duration()));
            return Ok(());
        }
        if !acceptable {
            if flags.rst() {
                // RFC 5961 §3.2: out-of-window RST is silently dropped.
                return Err(DropReason::RstIgnored);
            }
            if flags.syn() {
                if self.state == State::SynReceived && self.passive {
                    // RFC 9293 §3.10.7.4 fourth check: passive SYN-RECEIVED returns to LISTEN.
                    self.enter_closed(CloseReason::Reset, false);
                    return Err(DropReason::InvalidForState);
                }
                // RFC 5961 §4.2: a SYN gets a challenge ACK whatever its sequence number.
                self.send_challenge_ack(now);
                return Err(DropReason::SynChallenged);
            }
            // RFC 9293 §3.10.7.4: with a zero window, still process valid ACKs (so that a
            // sender's window probes tell us about the peer's ACKs and window).
            if wnd == 0 && seq == rcv_nxt && flags.ack() && !flags.syn() {
                ack_only = true;
                self.ack_now = true;
            } else {
                let end = seq + seg_len;
                if !seg.payload.is_empty() && end <= rcv_nxt && !seq.is_negative() {
                    // A duplicate of data we hold: ACK at once with a D-SACK block (RFC 2883
                    // §4), not rate-limited since data segments do not form ACK loops.
                    let data_end = end - u64::from(flags.fin());
                    let data_start = data_end - seg.payload.len() as u64;
                    self.dsack = Some((data_start.max(RcvPos::AFTER_SYN), data_end));
                    self.ack_now = true;
                    // uTCP hands retransmissions over too: they may carry replacements
                    // (Hollywood §4.2; see crate::utcp).
                    if self.unordered.is_some()
                        && !self.peer_fin_processed
                        && matches!(
                            self.state,
                            State::Established | State::FinWait1 | State::FinWait2
                        )
                    {
                        let skip = RcvPos::AFTER_SYN.saturating_sub(data_start) as usize;
                        if let Some(bytes) = seg.payload.get(skip..) {
                            let offset = data_start.max(RcvPos::AFTER_SYN).offset();
                            self.deliver_unordered(offset, bytes, &[]);
                        }
                    }
                } else if !seg.payload.is_empty() {
                    self.ack_now = true;
                } else {
                    self.send_invalid_ack(now);
                }
                return Err(DropReason::OutOfWindow);
            }
        }
        // Any acceptable segment proves the peer alive (keepalive, RFC 9293 §3.8.4).
        self.update_keepalive(now);
        // Second check: RST (RFC 5961 §3.2 on top of RFC 9293).
        if flags.rst() {
            if seq == rcv_nxt {
                match self.state {
                    State::SynReceived if self.passive => {
                        // RFC 9293: return to LISTEN; the endpoint forgets the half-open TCB.
                        // A Fast Open connection may already be in the application's hands.
                        self.enter_closed(CloseReason::Reset, self.fo_passive);
                    }
                    State::SynReceived => self.enter_closed(CloseReason::Refused, true),
                    State::Closing | State::LastAck | State::TimeWait => {
                        self.enter_closed(CloseReason::Normal, self.close_reason().is_none())
                    }
                    _ => self.enter_closed(CloseReason::Reset, true),
                }
                return Ok(());
            }
            self.send_challenge_ack(now);
            return Err(DropReason::RstChallenged);
        }
        // Fourth check: SYN in a synchronized state (RFC 5961 §4.2): challenge ACK.
        if flags.syn() {
            if self.state == State::SynReceived && self.passive {
                // RFC 9293 §3.10.7.4: passive SYN-RECEIVED returns to LISTEN.
                self.enter_closed(CloseReason::Reset, false);
                return Ok(());
            }
            self.send_challenge_ack(now);
            return Err(DropReason::SynChallenged);
        }
        // Fifth check: the ACK field.
        if !flags.ack() {
            return Err(DropReason::NoAck);
        }
        // TS.Recent update (RFC 7323 §4.3): SEG.TSval >= TS.Recent and SEG.SEQ =< Last.ACK.sent.
        if self.ts_ok
            && let Some((tsval, _)) = seg.options.timestamps
            && seq <= self.last_ack_sent
            && (!self.ts_recent_valid || !ts_before(tsval, self.ts_recent))
        {
            self.ts_recent = tsval;
            self.ts_recent_valid = true;
            self.ts_recent_age = now;
        }
        let ack = self.seg_ack(seg);
        let completes_handshake = self.state == State::SynReceived;
        if completes_handshake {
            if ack > self.snd_una && ack <= self.snd_nxt {
                self.snd_una = SndPos::AFTER_SYN;
                // Data sent in SYN-RECEIVED (RFC 7413 §4.2.2) that this ACK covers too is
                // acknowledged below (`process_ack`). If the SYN-ACK went more than once, the
                // ACK may answer a retransmission sent after that data: Karn's rule (RFC 6298
                // §3) allows no sample from it, so the scoreboard forgets it here unsampled.
                let upto = if self.fo_passive && !self.fo_early_send {
                    ack
                } else {
                    SndPos::AFTER_SYN
                };
                self.sb.ack(upto, &mut Delivered::default());
                if self.rto_count == 0
                    && let Some(sent) = self.syn_sent_at
                {
                    self.rtt.on_sample(now.saturating_duration_since(sent));
                }
                self.timers.cancel(Timer::Retransmission);
                self.snd_wnd = (seg.window as u64) << self.snd_wscale;
                self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
                self.snd_wl1 = seq;
                self.snd_wl2 = ack;
                self.fo_early_send = false;
                if self.snd_nxt > ack {
                    self.unacked_since = Some(now);
                }
                self.established(now);
            } else {
                // <SEQ=SEG.ACK><CTL=RST>
                self.rst_reply_pending = Some(seg.ack);
                return Err(DropReason::BadAck);
            }
        }
        // RFC 5961 §5.2: acceptable ACKs lie in [SND.UNA - MAX.SND.WND, SND.NXT].
        if ack > self.snd_nxt {
            // RFC 9293 §3.10.7.4: ACK for data not yet sent: send an ACK, drop the segment.
            self.send_invalid_ack(now);
            return Err(DropReason::BadAck);
        }
        if ack < self.snd_una - self.max_snd_wnd.max(1) {
            self.send_challenge_ack(now);
            return Err(DropReason::BadAck);
        }
        let ack = ack.max(Pos::ZERO);
        self.process_ack(now, seg, seq.max(Pos::ZERO), ack, completes_handshake);
        if self.state.is_closed() {
            return Ok(());
        }
        // Sixth/seventh: URG is ignored (RFC 6093 recommends against its use; data is inline).
        if ack_only {
            // Zero receive window: the ACK was used, the text is dropped.
            return Err(DropReason::OutOfWindow);
        }
        let payload_start = seq + u64::from(flags.syn());
        if !seg.payload.is_empty() || flags.fin() {
            match self.state {
                State::Established | State::FinWait1 | State::FinWait2 => {
                    if self.user_closed && !seg.payload.is_empty() {
                        let end = payload_start + seg.payload.len();
                        if end > self.rcv_nxt {
                            // Data after close(): nobody will read it (RFC 9293 §3.6.1).
                            self.rst_pending = true;
                            self.enter_closed(CloseReason::Aborted, false);
                            return Ok(());
                        }
                    }
                    if !payload_start.is_negative()
                        && self.process_text(now, payload_start, seg.payload, flags.fin())
                    {
                        return Err(DropReason::OutOfOrderQueueFull);
                    }
                }
                State::TimeWait if flags.fin() => {
                    // Retransmitted FIN: acknowledge it and restart the 2MSL timeout.
                    self.ack_now = true;
                    self.timers
                        .set(Timer::TimeWait, later(now, self.time_wait_duration()));
                }
                _ => {
                    // CLOSE-WAIT, CLOSING, LAST-ACK: the peer already sent FIN; ignore text,
                    // but acknowledge retransmitted FINs.
                    if flags.fin() {
                        self.ack_now = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// Processes the ACK field and window of a segment (RFC 9293 §3.10.7.4 fifth check) with
    /// SACK (RFC 2018, RFC 2883), RTT (RFC 6298, RFC 7323 §4), and loss recovery (RFC 6675,
    /// RFC 6582). `handshake`: the ACK completed the handshake (it acknowledged our SYN, so
    /// it is no duplicate even when data sent in SYN-RECEIVED is outstanding, RFC 5681 §2).
    fn process_ack(
        &mut self,
        now: Instant,
        seg: &Segment<'_>,
        seq: RcvPos,
        ack: SndPos,
        handshake: bool,
    ) {
        // The peer answers (a zero-window probe, among others).
        self.probe_unanswered_since = None;
        let flight_before = self.flight();
        let advancing = ack > self.snd_una;
        let window = (seg.window as u64) << self.snd_wscale;
        let mut window_changed = false;
        // Window update (SND.WL1 < SEG.SEQ or (SND.WL1 = SEG.SEQ and SND.WL2 =< SEG.ACK)).
        if self.snd_wl1 < seq || (self.snd_wl1 == seq && self.snd_wl2 <= ack) {
            window_changed = window != self.snd_wnd;
            // The persist back-off starts afresh whenever the window closes or reopens, so the
            // first zero-window probe waits one RTO (RFC 9293 §3.8.6.1) even after sender SWS
            // override probes of a small window.
            if (window > 0) != (self.snd_wnd > 0) {
                self.persist_backoff = 0;
            }
            self.snd_wnd = window;
            self.snd_wl1 = seq;
            self.snd_wl2 = ack;
            self.max_snd_wnd = self.max_snd_wnd.max(window);
        }
        // SACK blocks.
        let mut new_sack = 0u64;
        let mut dsack = None;
        let mut delivered = Delivered::default();
        if self.sack_ok && seg.options.sack_block_count > 0 {
            (new_sack, dsack) = self.process_sack(seg, ack, &mut delivered);
        }
        let mss = self.effective_mss() as u64;
        let newly_acked_before = ack.saturating_sub(self.snd_una);
        let mut sampled = false;
        // Bytes this ACK shows delivered for the first time (a range SACKed earlier and now
        // cumulatively acknowledged counts once): what the path carried, for the path cache
        // and Careful Resume's PipeSize.
        let mut newly_delivered = new_sack;
        if ack > self.snd_una {
            let acked_total = ack - self.snd_una;
            let res = self.sb.ack(ack, &mut delivered);
            newly_delivered += res.newly_acked;
            // Stream bytes acknowledged (the FIN is not a stream byte).
            let data_upto = match self.fin_seq {
                Some(f) if ack > f => f.offset(),
                _ => ack.offset(),
            };
            self.queue.ack(data_upto);
            self.last_ack_advance = ack - self.snd_una;
            self.last_ack_segments = res.segments;
            self.snd_una = ack;
            if self.zwp_seq.is_some_and(|z| z < ack) {
                self.zwp_seq = None;
            }
            // RTT sample: from an unambiguous segment send time (Karn's rule), otherwise from
            // the echoed timestamp, which identifies the transmission (RFC 7323 §4.2).
            let sample = match res.rtt_sent_at {
                Some(sent) => Some((now.saturating_duration_since(sent), true)),
                // The echo must refer to a transmission this ACK covers: an echo older than all
                // of them (the receiver did not update TS.Recent, e.g. for a duplicate) would
                // measure the time the data spent waiting, not a round trip.
                None => match (seg.options.timestamps, res.earliest_sent_at) {
                    (Some((_, tsecr)), Some(earliest)) if self.ts_ok && tsecr != 0 => {
                        let ms = self.ts_now(now).wrapping_sub(tsecr);
                        let echo_fresh = (tsecr.wrapping_sub(self.ts_now(earliest)) as i32) >= 0;
                        ((ms as i32) >= 0 && echo_fresh)
                            .then(|| (Duration::from_millis(ms as u64), false))
                    }
                    _ => None,
                },
            };
            if let Some((r, _)) = sample {
                self.delay_sample(now, r, seg.options.timestamps);
            }
            match sample {
                Some((r, true)) => self.rtt.on_sample(r),
                // Millisecond timestamps would put min_RTT at 0 on a sub-millisecond path,
                // and RACK's reordering window with it (found by the simulator, seed 1179).
                Some((r, false)) => self.rtt.on_coarse_sample(r),
                None => {}
            }
            sampled |= sample.is_some();
            self.dupacks = 0;
            self.plain_dupacks = 0;
            self.rto_count = 0;
            self.unacked_since = (self.snd_nxt > self.snd_una).then_some(now);
            // RFC 6298 §5.2/5.3: stop the timer when all is acknowledged, else restart it; the
            // loss probe timer restarts with it (RFC 8985 §7.2). In NewReno recovery only the
            // first partial ACK restarts it (RFC 6582 §3.2 step 5, the "Impatient" variant of
            // §4.3): NewReno repairs one hole per round trip, and when a window lost many
            // segments the RTO's go-back-N is faster than that crawl (found by the simulator,
            // seeds 1775 and 4079: hundreds of queue drops in one window without SACK).
            let crawling = !self.sack_ok
                && self
                    .recovery
                    .is_some_and(|rec| ack < rec.point && rec.partial_acks > 0);
            if !crawling {
                self.timers.cancel(Timer::Retransmission);
            }
            self.timers.cancel(Timer::LossProbe);
            if self.rto_recovery && ack >= self.recover {
                self.rto_recovery = false;
            }
            let cwnd_limited = {
                let f = self.max_flight_recent.max(flight_before);
                let cwnd = self.cc.cwnd();
                f + mss >= cwnd || (self.cc.cwnd() < self.cc.ssthresh() && 2 * f >= cwnd)
            };
            self.max_flight_recent = self.flight();
            match self.recovery {
                Some(rec) if ack >= rec.point => {
                    // Full acknowledgment: recovery is over (RFC 6582 §3.2 step 3, RFC 6675 §5).
                    self.recovery = None;
                    self.reno_inflation = 0;
                    self.cc.on_recovery_exit(now);
                    // RFC 8985 §6.2 step 3: a widened reordering window lasts 16 recoveries.
                    if self.rack.reo_wnd_persist > 0 {
                        self.rack.reo_wnd_persist -= 1;
                        if self.rack.reo_wnd_persist == 0 {
                            self.rack.reo_wnd_mult = 1;
                        }
                    }
                    self.trace(TraceEvent::RecoveryEnd);
                }
                Some(ref mut rec) => {
                    rec.partial_acks += 1;
                    if !self.sack_ok {
                        // Partial ACK (RFC 6582 §3.2 step 5): retransmit the next unacknowledged
                        // segment, deflate by the amount acknowledged, add back one SMSS.
                        self.sb.mark_head_lost();
                        self.force_retransmit = true;
                        self.reno_inflation -= acked_total as i64;
                        if acked_total >= mss {
                            self.reno_inflation += mss as i64;
                        }
                    }
                }
                None => {
                    tracing::trace!(
                        local = %self.local,
                        acked = acked_total,
                        cwnd = self.cc.cwnd(),
                        ssthresh = self.cc.ssthresh(),
                        "ack"
                    );
                    // Bytes (RFC 3465), each segment acknowledged counting as at least the
                    // charge floor it took in the window.
                    self.cc.on_ack(&AckEvent {
                        now,
                        acked: acked_total.max(res.whole_segments * self.segment_charge_floor()),
                        cwnd_limited,
                        srtt: self.rtt.srtt(),
                        min_rtt: self.rtt.min_rtt(),
                    });
                }
            }
            self.bound_queue_delay(now, mss, acked_total);
            // Wake a blocked writer once a third of the send buffer is free (Linux's
            // sk_stream_min_wspace), not on every ACK: a writer woken for each few freed bytes
            // writes them at once and, without Nagle, sends them as tiny segments (found by the
            // simulator, seed 1064).
            let wake_at = (self.cfg.send_buffer / 3).max(1);
            // Under the memory budget (crate::mem), room for half the floor will do.
            if self.writable_armed
                && self.queue.free() >= wake_at
                && self.send_room() >= wake_at.min(self.mem.floor() / 2).max(1)
                && self.fin_seq.is_none()
            {
                self.writable_armed = false;
                self.events.push(ConnEvent::Writable);
            }
            // Our FIN acknowledged?
            if let Some(f) = self.fin_seq
                && ack > f
            {
                match self.state {
                    State::FinWait1 => {
                        self.set_state(State::FinWait2);
                        if self.user_closed {
                            self.timers
                                .set(Timer::FinWait2, later(now, self.cfg.fin_wait2_timeout));
                        }
                    }
                    State::Closing => self.enter_time_wait(now),
                    State::LastAck => self.enter_closed(CloseReason::Normal, true),
                    _ => {}
                }
            }
        } else if ack == self.snd_una
            && !handshake
            && flight_before > 0
            && seg.payload.is_empty()
            && !seg.flags.syn()
            && !seg.flags.fin()
            && (!window_changed || new_sack > 0)
            && self.snd_wnd > 0
            && self.zwp_seq.is_none()
        {
            // (Answers to zero-window probes are not loss signals.)
            // Duplicate ACK (RFC 5681 §2; with SACK, RFC 6675 §2 counts ACKs with new SACK info).
            self.counters.dup_acks += 1;
            if !self.sack_ok || new_sack > 0 {
                self.dupacks += 1;
            }
            if self.sack_ok && seg.options.sack_block_count == 0 {
                self.plain_dupacks += 1;
            }
            if self.recovery.is_some() && !self.sack_ok {
                // RFC 6582 §3.2 step 4: inflate cwnd by one SMSS per additional dupack.
                self.reno_inflation += mss as i64;
            }
        }
        // A newly SACKed segment that was never retransmitted is a clean RTT sample (Karn's
        // rule holds; the receiver acknowledges out-of-order data at once), as Linux takes. It
        // also ends an RTO back-off when no cumulative ACK can (RFC 6298 §5.7 note).
        if !sampled && let Some(sent) = delivered.sacked_sample_sent_at {
            let r = now.saturating_duration_since(sent);
            // Not its timestamps: a duplicate ACK echoes the TSval of the last in-order
            // segment (RFC 7323 §4.3), so TSval − TSecr would hold the time since the hole.
            self.delay_sample(now, r, None);
            self.rtt.on_sample(r);
            sampled = true;
        }
        if sampled {
            self.tlp.sampled = true;
        }
        if self.rack_enabled() {
            self.rack_update(now, &delivered, dsack);
        }
        self.tlp_process_ack(now, ack, dsack);
        // RFC 7661 §4.2: what the flow gets acknowledged, cumulatively or by SACK.
        self.pipe_ack
            .on_ack(now, newly_acked_before + new_sack, self.rtt.srtt());
        self.observer.on_ack(now, newly_delivered, self.rtt.srtt());
        self.resume_on_ack(newly_delivered);
        let tsecr = seg.options.timestamps.map(|(_, ecr)| ecr);
        self.detect_spurious_rto(now, advancing, tsecr, dsack);
        // The window reopened with our probe byte unacknowledged: the receiver dropped it, so
        // send it again first.
        if self.snd_wnd > 0
            && let Some(z) = self.zwp_seq
        {
            self.zwp_seq = None;
            if z == self.snd_una {
                self.sb.mark_head_lost();
                self.force_retransmit = true;
            }
        }
        if self.rack_enabled() {
            // RACK (RFC 8985 §6.2) replaces the DupThresh rule of RFC 6675 IsLost.
            if delivered.newest_original.is_some() || delivered.newest_retransmitted.is_some() {
                self.rack_detect(now);
            }
        } else if self.sack_ok && new_sack > 0 {
            self.sb.mark_lost(self.cfg.dupack_threshold, mss);
        }
        self.maybe_enter_recovery(now);
        self.update_send_timers(now);
        self.trace(TraceEvent::Ack {
            acked_offset: self.snd_una.get().saturating_sub(1),
            newly_acked: newly_acked_before,
            newly_sacked: new_sack,
            duplicate: newly_acked_before == 0 && (new_sack > 0 || self.dupacks > 0),
        });
    }

    /// Enters loss recovery when loss is detected (RFC 6675 §5 step 4 / RFC 6582 §3.2 step 2,
    /// or a loss RACK marked, RFC 8985 §6.2).
    fn maybe_enter_recovery(&mut self, now: Instant) {
        if self.recovery.is_some() || !self.state.is_synchronized() || self.flight() == 0 {
            return;
        }
        let threshold = self.cfg.dupack_threshold;
        if self.rack_enabled() {
            // RACK decides (it tolerates reordering that DupThresh would take for loss,
            // found by the simulator, seed 443); duplicate ACKs that carry no SACK block at
            // all (a peer, or a middlebox, that stopped sending them) fall back to DupThresh.
            if self.sb.lost_bytes() > 0 && !self.rto_recovery {
                self.enter_recovery(now, false);
            } else if self.plain_dupacks >= threshold {
                self.enter_recovery(now, true);
            }
        } else if self.dupacks >= threshold || (self.sack_ok && self.sb.head_lost()) {
            self.enter_recovery(now, true);
        }
    }

    fn rack_enabled(&self) -> bool {
        self.cfg.rack_tlp && self.sack_ok
    }

    /// RFC 8985 §6.1 and §6.2 steps 2-3: the most recently sent delivered segment, reordering,
    /// and the D-SACK driven widening of the reordering window.
    fn rack_update(
        &mut self,
        now: Instant,
        delivered: &Delivered,
        dsack: Option<(SndPos, SndPos)>,
    ) {
        // A retransmitted segment delivered within min_RTT of its retransmission was most
        // likely delivered by its original transmission: not a RACK sample (§6.1).
        let min_rtt = self
            .rtt
            .min_rtt()
            .or(self.rtt.srtt())
            .unwrap_or(Duration::ZERO);
        let retransmitted = delivered
            .newest_retransmitted
            .filter(|t| now.saturating_duration_since(t.sent_at) >= min_rtt);
        if let Some(candidate) = delivered.newest_original.max(retransmitted)
            && self.rack.xmit.is_none_or(|current| candidate > current)
        {
            self.rack.xmit = Some(candidate);
            self.rack.rtt = now.saturating_duration_since(candidate.sent_at);
        }
        // Reordering shows as a never-retransmitted segment delivered below the highest one
        // (§6.2 step 2), or as a D-SACK: the receiver got both the original and a
        // retransmission, so the original was only late. Without the second signal a path
        // that reorders every flight keeps reo_wnd at zero during recovery, so each late
        // segment is retransmitted before it can show the reordering (found by the simulator,
        // seed 1179; Linux marks reordering on D-SACK too).
        if delivered.reordering || dsack.is_some() {
            self.rack.reordering_seen = true;
        }
        // Step 3: widen the window once per round trip in which a D-SACK shows a spurious
        // retransmission; keep it for 16 recoveries.
        if dsack.is_some() && self.rack.dsack_round.is_none_or(|r| self.snd_una >= r) {
            self.rack.dsack_round = Some(self.snd_nxt);
            self.rack.reo_wnd_mult = self.rack.reo_wnd_mult.saturating_add(1);
            self.rack.reo_wnd_persist = 16;
        }
    }

    /// RACK.reo_wnd (RFC 8985 §6.2 step 4).
    fn rack_reo_wnd(&self) -> Duration {
        let mss = self.effective_mss() as u64;
        let dupthresh_sacked =
            self.sb.sacked_bytes() > u64::from(self.cfg.dupack_threshold.saturating_sub(1)) * mss;
        if !self.rack.reordering_seen
            && (self.recovery.is_some() || self.rto_recovery || dupthresh_sacked)
        {
            return Duration::ZERO;
        }
        let min_rtt = self
            .rtt
            .min_rtt()
            .or(self.rtt.srtt())
            .unwrap_or(Duration::ZERO);
        let wnd = (min_rtt / 4).saturating_mul(self.rack.reo_wnd_mult.max(1));
        wnd.min(self.rtt.srtt().unwrap_or(wnd))
    }

    /// RFC 8985 §6.2 step 5 and the reordering timer; returns whether a loss was marked.
    fn rack_detect(&mut self, now: Instant) -> bool {
        let Some(rack) = self.rack.xmit else {
            return false;
        };
        let reo_wnd = self.rack_reo_wnd();
        let (newly, wait) = self.sb.rack_detect(rack, self.rack.rtt, reo_wnd, now);
        self.timers
            .arm(Timer::Reordering, wait.map(|w| later(now, w)));
        newly
    }

    /// RFC 8985 §7.4: whether the ACK ends a loss probe episode, and whether the probe repaired
    /// a loss (which needs a congestion response).
    fn tlp_process_ack(&mut self, now: Instant, ack: SndPos, dsack: Option<(SndPos, SndPos)>) {
        let Some(end) = self.tlp.end_seq else { return };
        if ack < end {
            return;
        }
        if !self.tlp.is_retrans {
            // New data as the probe: RACK takes care of any loss.
            self.tlp.end_seq = None;
        } else if dsack.is_some_and(|(_, right)| right == end) {
            // The receiver had the original: nothing was lost.
            self.tlp.end_seq = None;
        } else if ack > end {
            // The probe, not the original, delivered the last segment: it repaired a loss.
            self.tlp.end_seq = None;
            let flight = self.flight().min(self.cc.cwnd());
            self.rto_undo = None;
            self.congestion_event(now, flight);
            self.cc.on_recovery_exit(now);
            self.counters.tail_loss_repairs += 1;
            self.trace(TraceEvent::TailLossRepaired);
        }
        // SEG.ACK == TLP.end_seq without D-SACK: the D-SACK of a duplicate may still come.
    }

    /// The window reduction of a loss event (fast recovery, or a loss a tail loss probe
    /// repaired). The controller reduces as its RFC says; but when the flow was application
    /// limited — in RFC 7661's non-validated phase, pipeACK < cwnd/2 (§3, §4.3) — the result
    /// stops at the initial window (RFC 6928), or at cwnd if that was smaller. Such a flow's
    /// rate is set by the application, not by cwnd: a reduction below what it sends changes
    /// nothing while ACKs flow, and only stalls it (its messages expire in the queue) when a
    /// burst of ACKs is lost, because an application-limited flow never regrows its window
    /// (issue 14). RFC 7661 §4.3 lets the sender keep an unvalidated cwnd; the initial window
    /// is what RFC 5681 §4.1 and RFC 6928 let any sender put into an unknown path without
    /// feedback. A flow that uses its window (validated phase) gets the standard response.
    fn congestion_event(&mut self, now: Instant, flight: u64) {
        self.window_reduction(now, flight);
        self.delay_bound_after_loss();
    }

    /// The queue bound's rounds restart after a loss response: the next round carries what was
    /// sent before it, and must not cut the same episode again.
    fn delay_bound_after_loss(&mut self) {
        if let Some(bound) = self.delay_bound.as_mut() {
            bound.after_loss_response(self.snd_nxt);
        }
        self.delay_undo = None;
    }

    /// [`Self::congestion_event`]'s window arithmetic; returns the floor an application-limited
    /// flow's window keeps (0 for a validated flow).
    fn window_reduction(&mut self, now: Instant, flight: u64) -> u64 {
        let cwnd = self.cc.cwnd();
        let non_validated = self.pipe_ack.non_validated(now, self.rtt.srtt(), cwnd);
        self.cc.on_congestion_event(now, flight);
        let floor = 2 * self.effective_mss() as u64;
        if let Some(r) = self.resume.as_mut() {
            let action = r.on_congestion(floor);
            self.apply_resume(action);
        }
        if !non_validated {
            return 0;
        }
        let iw = self.effective_mss() as u64 * u64::from(self.cfg.initial_window.max(1));
        let floor = iw.min(cwnd);
        if self.cc.cwnd() < floor {
            self.cc.keep_at_least(floor);
            self.counters.app_limited_floors += 1;
        }
        floor
    }

    /// At the end of each round trip, with a [`ConnectionConfig::queue_delay_limit`]: a
    /// standing queue above the limit takes the controller's loss response (not in loss
    /// recovery, which has just had one), as an ECN mark would (RFC 3168 §6.1.2: once per
    /// round trip); see [`crate::delay`].
    fn bound_queue_delay(&mut self, now: Instant, mss: u64, acked: u64) {
        let Some(bound) = self.delay_bound.as_mut() else {
            return;
        };
        let sender = SenderState {
            una: self.snd_una,
            nxt: self.snd_nxt,
            // Four segments: the controllers' floor is two; a window this small that still
            // queues beyond the limit does not own the queue.
            at_floor: self.cc.cwnd() <= 4 * mss,
            slow_start: self.cc.cwnd() < self.cc.ssthresh(),
            // Loss recovery (or a timeout's) has just had its response.
            may_reduce: self.recovery.is_none() && !self.rto_recovery,
        };
        match bound.on_ack(now, acked, sender) {
            RoundVerdict::Reduce { drained } => {
                let flight = self.flight().min(self.cc.cwnd());
                // A reduction out of slow start is not given back: the window then was
                // doubling past anything the path had carried.
                self.delay_undo = (!sender.slow_start).then(|| self.cc.cwnd());
                let app_limited_floor = self.window_reduction(now, flight);
                self.cc.on_recovery_exit(now);
                // Far above the limit, one step of the controller's (30 % for CUBIC) per
                // round trip would take many (long) round trips. Not below the floor an
                // application-limited flow keeps (RFC 7661, see `congestion_event`).
                let w = drained.max(4 * mss).max(app_limited_floor);
                if self.cc.cwnd() > w {
                    self.cc.set_window(w, w);
                }
                self.counters.queue_delay_reductions += 1;
                self.trace(TraceEvent::QueueDelayReduction);
            }
            RoundVerdict::Rebased { undo } => {
                self.counters.queue_delay_rebases += 1;
                // A reduction that shortened no queue is given back (a loss since would have
                // cleared `delay_undo`: that response stands).
                let mut cwnd = self.cc.cwnd();
                if let Some(before) = self.delay_undo.take()
                    && undo
                {
                    cwnd = cwnd.max(before);
                }
                // The path, whose delay moved, is learnt again: slow start from here, rather
                // than CUBIC's slow climb past a W_max measured on the old path. The bound
                // ends it on its new base after eight samples of a queue (as it ends every
                // slow start), or a loss does; verdicts come only outside loss recovery.
                self.cc.set_window(cwnd, u64::MAX);
            }
            RoundVerdict::Clear => {}
        }
    }

    /// An RTT sample for the queue bound, with the ACK's timestamps (TSval, TSecr) where
    /// they were negotiated: the bound measures the forward queue with them.
    fn delay_sample(&mut self, now: Instant, rtt: Duration, timestamps: Option<(u32, u32)>) {
        if self.delay_bound.is_none() {
            return;
        }
        let local = self.ts_now(now);
        let stamps = timestamps
            .filter(|&(_, ecr)| self.ts_ok && ecr != 0)
            .map(|(tsval, tsecr)| Stamps {
                now,
                local,
                tsval,
                tsecr,
            });
        if let Some(bound) = self.delay_bound.as_mut() {
            bound.on_sample(DelaySample { rtt, stamps });
        }
    }

    /// Detection of a spurious retransmission timeout. Eifel (RFC 3522 §2): the first ACK
    /// that acknowledges new data after the timeout echoes a timestamp older than the first
    /// retransmission, so it acknowledges an original transmission. D-SACK (RFC 3708 §3):
    /// every retransmission since the timeout was reported as a duplicate once the cumulative
    /// ACK has passed the data outstanding at the timeout — the receiver had all of it, and the
    /// timeout only saw lost ACKs. Either way the response (RFC 4015 §3) gives back what the
    /// timeout took.
    fn detect_spurious_rto(
        &mut self,
        now: Instant,
        advancing: bool,
        tsecr: Option<u32>,
        dsack: Option<(SndPos, SndPos)>,
    ) {
        let ts_ok = self.ts_ok;
        let recovered = self.snd_una >= self.recover;
        let Some(u) = self.rto_undo.as_mut() else {
            return;
        };
        let mut spurious = false;
        let mut eifel = false;
        if u.first_ack_pending && advancing {
            u.first_ack_pending = false;
            eifel = ts_ok
                && tsecr.is_some_and(|ecr| ecr != 0 && ts_before(ecr, u.retransmit_ts))
                && self.snd_una > u.una;
        }
        if let Some((l, r)) = dsack
            && let Some(i) = u.retransmitted.iter().position(|&(s, e)| l < e && r > s)
        {
            u.retransmitted.swap_remove(i);
        }
        if !u.overflow && u.retransmitted.is_empty() && recovered && !u.first_ack_pending {
            spurious = true;
        }
        if spurious || eifel {
            // Only D-SACKs for every copy, the probe's included, show that the probe
            // repaired nothing; otherwise its repair gets the response RFC 8985 §7.4 gives.
            let probe_repair = !spurious && u.probe_open;
            self.undo_rto();
            if probe_repair {
                let flight = self.flight().min(self.cc.cwnd());
                self.congestion_event(now, flight);
                self.cc.on_recovery_exit(now);
            }
        }
    }

    /// The response to a spurious timeout (RFC 4015 §3): the congestion state from before
    /// the timeout comes back (unless the window has grown past it since), and what the
    /// timeout presumed lost but has not been resent yet is no longer resent (no go-back-N
    /// of data the receiver has; RACK finds any real loss by time).
    fn undo_rto(&mut self) {
        let Some(u) = self.rto_undo.take() else {
            return;
        };
        if let Some(cc) = u.cc
            && cc.cwnd() > self.cc.cwnd()
        {
            self.cc = cc;
        }
        if self.rto_recovery {
            self.rto_recovery = false;
            self.sb.clear_unsent_lost();
        }
        self.counters.spurious_rtos_undone += 1;
        self.trace(TraceEvent::SpuriousRtoUndone);
    }

    /// Starts a recovery episode; `mark_head` deems the first unacknowledged segment lost (a
    /// DupThresh trigger, RFC 5681 §3.2 / RFC 6675 §5 step 4.2).
    fn enter_recovery(&mut self, now: Instant, mark_head: bool) {
        // Only once everything sent before the previous recovery or RTO is acknowledged
        // (RFC 6582 §3.2 step 2, RFC 6675 §5.1). Without SACK, the ACK heuristic of RFC 6582
        // §4.1 may start one earlier: the duplicate ACKs show a new loss rather than
        // go-back-N retransmissions the receiver already had when cwnd is above one SMSS and
        // the last advance of the cumulative ACK was at most 4 SMSS. With SACK the scoreboard
        // knows what the receiver has, so no heuristic is needed (found by the simulator, seed
        // 883: a second reduction right after an RTO, computed from the stale FlightSize of
        // the timed-out window, let a burst of retransmissions overflow a small queue).
        if self.snd_una < self.recover {
            let mss = self.effective_mss() as u64;
            // The heuristic's "4*SMSS" stands for four segments: with small segments (small
            // writes, consistent segmentation) a jump over many buffered segments is still a
            // few SMSS of bytes, and counting bytes took go-back-N duplicates for new losses
            // (found by the simulator, seed 288: a crawl of one retransmission per RTT).
            let advance_small = self.last_ack_advance <= 4 * mss && self.last_ack_segments <= 4;
            let heuristic = !self.sack_ok && self.cc.cwnd() > mss && advance_small;
            if !heuristic {
                return;
            }
        }
        // FlightSize for the new ssthresh (RFC 5681 eq. 4), but never more than cwnd: after an
        // RTO the outstanding window is stale (most of it is presumed lost), and halving it
        // would raise cwnd far above what the network just carried (Linux halves cwnd).
        let flight = self.flight().min(self.cc.cwnd());
        // A new recovery episode ends any loss probe episode (RFC 8985 §7.4).
        self.tlp.end_seq = None;
        self.recovery = Some(Recovery {
            point: self.snd_nxt,
            partial_acks: 0,
        });
        self.recover = self.snd_nxt;
        // A loss: whatever an earlier timeout took away stays taken.
        self.rto_undo = None;
        self.congestion_event(now, flight);
        self.counters.fast_retransmits += 1;
        self.trace(TraceEvent::RecoveryStart);
        tracing::debug!(
            local = %self.local,
            remote = %self.remote,
            snd_una = self.snd_una.get(),
            flight,
            cwnd = self.cc.cwnd(),
            ssthresh = self.cc.ssthresh(),
            sack = self.sack_ok,
            "fast retransmit, entering recovery"
        );
        if mark_head {
            self.sb.mark_head_lost();
        }
        if !self.sack_ok {
            // RFC 6582 §3.2 step 2: cwnd = ssthresh + 3*SMSS.
            self.reno_inflation = 3 * self.effective_mss() as i64;
        }
        self.force_retransmit = true;
    }

    /// Applies SACK blocks to the scoreboard, noting what they deliver in `delivered`; returns
    /// bytes newly SACKed and the range a D-SACK block reported, if any.
    fn process_sack(
        &mut self,
        seg: &Segment<'_>,
        ack: SndPos,
        delivered: &mut Delivered,
    ) -> (u64, Option<(SndPos, SndPos)>) {
        let mut newly = 0;
        let mut dsack = None;
        let fack_before = self.sb.fack();
        for (i, &(l, r)) in seg.options.sack().iter().enumerate() {
            let left = self.snd_pos(l);
            let right = self.snd_pos(r);
            // D-SACK (RFC 2883 §4): the first block reports a duplicate if it lies below the
            // cumulative ACK or inside the second block. Tolerated and counted, not applied.
            if i == 0 {
                let below_ack = right <= ack;
                let inside_second = seg.options.sack().get(1).is_some_and(|&(l2, r2)| {
                    let l2 = self.snd_pos(l2);
                    let r2 = self.snd_pos(r2);
                    left >= l2 && right <= r2
                });
                if below_ack || inside_second {
                    self.counters.dsacks += 1;
                    dsack = Some((left, right));
                    continue;
                }
            }
            // Ignore blocks that are empty or outside what is outstanding.
            if left >= right || left < self.snd_una || right > self.snd_nxt {
                continue;
            }
            // Hollywood §4.2: a message the receiver holds part of is never replaced.
            self.queue
                .mark_received(left.get().saturating_sub(1), right.offset());
            newly += self.sb.sack(left, right, fack_before, delivered);
        }
        (newly, dsack)
    }

    /// Accepts segment text and FIN (RFC 9293 §3.10.7.4 seventh and eighth checks).
    /// Returns whether out-of-order data was dropped for lack of room.
    fn process_text(&mut self, now: Instant, start: RcvPos, payload: &[u8], fin: bool) -> bool {
        let mut data = payload;
        let mut fin = fin;
        let mut start = start;
        if start == Pos::ZERO {
            // Text claiming the SYN's sequence number: that octet is not data.
            data = data.get(1..).unwrap_or(&[]);
            start = RcvPos::AFTER_SYN;
        }
        // Trim to the advertised window's right edge; a FIN beyond it is dropped with the data.
        // Nothing is accepted beyond a FIN already seen.
        let mut right = self.rcv_adv.max(self.rcv_nxt);
        if let Some(f) = self.peer_fin_at {
            right = right.min(f);
        }
        let end = start + data.len();
        if end > right {
            let keep = right.saturating_sub(start) as usize;
            data = &data[..keep.min(data.len())];
            fin = false;
        }
        if !data.is_empty() && !self.peer_fin_processed {
            let keep = self.admit_text(start.offset(), data.len());
            if keep < data.len() {
                data = &data[..keep];
                fin = false;
            }
        }
        if !data.is_empty() {
            self.counters.bytes_received += data.len() as u64;
            let len = data.len().min(self.offered_mss as usize);
            self.rcv_mss = self.rcv_mss.max(len);
            if len >= self.ack_mss || len == self.last_seg_len {
                self.ack_mss = len;
            }
            self.last_seg_len = len;
        }
        let had_ooo = self.recv.ooo_bytes() > 0;
        // Stream offset of the segment: position 1 is stream offset 0.
        let stream_start = start.offset();
        let outcome = if data.is_empty() || self.peer_fin_processed {
            Default::default()
        } else if self.unordered.is_some() {
            // Minion §4.1: the segment goes to the application at once; the buffer keeps the
            // ranges (not the bytes) so that ACKs, SACKs and the window stay standard.
            let end = stream_start + data.len() as u64;
            let new = self.recv.uncovered(stream_start, end);
            let outcome = self.recv.insert(stream_start, data);
            if !outcome.dropped {
                self.deliver_unordered(stream_start, data, &new);
            }
            outcome
        } else {
            self.recv.insert(stream_start, data)
        };
        if fin {
            let fin_pos = start + data.len();
            self.peer_fin_at = Some(fin_pos);
        }
        if outcome.out_of_order && !outcome.dropped {
            self.note_sack_block(stream_start);
        }
        let prev_rcv_nxt = self.rcv_nxt;
        self.rcv_nxt = RcvPos::of_offset(self.recv.next());
        // FIN in order?
        if let Some(f) = self.peer_fin_at
            && !self.peer_fin_processed
            && f == self.rcv_nxt
        {
            self.peer_fin_processed = true;
            self.rcv_nxt += 1u64;
            self.ack_now = true;
            self.events.push(ConnEvent::PeerFin);
            match self.state {
                State::SynReceived | State::Established => self.set_state(State::CloseWait),
                State::FinWait1 => {
                    if self.fin_seq.is_some_and(|f| self.snd_una > f) {
                        self.enter_time_wait(now);
                    } else {
                        self.set_state(State::Closing);
                    }
                }
                State::FinWait2 => self.enter_time_wait(now),
                _ => {}
            }
            if self.state == State::CloseWait {
                self.timers.arm(
                    Timer::Keepalive,
                    self.cfg.keepalive.map(|k| later(now, k.idle)),
                );
            }
        }
        if self.rcv_nxt > prev_rcv_nxt && outcome.delivered > 0 {
            if self.readable_armed {
                self.readable_armed = false;
                self.events.push(ConnEvent::Readable);
            }
            let next = self.recv.next();
            self.sack_recent.retain(|&(_, e)| e > next);
        }
        // ACK policy (RFC 5681 §4.2, RFC 9293 §3.8.6.3): out-of-order data and data that fills
        // a gap are acknowledged at once, and so are the first `quick_acks` full-sized in-order
        // segments of the connection (Linux's quick-ACK mode); otherwise every second full-sized
        // segment, or when the delayed-ACK timer fires.
        if outcome.out_of_order || outcome.filled_gap || (had_ooo && outcome.delivered > 0) {
            self.ack_now = true;
        } else if outcome.delivered > 0 {
            match self.cfg.delayed_ack {
                None => self.ack_now = true,
                // Only full-sized segments: a small one is a request or an answer, whose ACK
                // may ride on the reply or the FIN that follows (Linux's "pingpong" mode).
                Some(_) if self.quick_acks_left > 0 && self.last_seg_len >= self.rcv_mss => {
                    self.quick_acks_left -= 1;
                    self.ack_now = true;
                }
                Some(delay) => {
                    // Every second segment: full-sized ones (RFC 5681 §4.2), or, when the peer
                    // sends a run of smaller segments (messages without Nagle), those, so
                    // that a sender held to a few segments per window is not held to one
                    // window per delayed-ACK timeout (found by the simulator, seed 22357).
                    if self.rcv_nxt - self.rcv_acked >= 2 * self.ack_mss as u64 {
                        self.ack_now = true;
                    } else if !self.timers.is_armed(Timer::DelayedAck) {
                        self.timers.set(Timer::DelayedAck, later(now, delay));
                    }
                }
            }
        } else if !payload.is_empty() {
            // Duplicate data: ACK at once so that the sender learns what we hold.
            self.ack_now = true;
        }
        outcome.dropped
    }

    /// Records the out-of-order range containing `offset` as the most recent SACK block.
    fn note_sack_block(&mut self, offset: u64) {
        if let Some(range) = self.recv.ooo_range_containing(offset) {
            self.sack_recent
                .retain(|&(s, e)| !(s < range.1 && range.0 < e));
            self.sack_recent.insert(0, range);
            self.sack_recent.truncate(MAX_SACK_BLOCKS * 2);
        }
    }

    /// ACK answering an unacceptable segment, rate-limited.
    fn send_invalid_ack(&mut self, now: Instant) {
        if self
            .last_invalid_ack
            .is_some_and(|t| now.saturating_duration_since(t) < INVALID_ACK_INTERVAL)
        {
            return;
        }
        self.last_invalid_ack = Some(now);
        self.ack_now = true;
    }

    /// Challenge ACK (RFC 5961 §3.2, §4.2, §5.2) within the rate limit of §7.
    fn send_challenge_ack(&mut self, now: Instant) {
        let window_over = self
            .challenge_window_start
            .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1));
        if window_over {
            self.challenge_window_start = Some(now);
            self.challenge_count = 0;
        }
        if self.challenge_count >= self.cfg.challenge_ack_limit {
            return;
        }
        self.challenge_count += 1;
        self.counters.challenge_acks += 1;
        self.ack_now = true;
    }

    // ---------------------------------------------------------------- output

    /// Free receive buffer space.
    fn free_space(&self) -> usize {
        self.recv_buffer_now().saturating_sub(self.recv.used())
    }

    /// Window for SYN and SYN-ACK segments: never scaled (RFC 7323 §2.2).
    fn syn_window(&self) -> u16 {
        initial_window(self.free_space(), self.offered_mss)
    }

    /// Chooses the window to advertise and records its right edge. Receiver-side silly window
    /// avoidance (RFC 9293 §3.8.6.2.2): the right edge only moves when it can move by at least
    /// min(RCV.BUFF / 2, MSS); it never moves left (no window shrinking, RFC 9293 §3.8.6.2.2
    /// and RFC 7323 §2.4).
    fn window_to_advertise(&mut self) -> u16 {
        let cur = self.rcv_adv.saturating_sub(self.rcv_nxt);
        let free = self.free_space() as u64;
        // RCV.BUFF is what the memory budget lets the buffer hold now (crate::mem): with a
        // floor below one MSS the window must still open.
        let threshold = ((self.recv_buffer_now() / 2) as u64)
            .min(self.rcv_mss as u64)
            .max(1);
        let mut win = if free >= cur + threshold { free } else { cur };
        // Largest value the 16-bit field can express with our shift.
        let max = 65535u64 << self.rcv_wscale;
        win = win.min(max);
        let mut field = win >> self.rcv_wscale;
        // Rounding down must not move the right edge left.
        if (field << self.rcv_wscale) < cur {
            field = cur.div_ceil(1 << self.rcv_wscale).min(65535);
        }
        let actual = field << self.rcv_wscale;
        // The edge data is accepted up to: what was advertised, but not beyond the free space
        // when the rounding up above offered more than there is. Recording the rounded edge
        // would let a peer that sends all but a sliver of each window grow the buffer by up to
        // a unit per ACK without bound; the sliver the field over-states is trimmed instead
        // (the window shrinks by less than one unit of the scale).
        self.rcv_adv = self.rcv_adv.max(self.rcv_nxt + actual.min(free));
        field as u16
    }

    /// SACK blocks to send (RFC 2018 §4): most recent first, only ranges still held.
    fn sack_blocks(&self, out: &mut OutOptions) {
        if !self.sack_ok {
            return;
        }
        let max = if self.ts_ok { 3 } else { 4 };
        let mut n = 0usize;
        if let Some((s, e)) = self.dsack {
            out.sack_blocks[0] = (s.wire(self.irs).get(), e.wire(self.irs).get());
            n = 1;
            out.sack_block_count = 1;
        }
        if self.recv.ooo_bytes() == 0 {
            return;
        }
        let ranges = self.recv.ooo_ranges();
        let first_regular = n;
        let mut push = |out: &mut OutOptions, (s, e): (u64, u64)| {
            // Stream offsets to the peer's sequence numbers.
            let wire = |offset| RcvPos::of_offset(offset).wire(self.irs).get();
            if n >= max
                || out.sack_blocks[first_regular..n]
                    .iter()
                    .any(|&(l, _)| l == wire(s))
            {
                return;
            }
            out.sack_blocks[n] = (wire(s), wire(e));
            n += 1;
            out.sack_block_count = n as u8;
        };
        for &(s, _) in &self.sack_recent {
            if let Some(&r) = ranges.iter().find(|&&(rs, re)| rs <= s && s < re) {
                push(out, r);
            }
        }
        // Then any other held ranges, highest first.
        for &r in ranges.iter().rev() {
            push(out, r);
        }
    }

    fn base_options(&self, now: Instant) -> OutOptions {
        let mut o = OutOptions::default();
        if self.ts_ok {
            o.timestamps = Some((
                self.ts_now(now),
                if self.ts_recent_valid {
                    self.ts_recent
                } else {
                    0
                },
            ));
        }
        o
    }

    fn header(&mut self, seq: SndPos, flags: TcpFlags, window: u16) -> OutHeader {
        self.ip_id = self.ip_id.wrapping_add(1);
        OutHeader {
            src: self.local,
            dst: self.remote,
            seq: self.wire_seq(seq),
            ack: if flags.ack() { self.wire_ack() } else { 0 },
            flags,
            window,
            ttl: self.shared.ttl,
            ip_id: if self.local.is_ipv4() {
                self.ip_id
            } else {
                self.ip_id_base_v6()
            },
        }
    }

    fn ip_id_base_v6(&self) -> u32 {
        // Constant flow label per connection (RFC 6437).
        self.ts_offset.rotate_left(7)
    }

    /// Bookkeeping for every segment that carries an ACK.
    fn on_ack_sent(&mut self) {
        self.ack_now = false;
        self.dsack = None;
        self.timers.cancel(Timer::DelayedAck);
        self.last_ack_sent = self.rcv_nxt;
        self.rcv_acked = self.rcv_nxt;
    }

    /// Writes the next segment this connection wants to send into `buf`.
    pub(crate) fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.clock = self.clock.max(now);
        if self.close_reason().is_none() {
            self.queue.expire(now);
        }
        if self.rst_pending {
            // RFC 9293 §3.10.5 ABORT: <SEQ=SND.NXT><CTL=RST>; Linux adds the ACK.
            let flags = if self.rcv_nxt > Pos::ZERO {
                TcpFlags::RST | TcpFlags::ACK
            } else {
                TcpFlags::RST
            };
            let hdr = self.header(self.empty_segment_seq(), flags, 0);
            let n = wire::write_packet(buf, &hdr, &OutOptions::default(), 0, |_| {})?;
            self.rst_pending = false;
            self.counters.packets_sent += 1;
            return Some(n);
        }
        if let Some(ack) = self.rst_reply_pending {
            // <SEQ=SEG.ACK><CTL=RST> for an unacceptable ACK (RFC 9293 §3.10.7.3/4).
            let mut hdr = self.header(Pos::ZERO, TcpFlags::RST, 0);
            hdr.seq = ack;
            let n = wire::write_packet(buf, &hdr, &OutOptions::default(), 0, |_| {})?;
            self.rst_reply_pending = None;
            self.counters.packets_sent += 1;
            return Some(n);
        }
        match self.state {
            State::Closed(_) => return None,
            State::SynSent | State::SynReceived if self.syn_pending => {
                return self.send_syn(now, buf);
            }
            _ => {}
        }
        if self.state.is_synchronized() {
            if self.tlp.pending {
                self.tlp.pending = false;
                if let Some(n) = self.send_tail_loss_probe(now, buf) {
                    return Some(n);
                }
                // Nothing to probe with: the RTO stays in charge.
                if self.flight() > 0 && !self.timers.is_armed(Timer::Retransmission) {
                    self.arm_rto(now);
                }
            }
            if let Some(n) = self.send_retransmission(now, buf) {
                return Some(n);
            }
            if let Some(n) = self.send_new_data(now, buf) {
                return Some(n);
            }
            if self.zwp_pending {
                self.zwp_pending = false;
                if let Some(n) = self.send_zero_window_probe(now, buf) {
                    return Some(n);
                }
            }
            if self.keepalive_pending {
                self.keepalive_pending = false;
                // RFC 9293 §3.8.4: a segment with SEG.SEQ = SND.NXT - 1 and no data.
                self.counters.keepalive_probes += 1;
                return self.send_ack(now, buf, self.snd_nxt.saturating_back(1));
            }
        }
        if self.fo_early_send_allowed()
            && let Some(n) = self.send_new_data(now, buf)
        {
            return Some(n);
        }
        if self.ack_now && self.state != State::SynSent {
            return self.send_ack(now, buf, self.empty_segment_seq());
        }
        self.update_send_timers(now);
        None
    }

    fn send_syn(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        let syn_ack = self.state == State::SynReceived;
        let mut opts = OutOptions {
            mss: Some(self.offered_mss),
            ..Default::default()
        };
        // Offer (SYN) or confirm (SYN-ACK) each option only as configured and, in a SYN-ACK,
        // only if the peer offered it (RFC 7323 §2.2, §3.2; RFC 2018 §2).
        let (ws, sack, ts) = if syn_ack {
            (self.wscale_ok, self.sack_ok, self.ts_ok)
        } else {
            (self.cfg.window_scaling, self.cfg.sack, self.cfg.timestamps)
        };
        if ws {
            opts.window_scale = Some(self.rcv_wscale);
        }
        opts.sack_permitted = sack;
        if ts {
            let ecr = if syn_ack && self.ts_recent_valid {
                self.ts_recent
            } else {
                0
            };
            opts.timestamps = Some((self.ts_now(now), ecr));
        }
        let flags = if syn_ack {
            TcpFlags::SYN | TcpFlags::ACK
        } else {
            TcpFlags::SYN
        };
        if syn_ack {
            opts.fast_open = self.fo_reply_cookie;
        }
        // Fast Open (RFC 7413 §4.2): the first SYN carries the cookie and the data queued so
        // far, up to the server's remembered MSS (else the default MSS) less the options; or
        // a cookie request. A retransmitted SYN carries neither (§4.1.3, as Linux does): the
        // data may be what a middlebox drops.
        let mut syn_data = 0usize;
        if !syn_ack && let Some(fo) = self.fo_client {
            if self.rto_count == 0 {
                opts.fast_open = Some(fo.cookie.unwrap_or(FastOpenCookie::REQUEST));
                if fo.cookie.is_some() {
                    let mss = fo
                        .mss
                        .unwrap_or_else(|| default_mss(&self.remote))
                        .min(self.local_mss_limit()) as usize;
                    let headers = wire::ip_header_len(&self.local) + wire::TCP_HEADER + opts.len();
                    let room = mss
                        .saturating_sub(opts.len())
                        .min(buf.len().saturating_sub(headers));
                    syn_data = self
                        .queue
                        .segment_len(0, room, self.cfg.consistent_segmentation);
                    // A message goes whole or waits for the handshake, as in any segment
                    // (Hollywood §4.2 consistent segmentation).
                    if self.queue.message_at(0).is_some_and(|m| m > syn_data) {
                        syn_data = 0;
                    }
                }
            } else if fo.syn_data > 0 && !fo.syn_data_timed_out {
                self.fo_notes.push(FastOpenNote::SynDataTimeout);
                if let Some(f) = self.fo_client.as_mut() {
                    f.syn_data_timed_out = true;
                }
            }
        }
        let window = self.syn_window();
        let hdr = self.header(Pos::ZERO, flags, window);
        let queue = &mut self.queue;
        let n = wire::write_packet(buf, &hdr, &opts, syn_data, |out| {
            if !out.is_empty() {
                queue.copy_out(0, out)
            }
        })?;
        if !syn_ack
            && self.rto_count == 0
            && let Some(fo) = self.fo_client.as_mut()
        {
            fo.syn_data = syn_data as u64;
            self.fo_notes.push(if fo.cookie.is_some() {
                FastOpenNote::SynData(syn_data)
            } else {
                FastOpenNote::CookieRequested
            });
            self.counters.bytes_sent += syn_data as u64;
            // SND.NXT covers the data; it moves back to what the SYN-ACK acknowledges.
            self.snd_nxt = SndPos::of_offset(syn_data as u64);
        }
        self.syn_pending = false;
        if self.snd_nxt == Pos::ZERO {
            self.snd_nxt = SndPos::AFTER_SYN;
        }
        if self.rto_count == 0 {
            self.syn_sent_at = Some(now);
        } else {
            self.syn_sent_at = None;
            self.counters.packets_retransmitted += 1;
        }
        if syn_ack {
            self.rcv_adv = self.rcv_adv.max(self.rcv_nxt + window as u64);
            self.on_ack_sent();
        }
        self.counters.packets_sent += 1;
        self.timers
            .set(Timer::Retransmission, later(now, self.rtt.current_rto()));
        self.rto_armed_at = now;
        Some(n)
    }

    /// Largest payload for a data segment carrying these options.
    /// Leaves SACK blocks out of a retransmission of segment `index` as far as needed for it
    /// to go out whole: a retransmission keeps the original segment's boundaries (Hollywood
    /// §4.5, so that an inconsistent retransmission looks like any other, and a receiver
    /// sees each range with the same layout). RFC 2018 §4 lets a segment carry fewer blocks
    /// than it could; the ACKs that follow carry them all.
    fn fit_sack_blocks(&self, opts: &mut OutOptions, index: usize, buf_len: usize) {
        let Some(want) = self.sb.payload_len(index) else {
            return;
        };
        while opts.sack_block_count > 0 && (self.payload_limit(opts, buf_len) as u64) < want {
            opts.sack_block_count -= 1;
        }
    }

    fn payload_limit(&self, opts: &OutOptions, buf_len: usize) -> usize {
        let base = self.snd_mss as usize;
        let opt_len = opts.len();
        let by_mss = base.saturating_sub(opt_len);
        let headers = wire::ip_header_len(&self.local) + wire::TCP_HEADER + opt_len;
        by_mss.min(buf_len.saturating_sub(headers))
    }

    /// The congestion window in force (bytes) and what counts against it.
    fn window_and_use(&self) -> (u64, u64) {
        let cwnd = self.cc.cwnd();
        let flight = self.flight();
        let mss = self.effective_mss() as u64;
        match self.recovery {
            Some(_) if self.sack_ok => (cwnd, self.sb.pipe(flight)),
            Some(_) => (
                (cwnd as i64 + self.reno_inflation).max(mss as i64) as u64,
                flight,
            ),
            // With SACK, limited transmit falls out of the pipe estimate (RFC 6675 §5 step 1).
            None if self.sack_ok => (cwnd, self.sb.pipe(flight)),
            // Limited transmit (RFC 3042): one new segment for each of the first two duplicate
            // ACKs. After an RTO everything outstanding is presumed lost, so what is in the
            // network is the pipe estimate (retransmissions), not FlightSize.
            None => (
                cwnd + self.dupacks.min(2) as u64 * mss,
                self.sb.pipe(flight),
            ),
        }
    }

    /// The least a segment counts for in the congestion window, in bytes. The window counts
    /// bytes, not buffers (Minion §8.1): a stream of small messages, each in its own segment
    /// (consistent segmentation), gets the byte rate of full-sized segments, not a rate cut by
    /// the ratio of message size to MSS as with Linux's window in packets. A floor of SMSS/16
    /// keeps tiny segments from multiplying the packets a window lets loose (found by the
    /// simulator, seed 1179: IW10 of 3-byte messages counted in bytes alone was a burst of
    /// 4000 packets): at most 16 segments per SMSS of window.
    fn segment_charge_floor(&self) -> u64 {
        (self.effective_mss() as u64 / 16).max(1)
    }

    /// What the segments in the network count for against the window: their bytes, each at
    /// least the floor.
    fn charged_use(&self) -> u64 {
        let (_, used) = self.window_and_use();
        used.max(self.sb.pipe_segments() * self.segment_charge_floor())
    }

    /// Usable congestion window (bytes we may still put in flight).
    fn cwnd_allowance(&self) -> u64 {
        let (window, _) = self.window_and_use();
        window.saturating_sub(self.charged_use())
    }

    fn send_retransmission(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        let index = self.sb.next_lost()?;
        let mut opts = self.base_options(now);
        self.sack_blocks(&mut opts);
        self.fit_sack_blocks(&mut opts, index, buf.len());
        let limit = self.payload_limit(&opts, buf.len());
        if limit == 0 {
            return None;
        }
        let (start, end, fin) = self.sb.limit_segment(index, limit as u64)?;
        let seg_len = end - start;
        if !self.force_retransmit {
            let allowance = self.cwnd_allowance();
            if allowance < seg_len.min(self.effective_mss() as u64) {
                return None;
            }
        }
        self.force_retransmit = false;
        let payload_len = (seg_len - fin as u64) as usize;
        // After a timeout every outstanding segment is presumed lost without evidence: only
        // copies of messages in flight may fill such a range (`replace_expired_with`).
        self.replace_expired(now, start.offset(), payload_len, !self.rto_recovery);
        let n = self.emit_data(now, buf, start, payload_len, fin, &opts, true)?;
        self.sb.on_retransmit(index, now);
        self.counters.packets_retransmitted += 1;
        self.counters.bytes_retransmitted += payload_len as u64;
        if self.rto_recovery
            && let Some(u) = self.rto_undo.as_mut()
        {
            if u.retransmitted.len() < MAX_UNDO_RANGES {
                u.retransmitted.push((start, end));
            } else {
                u.overflow = true;
            }
        }
        // With SACK, resending the first unacknowledged segment restarts the timer (as Linux
        // does): armed at the last cumulative ACK, it could expire before the retransmission,
        // sent later (RACK waits out reordering first), has had a round trip (found by the
        // simulator, seed 866). NewReno keeps RFC 6582's timer ("Impatient").
        if !self.timers.is_armed(Timer::Retransmission) || (self.sack_ok && start == self.snd_una) {
            self.timers.cancel(Timer::Retransmission);
            self.arm_rto(now);
        }
        Some(n)
    }

    /// Before a retransmission of the stream bytes `[stream_start, stream_start + len)`: the
    /// messages in it that will have expired on arrival are replaced by live ones (Hollywood
    /// §4.2 inconsistent retransmissions; rules in [`SendQueue`]). Arrival is estimated as
    /// early as it plausibly can be: now plus half the smallest round trip measured (Hollywood
    /// §4.2 uses SRTT/2). Replacing a message that would have been useful costs more than
    /// sending one that arrives late, and under delay jitter the smoothed estimates are no
    /// lower bound: (SRTT − RTTVAR)/2 replaced messages that then would have arrived in time
    /// (issue 14: RTT 40 ms ± 10 ms, 60 ms playout). Without a fine-grained sample, (SRTT −
    /// RTTVAR)/2. Without an RTT sample, or without a padder, nothing is replaced. Without
    /// `evidence` of loss (a timeout's go-back-N, a tail loss probe) only copies of messages
    /// in flight fill the range, never a pending message (`SendQueue::replace_expired_with`).
    fn replace_expired(&mut self, now: Instant, stream_start: u64, len: usize, evidence: bool) {
        let Some(padder) = &self.cfg.padder else {
            return;
        };
        let Some(srtt) = self.rtt.srtt() else {
            return;
        };
        if len == 0 {
            return;
        }
        let round_trip = self
            .rtt
            .min_rtt()
            .unwrap_or_else(|| srtt.saturating_sub(self.rtt.rttvar()));
        let one_way = round_trip / 2;
        let arrival = later(now, one_way);
        let end = stream_start + len as u64;
        let r = self
            .queue
            .replace_expired_with(stream_start, end, now, arrival, padder, evidence);
        if r.ranges > 0 {
            self.counters.inconsistent_retransmissions += 1;
            tracing::debug!(
                local = %self.local,
                offset = stream_start,
                len,
                replaced = r.replaced,
                replacements = r.replacements,
                "inconsistent retransmission"
            );
        }
    }

    /// Writes a data/FIN segment covering `[start, start + payload_len)` (+FIN).
    #[allow(clippy::too_many_arguments)]
    fn emit_data(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        start: SndPos,
        payload_len: usize,
        fin: bool,
        opts: &OutOptions,
        retransmission: bool,
    ) -> Option<usize> {
        let stream_start = start.offset();
        let mut flags = TcpFlags::ACK;
        if fin {
            flags |= TcpFlags::FIN;
        }
        // PSH when the segment empties the send queue (RFC 9293 §3.9.1.2 leaves it to us).
        if payload_len > 0 && stream_start + payload_len as u64 >= self.queue.end() {
            flags |= TcpFlags::PSH;
        }
        let window = self.window_to_advertise();
        let hdr = self.header(start, flags, window);
        let queue = &mut self.queue;
        let n = wire::write_packet(buf, &hdr, opts, payload_len, |out| {
            queue.copy_out(stream_start, out)
        })?;
        self.on_ack_sent();
        self.counters.packets_sent += 1;
        self.counters.bytes_sent += payload_len as u64;
        self.last_send = Some(now);
        self.trace(TraceEvent::Sent {
            offset: stream_start,
            len: payload_len as u32,
            fin,
            retransmission,
        });
        Some(n)
    }

    pub(crate) fn careful_resume_enabled(&self) -> bool {
        self.cfg.careful_resume
    }

    /// The latest time the connection was called with.
    pub(crate) fn clock_now(&self) -> Instant {
        self.clock
    }

    /// Starts Careful Resume from `saved` (the endpoint's cached state for this host): the
    /// connection begins in Reconnaissance with the ordinary initial window (RFC 9959).
    pub(crate) fn start_resume(&mut self, saved: PathRecord) {
        // Stream byte 0 is sequence number 1 (the SYN takes 0).
        self.resume = Some(Box::new(CarefulResume::new(saved, 1)));
    }

    /// The path state this connection observed, for the endpoint's cache (RFC 9040 §4): its
    /// minimum RTT and the most bytes acknowledged within one round trip. `None` when that is
    /// under four initial windows (RFC 9959 Observe phase: too small to be worth resuming)
    /// or nothing was measured. After a Safe Retreat the state that proved wrong is gone (the
    /// endpoint took it out of the cache); what this connection measured replaces it, since
    /// bytes acknowledged within a round trip were carried by the path as it is now.
    pub(crate) fn path_observation(&self, now: Instant) -> Option<PathRecord> {
        let rtt = self.rtt.min_rtt()?;
        let iw = self.effective_mss() as u64 * u64::from(self.cfg.initial_window.max(1));
        let cwnd = self.observer.best();
        if cwnd < 4 * iw {
            return None;
        }
        Some(PathRecord {
            rtt,
            cwnd,
            saved_at: now,
        })
    }

    fn resume_stats(&self) -> ResumeStats {
        self.resume.as_ref().map(|r| r.stats()).unwrap_or_default()
    }

    /// Careful Resume's view of an ACK that acknowledged `acked` new bytes.
    fn resume_on_ack(&mut self, acked: u64) {
        if self
            .resume
            .as_ref()
            .is_none_or(|r| r.phase() == crate::resume::ResumePhase::Normal)
        {
            return;
        }
        let cwnd = self.cc.cwnd();
        let unsent = self
            .queue
            .end()
            .saturating_sub(self.snd_nxt.get().saturating_sub(1));
        let wants_more = unsent > self.cwnd_allowance() && self.recovery.is_none();
        let min_rtt = self.rtt.min_rtt();
        let iw = self.effective_mss() as u64 * u64::from(self.cfg.initial_window.max(1));
        let Some(r) = self.resume.as_mut() else {
            return;
        };
        let action = r.on_ack(
            iw,
            self.snd_una.get(),
            acked,
            cwnd,
            min_rtt,
            wants_more,
            self.snd_nxt.get(),
        );
        self.apply_resume(action);
    }

    /// Carries out what Careful Resume decided, on the controller's window.
    fn apply_resume(&mut self, action: ResumeAction) {
        let ssthresh = self.cc.ssthresh();
        match action {
            ResumeAction::None => {}
            ResumeAction::Jump(jump) => self.cc.set_window(jump, ssthresh),
            ResumeAction::CwndToFlight => {
                // RFC 9959 Validating: "On entry ..., the CWND is set to the flight size."
                let floor = 2 * self.effective_mss() as u64;
                self.cc.set_window(self.flight().max(floor), ssthresh);
            }
            ResumeAction::Retreat(cap) => {
                if self.cc.cwnd() > cap || ssthresh > cap {
                    let cwnd = self.cc.cwnd().min(cap);
                    self.cc.set_window(cwnd, ssthresh.min(cap));
                }
            }
            ResumeAction::Normal(Some(pipe)) => {
                let floor = 2 * self.effective_mss() as u64;
                self.cc
                    .set_window(self.cc.cwnd(), ssthresh.min(pipe.max(floor)));
            }
            ResumeAction::Normal(None) => {}
        }
        // The jump holds cwnd at jump_cwnd and Safe Retreat holds it down: the controller's
        // own growth on this ACK does not count (RFC 9959 Unvalidated, Safe Retreat).
        if let Some(cap) = self.resume.as_ref().and_then(|r| r.window_cap())
            && self.cc.cwnd() > cap
        {
            let ssthresh = self.cc.ssthresh();
            self.cc.set_window(cap, ssthresh);
        }
        if self
            .resume
            .as_ref()
            .and_then(|r| r.pacing_wait(self.clock))
            .is_none()
        {
            self.timers.cancel(Timer::Pacing);
        }
    }

    fn can_send_data_state(&self) -> bool {
        matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::LastAck
                | State::Closing
        ) && self.fin_seq.is_none()
    }

    /// Whether data may go out in SYN-RECEIVED (RFC 7413 §4.2.2): only in a Fast Open
    /// passive open whose SYN data was accepted (the cookie validated the client's address),
    /// after the first SYN-ACK and only while it has not had to go again.
    fn fo_early_send_allowed(&self) -> bool {
        self.fo_early_send
            && self.state == State::SynReceived
            && self.passive
            && !self.syn_pending
            && self.snd_nxt >= SndPos::AFTER_SYN
            && self.rto_count == 0
            && self.close_reason().is_none()
    }

    /// The SYN-ACK of a Fast Open passive open goes again (its timer expired, `timeout`, or
    /// the client sent its SYN again): the client dropped or will drop data sent behind the
    /// lost SYN-ACK (RFC 9293 §3.10.7.3: SYN-SENT takes no text without a SYN), so that data
    /// is marked lost and, like further answers, waits for the handshake; the retransmitted
    /// SYN-ACK carries none. A timeout also takes the congestion response of an RTO with
    /// data outstanding (RFC 5681 §3.1, RFC 6298 §5, as Linux's `tcp_enter_loss`).
    fn fo_synack_again(&mut self, now: Instant, timeout: bool) {
        if !self.fo_passive || self.snd_una > Pos::ZERO {
            return;
        }
        self.fo_early_send = false;
        if self.snd_nxt <= SndPos::AFTER_SYN {
            return;
        }
        if timeout {
            self.cc.on_rto(now, self.flight());
            self.delay_undo = None;
            self.rto_recovery = true;
            self.recover = self.snd_nxt;
        }
        self.sb.mark_all_lost();
    }

    fn send_new_data(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        // Data before the handshake completes: Fast Open's answer (RFC 7413 §4.2.2).
        let early = self.fo_early_send_allowed();
        if !early && !self.can_send_data_state() {
            return None;
        }
        let data_next = self.snd_nxt.offset();
        let unsent = self.queue.end().saturating_sub(data_next);
        let fin_wanted = self.fin_queued
            && matches!(
                self.state,
                State::FinWait1 | State::LastAck | State::Closing
            );
        if unsent == 0 && !fin_wanted {
            return None;
        }
        let mut opts = self.base_options(now);
        self.sack_blocks(&mut opts);
        let limit = self.payload_limit(&opts, buf.len());
        let full = self.effective_mss().min(limit).max(1);
        // Congestion-window validation after idle (RFC 5681 §4.1).
        if self.flight() == 0
            && let Some(last) = self.last_send
            && now.saturating_duration_since(last) > self.rtt.current_rto()
        {
            self.cc.on_idle_restart(now);
        }
        // Careful Resume's jump is paced (RFC 9959: "Transmission using an unvalidated CWND
        // MUST use pacing"); the pacing timer sends the next segment.
        if let Some(at) = self.resume.as_ref().and_then(|r| r.pacing_wait(now)) {
            self.timers.set(Timer::Pacing, at);
            return None;
        }
        let wnd_room = self.send_right_edge().saturating_sub(self.snd_nxt);
        let mut cwnd_room = self.cwnd_allowance();
        if early {
            // The SYN-ACK takes a whole segment of the initial window (RFC 7413 §4.2.2: data
            // "up to the congestion window"; Linux counts it as one packet), not just the
            // sequence number it already occupies in the flight.
            cwnd_room = cwnd_room.saturating_sub(self.effective_mss() as u64 - 1);
        }
        let room = wnd_room.min(cwnd_room).min(limit as u64) as usize;
        let mut len = self
            .queue
            .segment_len(data_next, room, self.cfg.consistent_segmentation);
        // Consistent segmentation (Hollywood §4.2): a message that fits in one segment goes
        // whole or waits; only the persist timer's override may split it, as it must to probe
        // a window smaller than the message.
        if len > 0
            && !self.sws_override
            && let Some(m) = self.queue.message_at(data_next)
            && m <= full
            && len < m
        {
            len = 0;
        }
        let all_fits = len as u64 == unsent;
        if len == 0 && !(unsent == 0 && fin_wanted) {
            if cwnd_room < full as u64 && wnd_room > 0 {
                // Held back by cwnd: the window was used up.
                let used = self.charged_use().max(self.flight());
                self.max_flight_recent = self.max_flight_recent.max(used);
            }
            return None;
        }
        if len > 0 && len < full && !all_fits {
            // Sender silly window avoidance (RFC 9293 §3.8.6.2.1): send a partial segment only
            // if it is at least half the largest window the peer offered, or the whole queue
            // fits, or it ends where a segment must end (a message, or any write with
            // consistent segmentation).
            let write_boundary =
                self.queue
                    .segment_len(data_next, usize::MAX, self.cfg.consistent_segmentation)
                    == len;
            let half_window = len as u64 >= self.max_snd_wnd / 2 && wnd_room < cwnd_room;
            if !write_boundary && !half_window && !self.sws_override {
                return None;
            }
        }
        // Nagle (RFC 896, RFC 9293 §3.7.4): with data in flight, hold back a partial segment
        // until a full segment's worth is queued. With consistent segmentation writes are never
        // packed together, so once that much is queued waiting cannot make the segment fuller
        // and would only send one write per round trip.
        let packing_possible = !(self.cfg.consistent_segmentation
            || self.queue.message_at(data_next).is_some())
            || unsent < full as u64;
        if self.cfg.nagle && len < full && self.flight() > 0 && len > 0 && packing_possible {
            return None;
        }
        let fin = fin_wanted && all_fits;
        let start = self.snd_nxt;
        let n = self.emit_data(now, buf, start, len, fin, &opts, false)?;
        let end = start + len + u64::from(fin);
        self.sb.on_send(start, end, fin, now);
        if self.flight() == 0 {
            self.unacked_since = Some(now);
        }
        self.snd_nxt = end;
        if let Some(r) = self.resume.as_mut() {
            r.on_send(now, start.get(), end.get(), self.rtt.srtt());
        }
        if fin {
            self.fin_seq = Some(end - 1u64);
        }
        self.max_flight_recent = self.max_flight_recent.max(self.flight());
        if !self.timers.is_armed(Timer::Retransmission) {
            self.arm_rto(now);
        }
        // New data restarts the loss probe timer (RFC 8985 §7.2).
        self.timers.cancel(Timer::LossProbe);
        self.timers.cancel(Timer::Persist);
        Some(n)
    }

    /// Tail loss probe (RFC 8985 §7.3): one segment of new data if there is any and the peer's
    /// window allows, else the last segment sent once more; either way regardless of cwnd.
    /// The ACK it draws lets RACK find losses at the tail of a flight, which no later segment
    /// would reveal, in about two round trips instead of an RTO.
    fn send_tail_loss_probe(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        let mut opts = self.base_options(now);
        self.sack_blocks(&mut opts);
        let limit = self.payload_limit(&opts, buf.len());
        if limit == 0 {
            return None;
        }
        let data_next = self.snd_nxt.offset();
        let unsent = self.queue.end().saturating_sub(data_next);
        let wnd_room = self.send_right_edge().saturating_sub(self.snd_nxt);
        let room = wnd_room.min(limit as u64).min(self.effective_mss() as u64) as usize;
        let mut new_len = if self.can_send_data_state() && unsent > 0 {
            self.queue
                .segment_len(data_next, room, self.cfg.consistent_segmentation)
        } else {
            0
        };
        // A message is not split to make a probe (Hollywood §4.2): probe with the last
        // segment instead.
        let full = limit.min(self.effective_mss());
        if self
            .queue
            .message_at(data_next)
            .is_some_and(|m| m <= full && new_len < m)
        {
            new_len = 0;
        }
        let n = if new_len > 0 {
            let fin_wanted = self.fin_queued
                && matches!(
                    self.state,
                    State::FinWait1 | State::LastAck | State::Closing
                );
            let fin = fin_wanted && new_len as u64 == unsent;
            let start = self.snd_nxt;
            let n = self.emit_data(now, buf, start, new_len, fin, &opts, false)?;
            let end = start + new_len + u64::from(fin);
            self.sb.on_send(start, end, fin, now);
            self.snd_nxt = end;
            if fin {
                self.fin_seq = Some(end - 1u64);
            }
            self.tlp.is_retrans = false;
            self.tlp.probe = None;
            n
        } else {
            let last = self.sb.last_unsacked()?;
            self.fit_sack_blocks(&mut opts, last, buf.len());
            let limit = self.payload_limit(&opts, buf.len());
            let (index, start, end, fin) = self.sb.limit_segment_tail(last, limit as u64)?;
            let payload_len = (end - start - u64::from(fin)) as usize;
            // A probe resends a segment nothing shows lost.
            self.replace_expired(now, start.offset(), payload_len, false);
            let n = self.emit_data(now, buf, start, payload_len, fin, &opts, true)?;
            self.sb.on_retransmit(index, now);
            self.counters.packets_retransmitted += 1;
            self.counters.bytes_retransmitted += payload_len as u64;
            self.tlp.is_retrans = true;
            self.tlp.probe = Some((start, end));
            n
        };
        self.tlp.end_seq = Some(self.snd_nxt);
        self.tlp.sampled = false;
        self.counters.tail_loss_probes += 1;
        self.trace(TraceEvent::TailLossProbe {
            retransmission: self.tlp.is_retrans,
        });
        // After a probe the RTO, not another probe, guards the flight (RFC 8985 §7.3).
        self.timers.cancel(Timer::Retransmission);
        self.arm_rto(now);
        Some(n)
    }

    /// Zero-window probe: one byte of new data beyond the window, or the outstanding probe byte
    /// again (RFC 9293 §3.8.6.1).
    fn send_zero_window_probe(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        let usable = self.send_right_edge().saturating_sub(self.snd_nxt);
        if usable > 0 && self.zwp_seq.is_none() {
            // Override timeout of sender SWS avoidance (RFC 9293 §3.8.6.2.1): send what fits.
            self.sws_override = true;
            let r = self.send_new_data(now, buf);
            self.sws_override = false;
            self.persist_backoff += 1;
            return r;
        }
        let opts = self.base_options(now);
        let start = match self.zwp_seq {
            Some(s) if s >= self.snd_una => {
                // The same probe byte again: a retransmission for Karn's rule.
                self.sb.on_resend_at(s, now);
                s
            }
            _ => {
                let data_next = self.snd_nxt.offset();
                if self.queue.end() <= data_next || self.fin_seq.is_some() {
                    return None;
                }
                let s = self.snd_nxt;
                self.sb.on_send(s, s + 1u64, false, now);
                self.snd_nxt += 1u64;
                self.zwp_seq = Some(s);
                s
            }
        };
        let repeated = start < self.snd_nxt - 1u64;
        let n = self.emit_data(now, buf, start, 1, false, &opts, repeated)?;
        self.probe_unanswered_since.get_or_insert(now);
        self.counters.zero_window_probes += 1;
        self.trace(TraceEvent::WindowProbe);
        self.persist_backoff += 1;
        self.update_send_timers(now);
        Some(n)
    }

    /// The sequence number of a segment without data (an ACK, an abort's RST): SND.NXT
    /// (RFC 9293 §3.10.7.4), except while a zero-window probe's byte is outstanding. That
    /// byte lies beyond the peer's window, and a closed window accepts a segment only at
    /// SEG.SEQ = RCV.NXT (RFC 9293 §3.10.7.4): numbered after it, an ACK is dropped unread
    /// (Linux does), so it never answers the peer's keepalive probes — a kernel peer that
    /// paused its reads reset the connection for want of an answer (lab test
    /// `dead_peer_lab::userspace_tcp`). Numbered at the probe's byte, the peer's RCV.NXT, it
    /// is accepted.
    fn empty_segment_seq(&self) -> SndPos {
        match self.zwp_seq {
            Some(probe) if probe >= self.snd_una => probe,
            _ => self.snd_nxt,
        }
    }

    fn send_ack(&mut self, now: Instant, buf: &mut [u8], seq: SndPos) -> Option<usize> {
        let mut opts = self.base_options(now);
        self.sack_blocks(&mut opts);
        let window = self.window_to_advertise();
        let hdr = self.header(seq, TcpFlags::ACK, window);
        let n = wire::write_packet(buf, &hdr, &opts, 0, |_| {})?;
        self.on_ack_sent();
        self.counters.packets_sent += 1;
        Some(n)
    }
}

// ------------------------------------------------------------ memory budget (crate::mem)

impl Connection {
    /// Payload bytes held: (send queue, received data). In uTCP mode the received data is
    /// what is queued for the application; the receive buffer then keeps counts only.
    pub(crate) fn memory_held(&self) -> (usize, usize) {
        let recv = match &self.unordered {
            Some(u) => u.bytes(),
            None => self.recv.used(),
        };
        (self.queue.len(), recv)
    }

    fn memory_total_held(&self) -> usize {
        let (send, recv) = self.memory_held();
        send + recv
    }

    pub(crate) fn memory_charged(&self) -> usize {
        self.mem.charged()
    }

    /// Brings the endpoint's account up to date (after every operation).
    pub(crate) fn sync_memory(&mut self) {
        let held = self.memory_total_held();
        self.mem.sync(held);
    }

    /// The receive buffer size in effect: the configured one, or less when the budget
    /// (above its pressure threshold) lets the buffer hold less.
    fn recv_buffer_now(&self) -> usize {
        let (_, recv) = self.memory_held();
        let room = self.mem.window_room(recv, self.memory_total_held());
        self.cfg
            .recv_buffer
            .min(self.recv.used().saturating_add(room))
    }

    /// Bytes the send queue may still grow by under the budget.
    fn send_room(&self) -> usize {
        let (send, _) = self.memory_held();
        self.mem.room(send, self.memory_total_held())
    }

    /// Bytes the received data may still grow by under the budget.
    fn recv_room(&self) -> usize {
        let (_, recv) = self.memory_held();
        self.mem.room(recv, self.memory_total_held())
    }

    /// Queues a whole message if the budget admits all of it (`WouldBlock` otherwise).
    fn insert_admitted(
        &mut self,
        body: &[u8],
        tag: WriteTag,
        lifetime: Option<Duration>,
    ) -> Result<(), Error> {
        if self.admit_write(body).len() < body.len() {
            return Err(Error::WouldBlock);
        }
        self.queue.insert_message(self.clock, body, tag, lifetime)
    }

    /// The prefix of a write the budget admits (the send buffer's own limit applies after).
    fn admit_write<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        let room = self.send_room();
        if data.len() > room && self.queue.free() > room {
            self.mem.note_limited_write();
        }
        &data[..data.len().min(room)]
    }

    /// How many of `len` bytes of segment text at stream offset `from` (already trimmed to
    /// the window) the budget admits: the new bytes they add must fit the room. In-order text
    /// that does not fit first makes room by dropping this connection's out-of-order ranges,
    /// highest first (Linux's `tcp_prune_ofo_queue`; reneging is allowed by RFC 2018 §8).
    /// What is cut off is dropped and acknowledged at once; the sender retransmits it.
    fn admit_text(&mut self, from: u64, len: usize) -> usize {
        let mut room = self.recv_room() as u64;
        if len as u64 <= room {
            // The common case, without looking at what is new.
            return len;
        }
        let end = from + len as u64;
        let new_bytes =
            |r: &RecvBuffer| -> u64 { r.uncovered(from, end).iter().map(|(s, e)| e - s).sum() };
        if new_bytes(&self.recv) <= room {
            return len;
        }
        // In-order text only, and only when dropping every out-of-order byte would make room
        // (in uTCP mode those bytes are already the application's: nothing to prune).
        let prune = self.unordered.is_none() && from <= self.recv.next() && {
            let ooo = self.recv.ooo_bytes();
            let (send, recv) = self.memory_held();
            let best = self
                .mem
                .room(recv.saturating_sub(ooo), send + recv.saturating_sub(ooo));
            best as u64 > room
        };
        if prune {
            let mut pruned = false;
            while new_bytes(&self.recv) > room && self.recv.prune_last_ooo() > 0 {
                pruned = true;
                room = self.recv_room() as u64;
            }
            if pruned {
                self.mem.note_drop();
                self.ack_now = true;
            }
            if new_bytes(&self.recv) <= room {
                return len;
            }
        }
        self.mem.note_drop();
        self.ack_now = true;
        // Cut where the new bytes reach the room.
        let mut left = room;
        for (s, e) in self.recv.uncovered(from, end) {
            if e - s >= left {
                return (s + left - from) as usize;
            }
            left -= e - s;
        }
        len
    }
}
