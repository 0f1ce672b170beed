//! [`Tls`]: one TLS 1.3 connection over an in-order byte stream, sans-IO.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::mem;
use std::sync::Arc;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, ReadEarlyData, TransmitTlsData,
    UnbufferedConnectionCommon, UnbufferedStatus,
};
use rustls::{
    ClientConfig, ConnectionTrafficSecrets, HandshakeKind, ProtocolVersion, ServerConfig,
    SupportedCipherSuite,
};

use crate::TlsError;
use crate::error::alert;
use crate::padding::{PaddingSealer, RESERVED_NUMBERS};
use crate::record::{
    self, HEADER_LEN, MAX_INNER_PLAINTEXT_LEN, MAX_PLAINTEXT_LEN, MAX_RECORD_LEN, RecordKeys,
    TAG_LEN, content_type,
};
use crate::unordered::{
    CursorAt, Fragment, MAX_SPARE, NUMBER_PREFIX_LEN, OutOfOrderConfig, OutOfOrderRecord,
    ReplayWindow, SegmentStore, encode_prefix, number_flag, prefix_flags,
};

/// Handshake message types the record layer handles after the handshake (RFC 8446 §4).
mod handshake_type {
    pub const NEW_SESSION_TICKET: u8 = 4;
    pub const KEY_UPDATE: u8 = 24;
}

/// Longest post-handshake message accepted: a NewSessionTicket with a ticket and extensions
/// of the largest sizes RFC 8446 §4.6.1 allows, plus its fixed fields.
const MAX_POST_HANDSHAKE_MESSAGE: usize = 4 + 4 + 1 + 255 + 2 + 0xffff + 2 + 0xffff;

/// KeyUpdates, and user_canceled alerts, accepted without application data between them: each
/// costs work and sends nothing useful, so a peer that floods them is cut off (rustls and
/// BoringSSL bound them alike).
const MAX_KEY_UPDATES_WITHOUT_DATA: u32 = 32;
const MAX_USER_CANCELED_WITHOUT_DATA: u32 = 4;

/// Counters of one connection's record layer (records sealed and opened by squarepeg after
/// the handshake; rustls's handshake records are not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsStats {
    /// Protected records sealed: application data, KeyUpdate, alerts.
    pub records_sealed: u64,
    /// Protected records opened.
    pub records_opened: u64,
    /// KeyUpdate messages sent (RFC 8446 §4.6.3), ours and answers to the peer's.
    pub key_updates_sent: u64,
    /// KeyUpdate messages received.
    pub key_updates_received: u64,
    /// Application plaintext bytes sealed.
    pub bytes_sealed: u64,
    /// Application plaintext bytes opened.
    pub bytes_opened: u64,
    /// Records opened and delivered out of order, ahead of a hole in the stream (Minion §6).
    pub records_out_of_order: u64,
    /// Content bytes of those records.
    pub bytes_out_of_order: u64,
    /// Out-of-order candidates that looked like a record header but did not authenticate
    /// under any number tried (a false match in ciphertext, or forged bytes).
    pub candidates_rejected: u64,
    /// Out-of-order candidates that opened but stay for the in-order stream (not whole
    /// application data, e.g. part of a frame longer than a record, or a KeyUpdate).
    pub candidates_left_in_order: u64,
    /// Segment bytes refused because the out-of-order store was full (they come again).
    pub segment_bytes_refused: u64,
    /// Records skipped in the in-order stream because their number was already delivered
    /// (a replacement's copy, or the original of one, from a peer that replaces records;
    /// from any other peer such a record fails the stream, docs/wire.md §5).
    pub duplicates_skipped: u64,
    /// Whether this side seals numbered records (docs/wire.md §5).
    pub sending_numbered: bool,
    /// Whether the peer's records are numbered (its switch marker was read).
    pub receiving_numbered: bool,
    /// Times the in-order stream stopped at bytes that did not authenticate (out-of-order
    /// receiver of numbered records: a splice of original and replacement, until the peer
    /// announces the range).
    pub records_held: u64,
    /// Bytes of replaced ranges the in-order stream skipped after such a stop.
    pub spliced_bytes_skipped: u64,
    /// Replaced-range announcements not kept (too many ahead of the in-order stream).
    pub replaced_ranges_dropped: u64,
    /// Padding records sealed for inconsistent retransmissions (see [`crate::padding`]).
    pub padding_records: u64,
    /// Their bytes.
    pub padding_bytes: u64,
    /// Replacements the padder declined (no reserved numbers left, or too many ranges not
    /// yet announced).
    pub padding_declined: u64,
    /// Client: plaintext bytes sent as early data (0-RTT, RFC 8446 §2.3) with the
    /// ClientHello.
    pub early_data_sent: u64,
    /// Server: plaintext bytes of early data received and delivered.
    pub early_data_received: u64,
    /// Server: plaintext bytes sealed before the client's Finished (0.5-RTT data, RFC 8446
    /// §4.4.4), by rustls under the first application traffic key.
    pub half_rtt_sealed: u64,
    /// This side's close_notify carried the stream offset it starts at (numbered records,
    /// docs/wire.md §5).
    pub close_sent_at_offset: bool,
    /// The peer's close_notify carried its stream offset, and was read there: nothing before
    /// it was cut out of the stream.
    pub close_received_at_offset: bool,
}

/// What became of TLS 1.3 early data (0-RTT, RFC 8446 §2.3 and §4.2.10) on a connection.
///
/// Early data can be replayed by an attacker who copies the client's first flight; the
/// server side here accepts it only with single-use tickets (rustls accepts early data only
/// with its stateful session store, whose tickets are taken on use), so a replayed flight
/// gets its early data rejected: the replayer cannot finish the handshake, and nothing of it
/// is delivered twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EarlyData {
    /// No early data on this connection (client: none offered, or no ticket allowing it;
    /// server: none received).
    None,
    /// Client: this many plaintext bytes went out as early data; the handshake has not
    /// finished yet.
    Offered(usize),
    /// Client: the server accepted the early data (these bytes need not be sent again).
    Accepted(usize),
    /// Client: the server rejected the early data: these bytes were not processed and must
    /// be sent again after the handshake if they are still wanted (RFC 8446 §4.2.10).
    Rejected(usize),
    /// Server: this many plaintext bytes of early data were received and delivered, ahead of
    /// the client's Finished.
    Received(u64),
}

/// Early data state, both sides.
#[derive(Debug, Default)]
struct Early {
    /// Client: plaintext to send as early data behind the ClientHello (taken by the first
    /// flight).
    offer: Option<Vec<u8>>,
    /// Client: bytes of it rustls sealed as early data.
    sent: usize,
    /// Client: rustls sent EndOfEarlyData, which it does exactly when the server's
    /// EncryptedExtensions accepted the early data (RFC 8446 §4.5).
    end_of_early_data: bool,
    /// Client: the handshake finished (the outcome is known).
    settled: bool,
    /// Client: the ClientHello is still to be made ([`Tls::client_deferred`]).
    hello_pending: bool,
    /// Server: early data bytes delivered.
    received: u64,
    /// Server: rustls may seal application data now, before the client's Finished (its
    /// handshake stopped in `WriteTraffic` with nothing left to read).
    half_rtt_ready: bool,
}

/// Length of an EndOfEarlyData record's protected content: the message's 4-byte header and
/// empty body, the inner content type and the AEAD tag (all TLS 1.3 suites have 16-byte tags).
/// No other message the client seals during the handshake is this short (Finished carries a
/// hash of 32 bytes or more), so a record of this length in the client's flight after the
/// ServerHello is rustls's EndOfEarlyData, which rustls sends only when the server accepted
/// its early data — the unbuffered API does not say so otherwise.
const END_OF_EARLY_DATA_RECORD_LEN: usize = 4 + 1 + TAG_LEN;

/// One TLS 1.3 connection, client or server, over an in-order byte stream. Sans-IO: it is fed
/// the peer's bytes ([`Tls::push_ciphertext`], [`Tls::process`]) and polled for its own
/// ([`Tls::poll_output`], [`Tls::seal`]).
///
/// rustls (its unbuffered API) runs the handshake; when it completes, the traffic secrets and
/// sequence numbers are taken from rustls (`dangerous_into_kernel_connection`) and from then on
/// this type seals and opens every record itself ([`crate::record`]), answers and sends
/// KeyUpdates, hands NewSessionTickets to rustls (so resumption works) and sends and receives
/// alerts.
///
/// # Order on the wire
/// Every byte [`Tls::poll_output`] and [`Tls::seal`] append must go on the wire in the order
/// they were appended, across both methods: records carry implicit sequence numbers and a
/// KeyUpdate changes the key of every record after it. To keep that simple, [`Tls::seal`]
/// first appends anything [`Tls::poll_output`] would have returned (the handshake's last flight,
/// a pending KeyUpdate), so a caller that writes what it gets in order is always right.
pub struct Tls {
    phase: Phase,
    inbox: Inbox,
    /// Bytes for the wire that are not application data, in order: rustls's handshake records,
    /// or a fatal alert.
    control: Vec<u8>,
    /// Properties of the finished handshake (read from rustls before the hand-over).
    session: Option<Session>,
    /// A KeyUpdate to send before the next record (`Some(request_update)`): ours, or the answer
    /// to the peer's update_requested (RFC 8446 §4.6.3).
    pending_key_update: Option<bool>,
    close_requested: bool,
    close_sent: bool,
    peer_closed: bool,
    failed: Option<TlsError>,
    /// A post-handshake handshake message not yet complete (RFC 8446 §5.1: messages may be
    /// fragmented across records).
    handshake_message: Vec<u8>,
    /// KeyUpdates and user_canceled alerts received since the last application data.
    key_updates_without_data: u32,
    user_canceled_without_data: u32,
    stats: TlsStats,
    max_record_plaintext: usize,
    padding_granularity: usize,
    key_update_threshold: Option<u64>,
    nonces: Option<Vec<(u64, [u8; 12])>>,
    numbering: Numbering,
    /// The out-of-order receive path, when enabled.
    ooo: Option<Box<OutOfOrder>>,
    /// Seals padding for inconsistent retransmissions from numbers reserved here, once asked
    /// for ([`Tls::padding_sealer`]).
    padding: Option<PaddingSealer>,
    /// Early data (0-RTT) and 0.5-RTT data.
    early: Early,
    /// Bytes handed out for the wire so far ([`Tls::poll_output`], [`Tls::seal`],
    /// [`Tls::seal_half_rtt`]), less those withdrawn ([`Tls::withdraw_output`]): the stream
    /// offset of the next byte when the caller knows it ([`Tls::set_output_in_order`]).
    bytes_out: u64,
    /// The caller knows the stream offset of every byte it is given: a numbered
    /// close_notify then says where it starts (docs/wire.md §5).
    output_in_order: bool,
}

/// An application data record being sealed in place ([`Tls::begin_record`]).
#[derive(Debug)]
#[must_use = "the record is sealed by `Tls::finish_record`"]
pub struct RecordSlot {
    /// Where its header goes.
    start: usize,
    /// Where its plaintext starts.
    content: usize,
    origin: OutputOrigin,
}

impl RecordSlot {
    /// The offset in `out` where the record's plaintext starts.
    pub fn content_start(&self) -> usize {
        self.content
    }
}

/// Where a call's output starts: `out[start]` goes on the wire at stream offset `offset`.
#[derive(Clone, Copy, Debug)]
struct OutputOrigin {
    start: usize,
    offset: u64,
}

/// Numbered records (docs/wire.md §5), both directions.
#[derive(Debug, Default, Clone, Copy)]
struct Numbering {
    /// The peer may switch to numbered records (this side announced that it reads them).
    accept: bool,
    /// The switch marker is to be sent with the next output.
    send_requested: bool,
    /// Records sealed from now on are numbered.
    send_on: bool,
    /// The peer may replace retransmitted records ([`Tls::expect_replacements`]).
    replacements_expected: bool,
    /// The peer's switch marker was read: its records are numbered.
    receive_on: bool,
}

/// What the out-of-order path holds.
struct OutOfOrder {
    config: OutOfOrderConfig,
    store: SegmentStore,
    /// Records delivered out of order that the in-order stream has not reached, by offset.
    delivered: DeliveredRecords,
    /// A copy of the candidate being opened (the ciphertext stays intact for the in-order
    /// path if it is not delivered).
    scratch: Vec<u8>,
    /// Mean wire length of records read in order (for predictions), as sum and count.
    seen_len: (u64, u64),
    /// The in-order stream stopped at this offset on bytes that do not authenticate: with
    /// numbered records, a late copy of original bytes spliced with their replacement, until
    /// the sender's announcement of the replaced range lets it skip them (docs/wire.md §5.1).
    held: Option<u64>,
    /// Ranges the peer replaced (start -> end), ahead of the in-order stream and up to a
    /// window behind it (where copies of records found ahead were read).
    replaced: BTreeMap<u64, u64>,
    /// From a peer that replaces records: where the records the in-order stream passed were
    /// (opened, delivered out of order before, or skipped as copies), at most a window
    /// behind. A record found again in order is a copy only where these say so.
    places: VecDeque<Place>,
    /// The stream is held on a record already delivered elsewhere, and ranges were announced
    /// since: the next [`Tls::push_segment`] looks at it again.
    recheck_hold: bool,
}

/// Where a numbered record was read in the stream.
#[derive(Debug, Clone, Copy)]
struct Place {
    epoch: u64,
    number: u64,
    offset: u64,
}

/// Places kept at most (a window of the smallest records).
const MAX_PLACES: usize = 16_384;

impl OutOfOrder {
    /// How far behind the in-order stream a copy's other place may lie: the window the
    /// sender's records in flight fit in, plus a record.
    fn reach(&self) -> u64 {
        self.config.window.saturating_add(MAX_RECORD_LEN) as u64
    }

    /// The in-order stream passed record `number` (of receive key `epoch`) at `offset`.
    fn note_place(&mut self, epoch: u64, number: u64, offset: u64) {
        let floor = offset.saturating_sub(self.reach());
        while self
            .places
            .front()
            .is_some_and(|p| p.offset < floor || self.places.len() >= MAX_PLACES)
        {
            self.places.pop_front();
        }
        self.places.push_back(Place {
            epoch,
            number,
            offset,
        });
    }

    /// Every place record `number` of key `epoch` is known at: passed by the in-order
    /// stream, or delivered out of order ahead of it.
    fn places_of(&self, epoch: u64, number: u64) -> impl Iterator<Item = u64> + '_ {
        let passed = self
            .places
            .iter()
            .filter(move |p| p.epoch == epoch && p.number == number)
            .map(|p| p.offset);
        let ahead = self
            .delivered
            .queue
            .iter()
            .map(|(at, d)| (*at, d))
            .chain(self.delivered.others.iter().map(|(at, d)| (*at, d)))
            .filter(move |(_, d)| d.epoch == epoch && d.number == number)
            .map(|(at, _)| at);
        passed.chain(ahead)
    }
}

/// Replaced ranges kept (ahead of the in-order stream and up to a window behind it), at most:
/// more are in flight only with a window of that many padding records.
const MAX_REPLACED_RANGES: usize = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Delivered {
    wire_len: usize,
    number: u64,
    /// The receive key it was opened under ([`KeyEpoch::epoch`]).
    epoch: u64,
}

/// Records delivered out of order that the in-order stream has not reached, by offset. Most
/// are delivered in stream order: those join the back of a queue (adding one, finding the
/// last and taking the first need no search); any other goes to a map, so that no order of
/// arrival makes an operation cost more than a search.
#[derive(Debug, Default)]
struct DeliveredRecords {
    /// By increasing offset.
    queue: VecDeque<(u64, Delivered)>,
    others: BTreeMap<u64, Delivered>,
}

impl DeliveredRecords {
    fn insert(&mut self, offset: u64, delivered: Delivered) {
        if self.queue.back().is_none_or(|&(last, _)| last < offset) {
            match self.others.get_mut(&offset) {
                Some(d) => *d = delivered,
                None => self.queue.push_back((offset, delivered)),
            }
        } else if let Ok(i) = self.queue.binary_search_by_key(&offset, |&(at, _)| at) {
            self.queue[i].1 = delivered;
        } else {
            self.others.insert(offset, delivered);
        }
    }

    fn get(&self, offset: u64) -> Option<&Delivered> {
        let in_queue = match self.queue.back() {
            Some((last, d)) if *last == offset => return Some(d),
            Some(&(last, _)) if last > offset => self
                .queue
                .binary_search_by_key(&offset, |&(at, _)| at)
                .ok()
                .map(|i| &self.queue[i].1),
            _ => None,
        };
        if in_queue.is_some() || self.others.is_empty() {
            return in_queue;
        }
        self.others.get(&offset)
    }

    /// The one with the greatest offset below `offset`.
    fn before(&self, offset: u64) -> Option<(u64, &Delivered)> {
        let i = self.queue.partition_point(|&(at, _)| at < offset);
        let queued = i
            .checked_sub(1)
            .map(|i| (self.queue[i].0, &self.queue[i].1));
        let other = self
            .others
            .range(..offset)
            .next_back()
            .map(|(&at, d)| (at, d));
        match (queued, other) {
            (Some(q), Some(o)) => Some(if q.0 > o.0 { q } else { o }),
            (q, o) => q.or(o),
        }
    }

    /// Whether one starts inside `(offset, offset + len)`: a record there authenticated, so
    /// a record at `offset` claiming `len` bytes lies about its length.
    fn starts_inside(&self, offset: u64, len: usize) -> bool {
        !(self.queue.is_empty() && self.others.is_empty())
            && self
                .before(offset.saturating_add(len as u64))
                .is_some_and(|(at, _)| at > offset)
    }

    /// Forgets those below `floor` (the in-order stream passed them).
    fn drop_below(&mut self, floor: u64) {
        if self.queue.front().is_none_or(|&(at, _)| at >= floor) && self.others.is_empty() {
            return;
        }
        while self.queue.front().is_some_and(|&(at, _)| at < floor) {
            self.queue.pop_front();
        }
        while let Some(first) = self.others.first_entry()
            && *first.key() < floor
        {
            first.remove();
        }
    }

    /// Takes the one at `offset` (the in-order stream's), forgetting those below it.
    #[inline]
    fn take_at(&mut self, offset: u64) -> Option<Delivered> {
        if self.queue.is_empty() && self.others.is_empty() {
            return None;
        }
        self.drop_below(offset);
        if self.queue.front().is_some_and(|&(at, _)| at == offset) {
            return self.queue.pop_front().map(|(_, d)| d);
        }
        match self.others.first_entry() {
            Some(first) if *first.key() == offset => Some(first.remove()),
            _ => None,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.queue.len() + self.others.len()
    }
}

/// Records between numbered-record candidates with this many numbers near the limit start
/// a KeyUpdate early, so that a sender whose records are reordered on the way never needs a
/// KeyUpdate in the middle of one write.
const NUMBERED_KEY_UPDATE_MARGIN: u64 = 128;

enum Phase {
    Client(Box<UnbufferedClientConnection>),
    Server(Box<UnbufferedServerConnection>),
    Traffic(Box<Traffic>),
    /// Only while the handshake is handed over; a failed hand-over leaves it.
    HandedOver,
}

struct Traffic {
    kernel: Kernel,
    tx: KeyEpoch,
    rx: KeyEpoch,
    /// Receive numbers of `rx` opened (in order or out of order): each at most once.
    rx_replay: ReplayWindow,
    /// With numbered records: the receive key before the last KeyUpdate, for records sealed
    /// before it that a reordering sender put after it.
    rx_prev: Option<(KeyEpoch, ReplayWindow)>,
    /// With numbered records: the receive key after the peer's next KeyUpdate, derived ahead,
    /// for records sealed after it that a reordering sender (or an inconsistent
    /// retransmission, docs/wire.md §5.1) put before it.
    rx_next: Option<(KeyEpoch, ReplayWindow)>,
    suite: SupportedCipherSuite,
    /// Records one key may seal (the suite's confidentiality limit, RFC 8446 §5.5).
    confidentiality_limit: u64,
}

struct KeyEpoch {
    /// Shared with the padder while it seals under this key.
    keys: Arc<RecordKeys>,
    /// Sequence number of the next record (RFC 8446 §5.3).
    seq: u64,
    /// 0 for the first application traffic key, one more after each KeyUpdate.
    epoch: u64,
}

enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn update_tx_secret(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_tx_secret(),
            Kernel::Server(k) => k.update_tx_secret(),
        }
    }

    fn update_rx_secret(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_rx_secret(),
            Kernel::Server(k) => k.update_rx_secret(),
        }
    }

    fn protocol_version(&self) -> ProtocolVersion {
        match self {
            Kernel::Client(k) => k.protocol_version(),
            Kernel::Server(k) => k.protocol_version(),
        }
    }
}

struct Session {
    peer_certificates: Option<Vec<CertificateDer<'static>>>,
    alpn_protocol: Option<Vec<u8>>,
    handshake_kind: Option<HandshakeKind>,
}

/// The peer's bytes not yet consumed: `buf[head..end]`. `buf` beyond `end` is room already
/// initialised (a buffer read into is not zeroed again; see [`Tls::process_buffer`]).
#[derive(Default)]
struct Inbox {
    buf: Vec<u8>,
    head: usize,
    end: usize,
    /// Stream offset of `buf[head]`: bytes consumed so far.
    consumed: u64,
    /// During the handshake: `buf[head..head + exposed]` has been given to rustls, which may
    /// keep part of it (handshake messages decrypted in place) until a message is complete.
    exposed: usize,
}

impl Inbox {
    fn unconsumed(&self) -> usize {
        self.end - self.head
    }

    /// The bytes not yet consumed.
    fn data(&self) -> &[u8] {
        &self.buf[self.head..self.end]
    }

    fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.head..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.head += n;
        self.consumed += n as u64;
        self.exposed = self.exposed.saturating_sub(n);
        if self.head == self.end {
            self.head = 0;
            self.end = 0;
        }
    }

    fn compact(&mut self) {
        if self.head > 0 {
            self.buf.copy_within(self.head..self.end, 0);
            self.end -= self.head;
            self.head = 0;
        }
    }

    /// Appends `data` (after [`Inbox::compact`]).
    fn append(&mut self, data: &[u8]) {
        let end = self.end + data.len();
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        self.buf[self.end..end].copy_from_slice(data);
        self.end = end;
    }

    /// Makes `bytes[..len]` the inbox's bytes, from `head` on; returns the buffer it held.
    fn replace(&mut self, bytes: Vec<u8>, head: usize, len: usize) -> Vec<u8> {
        debug_assert!(head <= len && len <= bytes.len());
        self.head = head;
        self.end = len;
        mem::replace(&mut self.buf, bytes)
    }

    fn clear(&mut self) {
        self.head = 0;
        self.end = 0;
        self.exposed = 0;
    }

    /// Gives rustls the next complete record (or, if its header is invalid, everything, so
    /// that rustls reports the error). Returns whether anything new was exposed.
    fn expose_next_record(&mut self) -> bool {
        let start = self.head + self.exposed;
        let available = self.end - start;
        if available < HEADER_LEN {
            return false;
        }
        let len = usize::from(u16::from_be_bytes([
            self.buf[start + 3],
            self.buf[start + 4],
        ]));
        if len > record::MAX_CIPHERTEXT_LEN {
            self.exposed += available;
            return true;
        }
        if available < HEADER_LEN + len {
            return false;
        }
        self.exposed += HEADER_LEN + len;
        true
    }
}

/// How a handshake step ended.
enum HandshakeProgress {
    /// rustls needs more of the peer's bytes.
    Blocked,
    /// The handshake is complete and nothing is left to encode: hand over.
    Complete,
    /// The peer sent close_notify.
    PeerClosed,
}

/// The two sides' `process_tls_records` and early data, which rustls defines per side.
trait ProcessTlsRecords<Data> {
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Data>;

    /// Client: seals the early data on offer behind the ClientHello, if rustls allows it.
    fn send_early_data(
        transmit: &mut TransmitTlsData<'_, Data>,
        early: &mut Early,
        out: &mut Vec<u8>,
    );

    /// Server: takes the early data rustls opened; returns the bytes to discard.
    fn read_early_data(
        read: &mut ReadEarlyData<'_, '_, Data>,
        early: &mut Early,
        plaintext: &mut Vec<u8>,
    ) -> Result<usize, rustls::Error>;
}

impl ProcessTlsRecords<ClientConnectionData> for UnbufferedConnectionCommon<ClientConnectionData> {
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(incoming)
    }

    fn send_early_data(
        transmit: &mut TransmitTlsData<'_, ClientConnectionData>,
        early: &mut Early,
        out: &mut Vec<u8>,
    ) {
        let Some(data) = early.offer.take() else {
            return;
        };
        // `None` without a ticket that allows early data (or with `enable_early_data` off).
        let Some(mut writer) = transmit.may_encrypt_early_data() else {
            return;
        };
        // rustls takes as much as the ticket's max_early_data_size allows and seals it as
        // ordinary records (header, content, inner type, tag), one per call here; a refusal
        // (nothing more allowed) only ends the early data.
        let _ = seal_with_rustls(&data, out, |chunk, room| {
            let n = writer.encrypt(chunk, room).map_err(|e| format!("{e:?}"))?;
            let taken = n.saturating_sub(MIN_RECORD);
            early.sent += taken;
            Ok((n, taken == chunk.len()))
        });
    }

    fn read_early_data(
        _read: &mut ReadEarlyData<'_, '_, ClientConnectionData>,
        _early: &mut Early,
        _plaintext: &mut Vec<u8>,
    ) -> Result<usize, rustls::Error> {
        Err(rustls::Error::General(
            "a client does not receive early data".into(),
        ))
    }
}

impl ProcessTlsRecords<ServerConnectionData> for UnbufferedConnectionCommon<ServerConnectionData> {
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(incoming)
    }

    fn send_early_data(
        _transmit: &mut TransmitTlsData<'_, ServerConnectionData>,
        _early: &mut Early,
        _out: &mut Vec<u8>,
    ) {
    }

    fn read_early_data(
        read: &mut ReadEarlyData<'_, '_, ServerConnectionData>,
        early: &mut Early,
        plaintext: &mut Vec<u8>,
    ) -> Result<usize, rustls::Error> {
        let mut discard = 0;
        while let Some(record) = read.next_record() {
            let record = record?;
            discard += record.discard;
            early.received += record.payload.len() as u64;
            plaintext.extend_from_slice(record.payload);
        }
        Ok(discard)
    }
}

/// Has rustls seal `data` as application-data records appended to `out`, one record of at
/// most [`MAX_PLAINTEXT_LEN`] bytes per `encrypt` call, with room for its overhead.
/// `encrypt(chunk, room)` returns the bytes it wrote and whether to go on.
fn seal_with_rustls(
    data: &[u8],
    out: &mut Vec<u8>,
    mut encrypt: impl FnMut(&[u8], &mut [u8]) -> Result<(usize, bool), String>,
) -> Result<(), String> {
    for chunk in data.chunks(MAX_PLAINTEXT_LEN) {
        let start = out.len();
        out.resize(start + MIN_RECORD + chunk.len() + 64, 0);
        match encrypt(chunk, &mut out[start..]) {
            Ok((n, go_on)) => {
                out.truncate(start + n);
                if !go_on {
                    break;
                }
            }
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Client: notes rustls's EndOfEarlyData among the records just encoded (see
/// [`END_OF_EARLY_DATA_RECORD_LEN`]).
fn note_end_of_early_data(early: &mut Early, records: &[u8]) {
    if early.sent == 0 {
        return;
    }
    let mut rest = records;
    while rest.len() >= HEADER_LEN {
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if rest[0] == content_type::APPLICATION_DATA && len == END_OF_EARLY_DATA_RECORD_LEN {
            early.end_of_early_data = true;
        }
        rest = rest.get(HEADER_LEN + len..).unwrap_or_default();
    }
}

/// Appends the handshake record rustls has ready to `out`.
fn encode<Data>(encoder: &mut EncodeTlsData<'_, Data>, out: &mut Vec<u8>) {
    let start = out.len();
    let mut room = 1024;
    loop {
        out.resize(start + room, 0);
        match encoder.encode(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return;
            }
            Err(EncodeError::InsufficientSize(e)) => room = e.required_size,
            Err(EncodeError::AlreadyEncoded) => {
                out.truncate(start);
                return;
            }
        }
    }
}

/// Runs rustls's handshake over the records in `inbox`, one record at a time, so that it stops
/// exactly where the handshake completes: the records after it (application data,
/// NewSessionTicket, KeyUpdate, alerts arriving in the same read) stay in `inbox` for the
/// record layer.
fn drive_handshake<Data>(
    conn: &mut UnbufferedConnectionCommon<Data>,
    inbox: &mut Inbox,
    control: &mut Vec<u8>,
    plaintext: &mut Vec<u8>,
    early: &mut Early,
) -> Result<HandshakeProgress, rustls::Error>
where
    UnbufferedConnectionCommon<Data>: ProcessTlsRecords<Data>,
{
    enum Next {
        Continue,
        Blocked,
        WriteTraffic,
        PeerClosed,
    }
    loop {
        let exposed = &mut inbox.buf[inbox.head..inbox.head + inbox.exposed];
        let UnbufferedStatus { mut discard, state } = conn.process(exposed);
        let next = match state {
            Err(e) => {
                inbox.consume(discard);
                drain_alert(conn, inbox, control);
                return Err(e);
            }
            Ok(ConnectionState::EncodeTlsData(mut encoder)) => {
                let start = control.len();
                encode(&mut encoder, control);
                note_end_of_early_data(early, &control[start..]);
                Next::Continue
            }
            Ok(ConnectionState::TransmitTlsData(mut transmit)) => {
                // The encoded records are already queued in `control`, in order; early data
                // goes right behind the ClientHello.
                UnbufferedConnectionCommon::<Data>::send_early_data(&mut transmit, early, control);
                transmit.done();
                Next::Continue
            }
            Ok(ConnectionState::ReadTraffic(mut read)) => {
                while let Some(record) = read.next_record() {
                    let record = record?;
                    discard += record.discard;
                    plaintext.extend_from_slice(record.payload);
                }
                Next::Continue
            }
            Ok(ConnectionState::BlockedHandshake) => Next::Blocked,
            Ok(ConnectionState::WriteTraffic(_)) => Next::WriteTraffic,
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => Next::PeerClosed,
            Ok(ConnectionState::ReadEarlyData(mut read)) => {
                match UnbufferedConnectionCommon::<Data>::read_early_data(
                    &mut read, early, plaintext,
                ) {
                    Ok(more) => discard += more,
                    Err(e) => {
                        inbox.consume(discard);
                        return Err(e);
                    }
                }
                Next::Continue
            }
            Ok(other) => {
                let state = format!("{other:?}");
                inbox.consume(discard);
                return Err(rustls::Error::General(format!(
                    "unbuffered connection state {state} not handled"
                )));
            }
        };
        inbox.consume(discard);
        match next {
            Next::Continue => {}
            Next::PeerClosed => return Ok(HandshakeProgress::PeerClosed),
            // A server may write (half-RTT) before the client's Finished: that is not the end.
            Next::WriteTraffic if !conn.is_handshaking() => return Ok(HandshakeProgress::Complete),
            Next::Blocked | Next::WriteTraffic => {
                if !inbox.expose_next_record() {
                    early.half_rtt_ready = matches!(next, Next::WriteTraffic);
                    return Ok(HandshakeProgress::Blocked);
                }
            }
        }
    }
}

/// After rustls failed, takes the alert it queued (RFC 8446 §6.2) into `control`: the next
/// call hands out queued records before reading anything. Only that one call: a further one
/// would make rustls read the failed bytes again. rustls is shown the same bytes as before
/// (its handshake reassembly refers to them).
fn drain_alert<Data>(
    conn: &mut UnbufferedConnectionCommon<Data>,
    inbox: &mut Inbox,
    control: &mut Vec<u8>,
) where
    UnbufferedConnectionCommon<Data>: ProcessTlsRecords<Data>,
{
    let exposed = &mut inbox.buf[inbox.head..inbox.head + inbox.exposed];
    let UnbufferedStatus { discard, state } = conn.process(exposed);
    if let Ok(ConnectionState::EncodeTlsData(mut encoder)) = state {
        encode(&mut encoder, control);
    }
    inbox.consume(discard);
}

impl Tls {
    /// A client connection to `server_name` (a DNS name or an IP address; what the certificate
    /// is checked against, except with [`crate::config::Trust::PinnedSha256`] and
    /// [`crate::config::Trust::Insecure`]). The ClientHello is ready in [`Tls::poll_output`].
    pub fn client(config: Arc<ClientConfig>, server_name: &str) -> Result<Tls, TlsError> {
        Self::client_with_early_data(config, server_name, &[]).map(|(tls, _)| tls)
    }

    /// A client connection that offers `early_data` as TLS 1.3 early data (0-RTT) behind its
    /// ClientHello, as far as a stored session ticket for the server allows (the config must
    /// have `enable_early_data` on and a resumption store holding a ticket from the same
    /// server, with the server's `max_early_data_size` in it). Returns the connection and how
    /// many bytes of `early_data` (a prefix) went out as early data: 0 without such a ticket.
    /// Whether the server accepted them is known once the handshake is done
    /// ([`Tls::early_data`]); if it rejected them, they must be sent again as ordinary data.
    ///
    /// Early data can be replayed by an attacker: offer only what is safe to process twice
    /// (the servers here accept it only with single-use tickets, see [`EarlyData`]).
    pub fn client_with_early_data(
        config: Arc<ClientConfig>,
        server_name: &str,
        early_data: &[u8],
    ) -> Result<(Tls, usize), TlsError> {
        let mut tls = Self::client_deferred(config, server_name)?;
        let sent = tls.start_client(early_data)?;
        Ok((tls, sent))
    }

    /// A client connection whose ClientHello is made later: by [`Tls::start_client`], which
    /// may offer early data then, or else by the first [`Tls::poll_output`] or
    /// [`Tls::process`]. For a caller that learns what to send early only after creating
    /// the connection.
    pub fn client_deferred(config: Arc<ClientConfig>, server_name: &str) -> Result<Tls, TlsError> {
        if !config.enable_secret_extraction {
            return Err(TlsError::Config(
                "the client configuration must enable secret extraction".into(),
            ));
        }
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|e| TlsError::Config(format!("server name {server_name:?}: {e}")))?;
        let conn = UnbufferedClientConnection::new(config, name)?;
        let mut tls = Tls::new(Phase::Client(Box::new(conn)));
        tls.early.hello_pending = true;
        Ok(tls)
    }

    /// Whether this is a client from [`Tls::client_deferred`] whose ClientHello is not made
    /// yet.
    pub fn is_hello_pending(&self) -> bool {
        self.early.hello_pending
    }

    /// Makes the ClientHello of a [`Tls::client_deferred`] client, offering `early_data` as
    /// [`Tls::client_with_early_data`] does; returns how many bytes of it went as early data.
    /// Once the ClientHello is made, offers nothing and returns 0.
    pub fn start_client(&mut self, early_data: &[u8]) -> Result<usize, TlsError> {
        if !std::mem::take(&mut self.early.hello_pending) {
            return Ok(0);
        }
        if !early_data.is_empty() {
            self.early.offer = Some(early_data.to_vec());
        }
        let result = self.process(&mut Vec::new());
        self.early.offer = None;
        result.map(|()| self.early.sent)
    }

    /// A server connection; it speaks once the ClientHello has been pushed and processed.
    pub fn server(config: Arc<ServerConfig>) -> Result<Tls, TlsError> {
        if !config.enable_secret_extraction {
            return Err(TlsError::Config(
                "the server configuration must enable secret extraction".into(),
            ));
        }
        if config.max_early_data_size > 0 && config.ticketer.enabled() {
            // rustls would not accept early data anyway; say why rather than ignore it.
            return Err(TlsError::Config(
                "early data needs single-use (stateful) tickets: no ticketer with \
                 max_early_data_size > 0"
                    .into(),
            ));
        }
        let conn = UnbufferedServerConnection::new(config)?;
        Ok(Tls::new(Phase::Server(Box::new(conn))))
    }

    fn new(phase: Phase) -> Tls {
        Tls {
            phase,
            inbox: Inbox::default(),
            control: Vec::new(),
            session: None,
            pending_key_update: None,
            close_requested: false,
            close_sent: false,
            peer_closed: false,
            failed: None,
            handshake_message: Vec::new(),
            key_updates_without_data: 0,
            user_canceled_without_data: 0,
            stats: TlsStats::default(),
            max_record_plaintext: MAX_PLAINTEXT_LEN,
            padding_granularity: 0,
            key_update_threshold: None,
            nonces: None,
            padding: None,
            numbering: Numbering::default(),
            ooo: None,
            early: Early::default(),
            bytes_out: 0,
            output_in_order: false,
        }
    }

    /// Whether the connection failed (a fatal error, ours or the peer's alert): it will not
    /// carry data any more.
    pub fn has_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Whether the handshake has not finished yet (also after it failed).
    pub fn is_handshaking(&self) -> bool {
        matches!(
            self.phase,
            Phase::Client(_) | Phase::Server(_) | Phase::HandedOver
        )
    }

    /// Takes ciphertext from the in-order byte stream and returns how many bytes of `data`
    /// were taken (a prefix); push the rest again after [`Tls::process`].
    ///
    /// The buffer holds at most one maximal record ([`record::MAX_RECORD_LEN`], 5 + 2^14 + 256
    /// bytes) beyond what has been processed (during the handshake rustls may also keep parts
    /// of a handshake message it has processed). [`Tls::process`] consumes every complete
    /// record, so after it at least the rest of the record in progress is taken: pushing and
    /// processing alternately always makes progress.
    ///
    /// After the peer's close_notify (RFC 8446 §6.1: later data is ignored) or a fatal
    /// error, everything is taken and dropped.
    pub fn push_ciphertext(&mut self, data: &[u8]) -> usize {
        if self.peer_closed || self.failed.is_some() {
            return data.len();
        }
        self.inbox.compact();
        let room = (self.inbox.exposed + MAX_RECORD_LEN).saturating_sub(self.inbox.unconsumed());
        let taken = room.min(data.len());
        self.inbox.append(&data[..taken]);
        taken
    }

    /// Bytes of memory its buffers hold (ciphertext waiting to be opened, output not yet
    /// taken, a handshake message in progress), by capacity.
    pub fn buffer_capacity(&self) -> usize {
        self.inbox.buf.capacity() + self.control.capacity() + self.handshake_message.capacity()
    }

    /// Gives back the memory of buffers that hold nothing now, as an idle connection should:
    /// the next bytes allocate again. Nothing waiting is dropped.
    pub fn release_idle(&mut self) {
        if self.inbox.unconsumed() == 0 && self.inbox.exposed == 0 {
            self.inbox.buf = Vec::new();
            self.inbox.clear();
        }
        if self.control.is_empty() {
            self.control = Vec::new();
        }
        if self.handshake_message.is_empty() {
            self.handshake_message = Vec::new();
        }
    }

    /// [`Tls::push_ciphertext`] and [`Tls::process_with`] for the in-order bytes
    /// `buf[..len]` (a read), without copying them where it can: once nothing is pending in
    /// the inbox, `buf` becomes the inbox's buffer and its whole records are opened where they
    /// lie; only what completes a record begun in an earlier read is copied. On return `buf`
    /// is a buffer at least as long as before (the inbox's former one, not zeroed again) for
    /// the next read. Errors as [`Tls::process_with`].
    pub fn process_buffer(
        &mut self,
        buf: &mut Vec<u8>,
        len: usize,
        deliver: &mut dyn FnMut(&[u8]),
    ) -> Result<(), TlsError> {
        let read_len = buf.len();
        let len = len.min(read_len);
        let mut pos = 0;
        let mut result = Ok(());
        while pos < len && result.is_ok() && !self.peer_closed {
            let traffic = matches!(self.phase, Phase::Traffic(_));
            if traffic && self.inbox.unconsumed() == 0 && self.inbox.exposed == 0 {
                let read = mem::take(buf);
                *buf = self.inbox.replace(read, pos, len);
                if buf.len() < read_len {
                    // The inbox gave its memory back while idle (`Tls::release_idle`).
                    buf.resize(read_len, 0);
                }
                result = self.process_with(deliver);
                break;
            }
            // Only what completes the record in progress (its header first), when the inbox
            // can tell; otherwise (the handshake) as much as it takes.
            let want = if traffic {
                self.inbox_wants()
            } else {
                usize::MAX
            };
            let end = pos + want.min(len - pos);
            let taken = self.push_ciphertext(&buf[pos..end]);
            pos += taken;
            result = self.process_with(deliver);
            if taken == 0 && result.is_ok() {
                // The inbox took nothing and opened nothing: never drop the rest silently.
                debug_assert!(false, "the inbox is stuck");
                result = Err(self.fail_with_alert(TlsError::BadRecord));
            }
        }
        if buf.len() < read_len {
            buf.resize(read_len, 0);
        }
        result
    }

    /// Runs the handshake and opens every complete record pushed so far, appending
    /// application plaintext to `plaintext` (records opened before an error stay appended).
    /// Handshake output, KeyUpdates and alerts it causes wait in [`Tls::poll_output`].
    ///
    /// After a fatal error every later call returns the same error.
    pub fn process(&mut self, plaintext: &mut Vec<u8>) -> Result<(), TlsError> {
        self.process_with(&mut |opened| plaintext.extend_from_slice(opened))
    }

    /// As [`Tls::process`], handing the application plaintext to `deliver`, in order, where
    /// it was opened (a record's content, decrypted in place) instead of appending it to a
    /// buffer: a receiver with a buffer of its own saves a copy.
    pub fn process_with(&mut self, deliver: &mut dyn FnMut(&[u8])) -> Result<(), TlsError> {
        if self.early.hello_pending {
            self.start_client(&[])?;
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.inbox.consumed == 0
            && matches!(self.phase, Phase::Client(_) | Phase::Server(_))
            && !starts_like_tls(self.inbox.data())
        {
            // Before any key, an alert goes in the clear (RFC 8446 §6): a squarepeg peer
            // without TLS reads it as a TLS record where its first frame was due.
            let [major, minor] = record::LEGACY_RECORD_VERSION;
            self.control.extend_from_slice(&[
                content_type::ALERT,
                major,
                minor,
                0,
                2,
                2,
                alert::UNEXPECTED_MESSAGE,
            ]);
            return Err(self.fail(TlsError::NotTls, None));
        }
        // rustls hands out application data only from its own buffers during the handshake.
        let mut handshake_plaintext = Vec::new();
        self.early.half_rtt_ready = false;
        let progress = match &mut self.phase {
            Phase::Client(conn) => drive_handshake(
                &mut ***conn,
                &mut self.inbox,
                &mut self.control,
                &mut handshake_plaintext,
                &mut self.early,
            ),
            Phase::Server(conn) => drive_handshake(
                &mut ***conn,
                &mut self.inbox,
                &mut self.control,
                &mut handshake_plaintext,
                &mut self.early,
            ),
            Phase::Traffic(_) => return self.open_records(deliver),
            Phase::HandedOver => return Err(TlsError::Closed),
        };
        if !handshake_plaintext.is_empty() {
            deliver(&handshake_plaintext);
        }
        match progress {
            Ok(HandshakeProgress::Blocked) => Ok(()),
            Ok(HandshakeProgress::Complete) => {
                self.hand_over()?;
                self.open_records(deliver)
            }
            Ok(HandshakeProgress::PeerClosed) => {
                self.peer_closed = true;
                Err(self.fail(TlsError::Closed, None))
            }
            Err(e) => Err(self.fail(TlsError::from(e), None)),
        }
    }

    /// Takes the secrets and the kernel connection from rustls (RFC 8446 §7.3 traffic
    /// secrets, with the sequence numbers rustls reached: a server has already sealed its
    /// NewSessionTickets).
    fn hand_over(&mut self) -> Result<(), TlsError> {
        let handed = match mem::replace(&mut self.phase, Phase::HandedOver) {
            Phase::Client(conn) => {
                let session = session_of(&**conn);
                conn.dangerous_into_kernel_connection()
                    .map(|(secrets, kernel)| (secrets, Kernel::Client(kernel), session))
            }
            Phase::Server(conn) => {
                let session = session_of(&**conn);
                conn.dangerous_into_kernel_connection()
                    .map(|(secrets, kernel)| (secrets, Kernel::Server(kernel), session))
            }
            other => {
                self.phase = other;
                return Ok(());
            }
        };
        let (secrets, kernel, session) = handed.map_err(|e| self.fail(e.into(), None))?;
        self.early.settled = true;
        self.early.half_rtt_ready = false;
        if kernel.protocol_version() != ProtocolVersion::TLSv1_3 {
            let e = TlsError::Handshake(rustls::Error::General(
                "squarepeg's record layer speaks TLS 1.3 only".into(),
            ));
            return Err(self.fail(e, None));
        }
        let suite = match &kernel {
            Kernel::Client(k) => k.negotiated_cipher_suite(),
            Kernel::Server(k) => k.negotiated_cipher_suite(),
        };
        let tx = RecordKeys::from_secrets(&secrets.tx.1);
        let rx = RecordKeys::from_secrets(&secrets.rx.1);
        let (tx, rx) = match (tx, rx) {
            (Ok(tx), Ok(rx)) => (tx, rx),
            (Err(e), _) | (_, Err(e)) => return Err(self.fail(e, None)),
        };
        // Every handshake message was complete before the key change (rustls checks that
        // none spans it, RFC 8446 §5.1), so nothing given to rustls is still held.
        let held = mem::take(&mut self.inbox.exposed);
        debug_assert_eq!(held, 0, "rustls holds bytes across the hand-over");
        self.inbox.consume(held);
        self.session = Some(session);
        self.phase = Phase::Traffic(Box::new(Traffic {
            kernel,
            tx: KeyEpoch {
                keys: Arc::new(tx),
                seq: secrets.tx.0,
                epoch: 0,
            },
            rx: KeyEpoch {
                keys: Arc::new(rx),
                seq: secrets.rx.0,
                epoch: 0,
            },
            rx_replay: ReplayWindow::starting_at(secrets.rx.0),
            rx_prev: None,
            rx_next: None,
            suite,
            confidentiality_limit: suite
                .tls13()
                .map_or(1 << 24, |s| s.common.confidentiality_limit),
        }));
        Ok(())
    }

    /// Opens every complete record in the inbox (RFC 8446 §5.2), handing application data to
    /// `deliver`.
    fn open_records(&mut self, deliver: &mut dyn FnMut(&[u8])) -> Result<(), TlsError> {
        while !self.peer_closed {
            if !matches!(self.phase, Phase::Traffic(_)) {
                return Ok(());
            }
            let available_len = self.inbox.unconsumed();
            if available_len < HEADER_LEN {
                break;
            }
            let offset = self.inbox.consumed;
            let record_len = match record::protected_record_len(self.inbox.data()) {
                Ok(len) => len,
                Err(e) => return self.hold_or_fail(e),
            };
            if self.splices_replaced_range(offset, record_len) {
                return self.hold_or_fail(TlsError::Decrypt);
            }
            if available_len < record_len {
                break;
            }
            let in_replaced = self.in_replaced_range(offset);
            let replacing = self.numbering.replacements_expected;
            let numbered = self.numbering.receive_on;
            // Where records were, for telling a replacement's copy from a replay (below).
            let track_places = replacing && numbered;
            let Phase::Traffic(traffic) = &mut self.phase else {
                return Ok(());
            };
            let available = self.inbox.data_mut();
            if let Some(ooo) = &mut self.ooo {
                if let Some(d) = ooo.delivered.take_at(offset) {
                    // Opened and delivered out of order already (the same bytes: the store
                    // keeps one copy of every range). A positional record must be the one
                    // the stream expects here.
                    if d.wire_len != record_len || (!numbered && d.number != traffic.rx.seq) {
                        return Err(self.fail_with_alert(TlsError::Decrypt));
                    }
                    if track_places {
                        ooo.note_place(d.epoch, d.number, offset);
                    }
                    traffic.rx.seq = d.number + 1;
                    self.stats.records_opened += 1;
                    self.key_updates_without_data = 0;
                    self.user_canceled_without_data = 0;
                    self.inbox.consume(record_len);
                    continue;
                }
                if ooo.delivered.starts_inside(offset, record_len) {
                    // Its header lies about its length (a record that authenticated starts
                    // inside): it cannot authenticate, and opening it where it lies would
                    // overwrite the records behind it, which a stream that skips a replaced
                    // range may still read.
                    return self.hold_or_fail(TlsError::Decrypt);
                }
                let (sum, count) = &mut ooo.seen_len;
                if *count >= 1 << 16 {
                    *sum /= 2;
                    *count /= 2;
                }
                *sum += record_len as u64;
                *count += 1;
            }
            let record_bytes = &mut available[..record_len];
            let opened = if self.numbering.receive_on {
                open_numbered(traffic, record_bytes)
            } else {
                open_positional(traffic, record_bytes)
            };
            let (kind, skip, content_len) = match opened {
                Ok(InOrderRecord::Opened {
                    kind,
                    skip,
                    len,
                    epoch,
                    number,
                }) => {
                    if track_places && let Some(ooo) = &mut self.ooo {
                        ooo.note_place(epoch, number, offset);
                    }
                    (kind, skip, len)
                }
                Ok(InOrderRecord::Spent(number))
                    if (replacing || in_replaced)
                        && (!track_places || self.is_copy(number, offset)) =>
                {
                    // A copy of a record already delivered: the same plaintext, since no
                    // number is ever sealed twice. A peer that replaces records puts copies
                    // of records in flight in the ranges it replaces (docs/wire.md §5.1), so
                    // either copy may come first.
                    let Phase::Traffic(traffic) = &mut self.phase else {
                        return Ok(());
                    };
                    if !numbered {
                        // A positional record's number is its place: the next one follows.
                        traffic.rx.seq = number + 1;
                    }
                    let epoch = traffic.rx.epoch;
                    if track_places && let Some(ooo) = &mut self.ooo {
                        ooo.note_place(epoch, number, offset);
                    }
                    self.stats.duplicates_skipped += 1;
                    self.inbox.consume(record_len);
                    continue;
                }
                // From a peer that replaces records, a copy outside what it announced
                // replaced so far: the announcement may still be on its way. The stream
                // waits for it (bytes that do not authenticate wait the same way).
                Ok(InOrderRecord::Spent(_)) if track_places => {
                    return self.hold_or_fail(TlsError::Decrypt);
                }
                // A peer that never replaces records puts each one in the stream once: a
                // record whose number was delivered from elsewhere was put here by someone
                // else, in place of the record that belongs here. Skipping it would lose that
                // one without a word; fail as for bytes that do not authenticate.
                Ok(InOrderRecord::Spent(_)) => {
                    return Err(self.fail_with_alert(TlsError::Decrypt));
                }
                Err(e) if self.numbering.receive_on => return self.hold_or_fail(e),
                Err(e) => return Err(self.fail_with_alert(e)),
            };
            self.stats.records_opened += 1;
            let content_start = self.inbox.head + HEADER_LEN + skip;
            let content = &self.inbox.buf[content_start..content_start + content_len];
            // RFC 8446 §5.1: handshake messages are not interleaved with other record types.
            if kind != content_type::HANDSHAKE && !self.handshake_message.is_empty() {
                return Err(self.fail_with_alert(TlsError::UnexpectedMessage));
            }
            match kind {
                content_type::APPLICATION_DATA => {
                    // Zero-length application data records are allowed (RFC 8446 §5.4); from
                    // a peer that may number its records, the positional one is the switch
                    // marker (docs/wire.md §5).
                    if content.is_empty() && self.numbering.accept && !self.numbering.receive_on {
                        self.numbering.receive_on = true;
                        self.stats.receiving_numbered = true;
                        if let Err(e) = next_rx_epoch(traffic).map(|n| traffic.rx_next = Some(n)) {
                            return Err(self.fail(e, Some(alert::INTERNAL_ERROR)));
                        }
                    }
                    deliver(content);
                    self.stats.bytes_opened += content_len as u64;
                    self.key_updates_without_data = 0;
                    self.user_canceled_without_data = 0;
                }
                content_type::HANDSHAKE => {
                    // RFC 8446 §5.1: no zero-length handshake fragments.
                    if content.is_empty() {
                        return Err(self.fail_with_alert(TlsError::UnexpectedMessage));
                    }
                    self.handshake_message.extend_from_slice(content);
                    self.inbox.consume(record_len);
                    self.handle_post_handshake_messages()?;
                    continue;
                }
                content_type::ALERT => {
                    // RFC 8446 §5.1: one alert per record, never fragmented. A numbered
                    // close_notify may say where it starts (docs/wire.md §5): read anywhere
                    // else, it was moved there — the stream before it cut short.
                    let description = match *content {
                        [_level, description] => description,
                        [_level, alert::CLOSE_NOTIFY, ref at @ ..] if numbered && at.len() == 8 => {
                            let at = u64::from_be_bytes(at.try_into().expect("8 bytes"));
                            if at != offset {
                                return Err(self.fail_with_alert(TlsError::Decrypt));
                            }
                            self.stats.close_received_at_offset = true;
                            alert::CLOSE_NOTIFY
                        }
                        _ => return Err(self.fail_with_alert(TlsError::BadRecord)),
                    };
                    match description {
                        alert::CLOSE_NOTIFY => self.peer_closed = true,
                        // RFC 8446 §6.1: a closure alert; close_notify follows.
                        alert::USER_CANCELED => {
                            self.user_canceled_without_data += 1;
                            if self.user_canceled_without_data > MAX_USER_CANCELED_WITHOUT_DATA {
                                return Err(self.fail_with_alert(TlsError::UnexpectedMessage));
                            }
                        }
                        // RFC 8446 §6: every other alert is an error alert, whatever its
                        // level; nothing is sent back.
                        description => {
                            return Err(self.fail(TlsError::Alert { description }, None));
                        }
                    }
                }
                _ => return Err(self.fail_with_alert(TlsError::UnexpectedMessage)),
            }
            self.inbox.consume(record_len);
        }
        if self.peer_closed {
            // RFC 8446 §6.1: data after close_notify is ignored.
            self.inbox.clear();
        }
        Ok(())
    }

    /// A record read in order did not authenticate (`e`). Fatal, except for an out-of-order
    /// receiver of numbered records from a peer that may replace records
    /// ([`Tls::expect_replacements`]): its inconsistent retransmission may have met a
    /// late copy of the original bytes, and the receiver's first-copy-wins store then holds
    /// a splice of both. The stream stops there (its bytes go back to the store, where the
    /// out-of-order scan still finds every whole record after them) until the peer's
    /// announcement of the range lets it skip ([`Tls::note_replaced`]). Nothing unauthenticated
    /// is delivered either way; a hold that outgrows the store fails with `e`.
    fn hold_or_fail(&mut self, e: TlsError) -> Result<(), TlsError> {
        if !self.numbering.receive_on || !self.numbering.replacements_expected {
            return Err(self.fail_with_alert(e));
        }
        let Some(ooo) = &mut self.ooo else {
            return Err(self.fail_with_alert(e));
        };
        let at = self.inbox.consumed;
        let refused = ooo.store.insert(at, at, self.inbox.data());
        self.inbox.clear();
        if refused > 0 {
            return Err(self.fail_with_alert(e));
        }
        ooo.held = Some(at);
        self.stats.records_held += 1;
        Ok(())
    }

    /// Whether record `number` of the current receive key, found again at `offset` (in
    /// order) after it was delivered from elsewhere, is a copy its sender put there: a
    /// replacing sender puts copies of records in flight only inside the ranges it replaces
    /// (docs/wire.md §5.1), so either this place is in one, or every other place the record
    /// was read from is (this one is then its original). Anything else — a second place
    /// outside every replaced range, or a place not known — is a record put here by someone
    /// else, in place of the one that belongs here, or a copy whose range is not announced
    /// yet: not skipped.
    fn is_copy(&self, number: u64, offset: u64) -> bool {
        if self.in_replaced_range(offset) {
            return true;
        }
        let (Some(ooo), Phase::Traffic(traffic)) = (&self.ooo, &self.phase) else {
            return false;
        };
        let epoch = traffic.rx.epoch;
        let mut found = false;
        for at in ooo.places_of(epoch, number) {
            if at != offset && !self.in_replaced_range(at) {
                return false;
            }
            found = true;
        }
        found
    }

    /// Whether `offset` lies in a range the peer announced replaced.
    fn in_replaced_range(&self, offset: u64) -> bool {
        self.ooo.as_ref().is_some_and(|ooo| {
            ooo.replaced
                .range(..=offset)
                .next_back()
                .is_some_and(|(_, &end)| end > offset)
        })
    }

    /// Whether a record of `record_len` bytes at `offset` reaches past the end of a range
    /// the peer replaced that holds `offset`: records never straddle a replaced range's end,
    /// so it is a splice.
    fn splices_replaced_range(&self, offset: u64, record_len: usize) -> bool {
        let Some(ooo) = &self.ooo else {
            return false;
        };
        ooo.replaced
            .range(..=offset)
            .next_back()
            .is_some_and(|(_, &end)| end > offset && offset + record_len as u64 > end)
    }

    /// A held stream inside a range the peer replaced skips to the range's end: everything
    /// whole and authentic in it was delivered out of order, the rest was the peer's to drop
    /// (only messages with a deadline and padding are replaced). Returns whether it moved.
    fn skip_held_range(&mut self) -> bool {
        let Some(ooo) = &mut self.ooo else {
            return false;
        };
        let Some(at) = ooo.held else {
            return false;
        };
        let Some((_, &end)) = ooo.replaced.range(..=at).next_back() else {
            return false;
        };
        if end <= at {
            return false;
        }
        ooo.store.drop_below(end);
        ooo.delivered.drop_below(end);
        ooo.held = None;
        ooo.recheck_hold = false;
        self.inbox.clear();
        self.inbox.consumed = end;
        self.stats.spliced_bytes_skipped += end - at;
        true
    }

    /// Handles the complete handshake messages received after the handshake (RFC 8446 §4.6).
    fn handle_post_handshake_messages(&mut self) -> Result<(), TlsError> {
        loop {
            let buffered = &self.handshake_message;
            if buffered.len() < 4 {
                return Ok(());
            }
            let kind = buffered[0];
            let len = u32::from_be_bytes([0, buffered[1], buffered[2], buffered[3]]) as usize;
            if len > MAX_POST_HANDSHAKE_MESSAGE {
                return Err(self.fail_with_alert(TlsError::BadRecord));
            }
            if buffered.len() < 4 + len {
                return Ok(());
            }
            let rest_after = buffered.len() - 4 - len;
            let Phase::Traffic(traffic) = &mut self.phase else {
                return Ok(());
            };
            match kind {
                handshake_type::KEY_UPDATE => {
                    let &[request_update] = &buffered[4..4 + len] else {
                        return Err(self.fail_with_alert(TlsError::BadRecord));
                    };
                    if request_update > 1 {
                        return Err(self.fail_with_alert(TlsError::IllegalParameter));
                    }
                    // RFC 8446 §5.1: a KeyUpdate ends its record (no message spans the change).
                    if rest_after != 0 {
                        return Err(self.fail_with_alert(TlsError::UnexpectedMessage));
                    }
                    self.key_updates_without_data += 1;
                    if self.key_updates_without_data > MAX_KEY_UPDATES_WITHOUT_DATA {
                        return Err(self.fail_with_alert(TlsError::UnexpectedMessage));
                    }
                    let next = match traffic.rx_next.take() {
                        Some(next) => Ok(next),
                        None => next_rx_epoch(traffic),
                    };
                    let (next, next_replay) = match next {
                        Ok(next) => next,
                        Err(e) => return Err(self.fail(e, Some(alert::INTERNAL_ERROR))),
                    };
                    let previous = mem::replace(&mut traffic.rx, next);
                    let previous_replay = mem::replace(&mut traffic.rx_replay, next_replay);
                    // A reordering sender may put records sealed before its KeyUpdate after it.
                    traffic.rx_prev = self
                        .numbering
                        .receive_on
                        .then_some((previous, previous_replay));
                    if self.numbering.receive_on {
                        match next_rx_epoch(traffic) {
                            Ok(next) => traffic.rx_next = Some(next),
                            Err(e) => return Err(self.fail(e, Some(alert::INTERNAL_ERROR))),
                        }
                    }
                    self.stats.key_updates_received += 1;
                    // RFC 8446 §4.6.3: answer update_requested with one KeyUpdate of our own
                    // before our next application data; several requests while we are silent
                    // get one answer.
                    if request_update == 1
                        && self.pending_key_update.is_none()
                        && !self.close_requested
                        && !self.close_sent
                    {
                        self.pending_key_update = Some(false);
                    }
                }
                handshake_type::NEW_SESSION_TICKET => {
                    let Kernel::Client(kernel) = &mut traffic.kernel else {
                        return Err(self.fail_with_alert(TlsError::UnexpectedMessage));
                    };
                    if let Err(e) = kernel.handle_new_session_ticket(&buffered[4..4 + len]) {
                        let description = match e {
                            rustls::Error::InvalidMessage(_) => alert::DECODE_ERROR,
                            _ => alert::INTERNAL_ERROR,
                        };
                        return Err(self.fail(TlsError::Handshake(e), Some(description)));
                    }
                }
                _ => return Err(self.fail_with_alert(TlsError::UnexpectedMessage)),
            }
            self.handshake_message.drain(..4 + len);
        }
    }

    /// Marks the connection failed with `error`, queues `alert` (fatal, RFC 8446 §6.2) if the
    /// record layer is running, drops the peer's unprocessed bytes, and returns `error`.
    fn fail(&mut self, error: TlsError, alert: Option<u8>) -> TlsError {
        let traffic = matches!(self.phase, Phase::Traffic(_));
        if let (Some(description), false, true) = (alert, self.close_sent, traffic) {
            let mut sealed = Vec::new();
            self.seal_record(content_type::ALERT, &[2, description], 0, &mut sealed);
            self.control.extend_from_slice(&sealed);
            self.close_sent = true;
        }
        self.pending_key_update = None;
        self.inbox.clear();
        self.handshake_message.clear();
        self.failed = Some(error.clone());
        error
    }

    fn fail_with_alert(&mut self, error: TlsError) -> TlsError {
        let alert = error.alert();
        self.fail(error, alert)
    }

    /// Appends the bytes to send that are not application data: handshake records, a
    /// KeyUpdate (ours or the answer to the peer's), a fatal alert, close_notify.
    pub fn poll_output(&mut self, out: &mut Vec<u8>) {
        let origin = self.output_origin(out);
        self.poll_output_at(out, origin);
        self.note_output(out, origin);
    }

    /// The caller knows the stream offset of every byte this side hands out: it writes them
    /// to one byte stream in order (kernel TCP), or to a queue that may reorder or drop
    /// writes (the userspace TCP's tagged writes) and then withdraws what did not extend the
    /// stream ([`Tls::withdraw_output`]) and asks for close_notify only once every write
    /// before it has its place. A numbered close_notify then carries the stream offset it
    /// starts at, and a receiver that reads it anywhere else fails — an on-path attacker
    /// cannot truncate the stream by moving the genuine close_notify forward, which numbered
    /// records (read by number, not by place) would otherwise allow (docs/wire.md §5).
    pub fn set_output_in_order(&mut self, on: bool) {
        self.output_in_order = on;
    }

    /// `len` bytes handed out earlier never extend the stream: a write dropped unsent, or
    /// sent inside a range already sent (inconsistent retransmissions). The offset of what
    /// follows is that much lower ([`Tls::set_output_in_order`]).
    pub fn withdraw_output(&mut self, len: u64) {
        self.bytes_out = self.bytes_out.saturating_sub(len);
    }

    fn output_origin(&self, out: &[u8]) -> OutputOrigin {
        OutputOrigin {
            start: out.len(),
            offset: self.bytes_out,
        }
    }

    fn note_output(&mut self, out: &[u8], origin: OutputOrigin) {
        self.bytes_out = origin.offset + out.len().saturating_sub(origin.start) as u64;
    }

    fn poll_output_at(&mut self, out: &mut Vec<u8>, origin: OutputOrigin) {
        if self.early.hello_pending {
            // The error stays in `failed`; its alert (none before a ClientHello) is queued.
            let _ = self.start_client(&[]);
        }
        out.append(&mut self.control);
        if self.failed.is_some() || self.close_sent || !matches!(self.phase, Phase::Traffic(_)) {
            return;
        }
        if self.numbering.send_on && !self.close_requested && self.near_key_limit() {
            // A reordering sender rekeys ahead, between writes (see `seal`).
            self.pending_key_update.get_or_insert(false);
        }
        if let Some(request_peer) = self.pending_key_update
            && self.send_key_update(request_peer, out).is_err()
        {
            out.append(&mut self.control);
            return;
        }
        if self.numbering.send_requested && !self.numbering.send_on && !self.close_requested {
            // The switch marker: the last positional record (docs/wire.md §5).
            self.seal_record(content_type::APPLICATION_DATA, &[], 0, out);
            self.numbering.send_on = true;
            self.stats.sending_numbered = true;
        }
        self.reserve_padding_numbers();
        if self.close_requested {
            if self.needs_key_update() && self.send_key_update(false, out).is_err() {
                out.append(&mut self.control);
                return;
            }
            // RFC 8446 §6.1: close_notify (level is ignored in TLS 1.3; warning as usual).
            // Numbered, on an in-order stream: with the offset it starts at.
            let mut content = vec![1, alert::CLOSE_NOTIFY];
            if self.numbering.send_on && self.output_in_order {
                let at = origin.offset + (out.len() - origin.start) as u64;
                content.extend_from_slice(&at.to_be_bytes());
                self.stats.close_sent_at_offset = true;
            }
            self.seal_record(content_type::ALERT, &content, 0, out);
            self.close_sent = true;
        }
    }

    /// Seals `plaintext` as application data records of at most
    /// [`Tls::max_record_plaintext`] bytes each, appended to `out`; nothing for empty
    /// `plaintext`. First appends whatever [`Tls::poll_output`] has pending (the handshake's
    /// last flight, a pending KeyUpdate), and inserts a KeyUpdate itself when the key's
    /// record limit is reached (RFC 8446 §5.5): see [`Tls::sealed_len`].
    ///
    /// Errors: [`TlsError::NotReady`] during the handshake; [`TlsError::Closed`] after
    /// [`Tls::send_close_notify`] or a fatal error.
    pub fn seal(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), TlsError> {
        let origin = self.output_origin(out);
        let result = self.seal_at(plaintext, out, origin);
        self.note_output(out, origin);
        result
    }

    /// Starts one application data record at the end of `out`, to be sealed where its
    /// plaintext is written (no copy, unlike [`Tls::seal`]): appends what [`Tls::seal`]
    /// would first (pending [`Tls::poll_output`] bytes, a KeyUpdate due), then room for the
    /// record's header (and number). The caller appends the plaintext — at most
    /// [`Tls::record_room`] bytes, nothing else — and calls [`Tls::finish_record`].
    ///
    /// Errors as [`Tls::seal`].
    pub fn begin_record(&mut self, out: &mut Vec<u8>) -> Result<RecordSlot, TlsError> {
        let origin = self.output_origin(out);
        let result = self.seal_prologue(out, origin).and_then(|()| {
            if self.needs_key_update() {
                self.send_key_update(false, out)?;
            }
            Ok(())
        });
        if let Err(e) = result {
            self.note_output(out, origin);
            return Err(e);
        }
        let start = out.len();
        out.resize(start + HEADER_LEN + self.prefix_len(), 0);
        Ok(RecordSlot {
            start,
            content: out.len(),
            origin,
        })
    }

    /// The most plaintext bytes one application data record sealed now carries.
    pub fn record_room(&self) -> usize {
        self.chunk_len()
    }

    /// Seals the record [`Tls::begin_record`] started, over the plaintext appended to `out`
    /// since; with none, takes its room back and seals nothing. `starts_inside`: its first
    /// bytes continue a frame begun in the record before; `ends_inside`: its last frame
    /// continues in the next (an out-of-order receiver delivers only records of whole frames
    /// at once, docs/wire.md §5). Plaintext beyond [`Tls::record_room`] is sealed into
    /// further records (copied, as [`Tls::seal`] does).
    pub fn finish_record(
        &mut self,
        out: &mut Vec<u8>,
        slot: RecordSlot,
        starts_inside: bool,
        ends_inside: bool,
    ) {
        let content_len = out.len().saturating_sub(slot.content);
        if content_len == 0 {
            out.truncate(slot.start);
        } else if content_len > self.chunk_len() {
            // More than the caller was to write: sealed as `seal` would.
            let plaintext = out.split_off(slot.content);
            out.truncate(slot.start);
            let _ = self.seal_at(&plaintext, out, slot.origin);
        } else {
            let mut unit_flags = 0;
            if starts_inside {
                unit_flags |= number_flag::STARTS_INSIDE;
            }
            if ends_inside {
                unit_flags |= number_flag::ENDS_INSIDE;
            }
            self.seal_record_in_place(content_type::APPLICATION_DATA, unit_flags, out, slot.start);
            self.stats.bytes_sealed += content_len as u64;
        }
        self.note_output(out, slot.origin);
    }

    /// What [`Tls::seal`] checks and appends before its records.
    fn seal_prologue(&mut self, out: &mut Vec<u8>, origin: OutputOrigin) -> Result<(), TlsError> {
        if self.failed.is_some() || self.close_requested || self.close_sent {
            return Err(TlsError::Closed);
        }
        if !matches!(self.phase, Phase::Traffic(_)) {
            return Err(TlsError::NotReady);
        }
        if !self.control.is_empty()
            || self.pending_key_update.is_some()
            || (self.numbering.send_requested && !self.numbering.send_on)
        {
            self.poll_output_at(out, origin);
        }
        Ok(())
    }

    fn seal_at(
        &mut self,
        plaintext: &[u8],
        out: &mut Vec<u8>,
        origin: OutputOrigin,
    ) -> Result<(), TlsError> {
        self.seal_prologue(out, origin)?;
        let chunk_len = self.chunk_len();
        let chunks = plaintext.len().div_ceil(chunk_len);
        for (i, chunk) in plaintext.chunks(chunk_len).enumerate() {
            if self.needs_key_update() {
                self.send_key_update(false, out)?;
            }
            let mut unit_flags = 0;
            if i > 0 {
                unit_flags |= number_flag::STARTS_INSIDE;
            }
            if i + 1 < chunks {
                unit_flags |= number_flag::ENDS_INSIDE;
            }
            self.seal_record(content_type::APPLICATION_DATA, chunk, unit_flags, out);
            self.stats.bytes_sealed += chunk.len() as u64;
        }
        Ok(())
    }

    /// Exactly how many bytes [`Tls::seal`] would append now for `len` bytes of plaintext:
    /// the records (header, content, content type, padding, 16-byte tag each), plus what it
    /// appends first (pending [`Tls::poll_output`] bytes) and any KeyUpdate it inserts. Call
    /// [`Tls::poll_output`] first for the size of the application records alone (a KeyUpdate
    /// at the confidentiality limit aside, once per 2^24 records under AES-GCM).
    /// Outside the traffic phase, the size of the records alone.
    pub fn sealed_len(&self, len: usize) -> usize {
        let chunk = self.chunk_len();
        let full_records = len / chunk;
        let last = len % chunk;
        let records_len = full_records * self.record_len(chunk) + self.record_len_nonzero(last);
        let Phase::Traffic(traffic) = &self.phase else {
            return records_len;
        };
        if self.failed.is_some() || self.close_requested || self.close_sent {
            return records_len;
        }
        let key_update_len = self.record_len(5);
        let mut total = self.control.len() + records_len;
        let mut seq = traffic.tx.seq;
        if self.pending_key_update.is_some() {
            total += key_update_len;
            seq = 0;
        }
        let threshold = self.key_update_threshold_for(traffic);
        let records = full_records as u64 + u64::from(last > 0);
        // Each key seals `threshold - 1` data records, then the KeyUpdate.
        let mut remaining = records;
        while remaining > 0 {
            let before_limit = threshold.saturating_sub(1).saturating_sub(seq);
            if before_limit >= remaining {
                break;
            }
            remaining -= before_limit;
            total += key_update_len;
            seq = 0;
        }
        total
    }

    fn record_len(&self, content_len: usize) -> usize {
        let inner = self.prefix_len() + content_len;
        record::sealed_record_len(inner, self.padding_for(inner))
    }

    fn record_len_nonzero(&self, content_len: usize) -> usize {
        if content_len == 0 {
            0
        } else {
            self.record_len(content_len)
        }
    }

    fn padding_for(&self, content_len: usize) -> usize {
        if self.padding_granularity <= 1 {
            return 0;
        }
        let inner = content_len + 1;
        let padded = inner
            .div_ceil(self.padding_granularity)
            .saturating_mul(self.padding_granularity)
            .min(MAX_INNER_PLAINTEXT_LEN);
        padded.saturating_sub(inner)
    }

    fn key_update_threshold_for(&self, traffic: &Traffic) -> u64 {
        self.key_update_threshold
            .map_or(traffic.confidentiality_limit, |t| {
                t.min(traffic.confidentiality_limit)
            })
            .max(2)
    }

    /// Whether the key is within [`NUMBERED_KEY_UPDATE_MARGIN`] records of its limit.
    fn near_key_limit(&self) -> bool {
        match &self.phase {
            Phase::Traffic(traffic) => {
                traffic.tx.seq.saturating_add(NUMBERED_KEY_UPDATE_MARGIN)
                    >= self.key_update_threshold_for(traffic)
            }
            _ => false,
        }
    }

    /// Whether the next record would reach the key's limit: the KeyUpdate must be the last
    /// record under a key (RFC 8446 §5.5).
    fn needs_key_update(&self) -> bool {
        match &self.phase {
            Phase::Traffic(traffic) => {
                traffic.tx.seq.saturating_add(1) >= self.key_update_threshold_for(traffic)
            }
            _ => false,
        }
    }

    /// Seals one record under the current transmit key and advances the sequence number.
    /// Numbered (docs/wire.md §5) once the switch marker is out, with `unit_flags`
    /// ([`number_flag::STARTS_INSIDE`], [`number_flag::ENDS_INSIDE`]) for application data.
    fn seal_record(&mut self, kind: u8, content: &[u8], unit_flags: u8, out: &mut Vec<u8>) {
        let start = out.len();
        out.reserve(HEADER_LEN + NUMBER_PREFIX_LEN + content.len());
        out.resize(start + HEADER_LEN + self.prefix_len(), 0);
        out.extend_from_slice(content);
        self.seal_record_in_place(kind, unit_flags, out, start);
    }

    /// Seals the record at `out[start..]` where it is: room for the header and the number
    /// prefix, then the content (see [`RecordKeys::seal_in_place`]).
    fn seal_record_in_place(&mut self, kind: u8, unit_flags: u8, out: &mut Vec<u8>, start: usize) {
        let prefix_len = self.prefix_len();
        let content_len = out.len() - start - HEADER_LEN - prefix_len;
        let padding = self.padding_for(prefix_len + content_len);
        let Phase::Traffic(traffic) = &mut self.phase else {
            out.truncate(start);
            return;
        };
        let seq = traffic.tx.seq;
        if let Some(nonces) = &mut self.nonces {
            nonces.push((traffic.tx.epoch, traffic.tx.keys.nonce(seq)));
        }
        if prefix_len > 0 {
            let flags = if kind == content_type::APPLICATION_DATA {
                unit_flags & (number_flag::STARTS_INSIDE | number_flag::ENDS_INSIDE)
            } else {
                number_flag::CONTROL
            };
            out[start + HEADER_LEN..start + HEADER_LEN + prefix_len]
                .copy_from_slice(&encode_prefix(seq, flags)[..prefix_len]);
        }
        traffic
            .tx
            .keys
            .seal_in_place(seq, kind, padding, out, start);
        traffic.tx.seq += 1;
        self.stats.records_sealed += 1;
    }

    /// Bytes each record sealed now carries before its content.
    fn prefix_len(&self) -> usize {
        if self.numbering.send_on {
            NUMBER_PREFIX_LEN
        } else {
            0
        }
    }

    /// Most content bytes per application data record sealed now.
    fn chunk_len(&self) -> usize {
        self.max_record_plaintext
            .min(MAX_PLAINTEXT_LEN - self.prefix_len())
            .max(1)
    }

    /// Seals a KeyUpdate under the current key, then switches to the next one
    /// (RFC 8446 §4.6.3, §7.2).
    fn send_key_update(&mut self, request_peer: bool, out: &mut Vec<u8>) -> Result<(), TlsError> {
        let message = [handshake_type::KEY_UPDATE, 0, 0, 1, u8::from(request_peer)];
        self.seal_record(content_type::HANDSHAKE, &message, 0, out);
        let Phase::Traffic(traffic) = &mut self.phase else {
            return Ok(());
        };
        let keys = traffic
            .kernel
            .update_tx_secret()
            .map_err(TlsError::Handshake)
            .and_then(|(seq, secrets)| Ok((seq, RecordKeys::from_secrets(&secrets)?)));
        match keys {
            Ok((seq, keys)) => {
                traffic.tx = KeyEpoch {
                    keys: Arc::new(keys),
                    seq,
                    epoch: traffic.tx.epoch + 1,
                };
                if let Some(padding) = &self.padding {
                    padding.key_updated();
                }
                self.pending_key_update = None;
                self.stats.key_updates_sent += 1;
                Ok(())
            }
            // The peer cannot read anything after the KeyUpdate; no alert is possible.
            Err(e) => Err(self.fail(e, None)),
        }
    }

    /// What became of early data on this connection (see [`EarlyData`]).
    pub fn early_data(&self) -> EarlyData {
        let early = &self.early;
        if early.received > 0 {
            // Only a server receives early data.
            EarlyData::Received(early.received)
        } else if early.sent == 0 {
            EarlyData::None
        } else if !early.settled {
            EarlyData::Offered(early.sent)
        } else if early.end_of_early_data {
            EarlyData::Accepted(early.sent)
        } else {
            EarlyData::Rejected(early.sent)
        }
    }

    /// Server, during the handshake: whether application data may be sealed now, before the
    /// client's Finished (0.5-RTT data, RFC 8446 §4.4.4: after the server's Finished went
    /// out). Such data goes to a client whose identity is not yet known (no client
    /// certificates here, so nothing changes) and, answering early data, may answer a
    /// request that is only later known to be genuine: the handshake's end confirms it.
    pub fn may_seal_half_rtt(&self) -> bool {
        matches!(self.phase, Phase::Server(_)) && self.early.half_rtt_ready && self.failed.is_none()
    }

    /// Server, while [`Tls::may_seal_half_rtt`]: seals `plaintext` as application data under
    /// the first traffic key (rustls seals these records; the sequence numbers carry on after
    /// the hand-over), appended to `out` behind anything [`Tls::poll_output`] has pending.
    /// Returns `Ok(false)`, appending nothing of `plaintext`, when that is not possible now.
    pub fn seal_half_rtt(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> Result<bool, TlsError> {
        let origin = self.output_origin(out);
        let result = self.seal_half_rtt_at(plaintext, out);
        self.note_output(out, origin);
        result
    }

    fn seal_half_rtt_at(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> Result<bool, TlsError> {
        if !self.may_seal_half_rtt() {
            return Ok(false);
        }
        out.append(&mut self.control);
        let Phase::Server(conn) = &mut self.phase else {
            return Ok(false);
        };
        // Nothing arrived since the handshake stopped in `WriteTraffic`, so rustls answers the
        // same bytes with the same state.
        let exposed = &mut self.inbox.buf[self.inbox.head..self.inbox.head + self.inbox.exposed];
        let UnbufferedStatus { discard, state } = conn.process(exposed);
        let result = match state {
            Ok(ConnectionState::WriteTraffic(mut writer)) => {
                seal_with_rustls(plaintext, out, |chunk, room| {
                    let n = writer.encrypt(chunk, room).map_err(|e| e.to_string())?;
                    Ok((n, true))
                })
                .map(|()| true)
                .map_err(|e| {
                    TlsError::Handshake(rustls::Error::General(format!(
                        "sealing 0.5-RTT data: {e}"
                    )))
                })
            }
            Ok(ConnectionState::EncodeTlsData(mut encoder)) => {
                encode(&mut encoder, &mut self.control);
                self.early.half_rtt_ready = false;
                Ok(false)
            }
            Ok(_) => {
                self.early.half_rtt_ready = false;
                Ok(false)
            }
            Err(e) => Err(TlsError::from(e)),
        };
        self.inbox.consume(discard);
        match result {
            Ok(true) => {
                self.stats.half_rtt_sealed += plaintext.len() as u64;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => Err(self.fail(e, None)),
        }
    }

    /// Queues close_notify (RFC 8446 §6.1) for [`Tls::poll_output`]; [`Tls::seal`] fails from
    /// now on. During the handshake, close_notify is sent as soon as it completes (rustls's
    /// unbuffered API seals alerts only once traffic keys exist).
    pub fn send_close_notify(&mut self) {
        self.close_requested = true;
    }

    /// Whether the peer's close_notify has been received: all of its data has been opened.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// Queues a KeyUpdate (RFC 8446 §4.6.3), with update_requested if `request_peer` (the
    /// peer then updates its own key too). It goes out with the next [`Tls::poll_output`] or
    /// [`Tls::seal`]; during the handshake, after it. Several calls before then send one.
    pub fn initiate_key_update(&mut self, request_peer: bool) {
        if self.failed.is_some() || self.close_requested || self.close_sent {
            return;
        }
        self.pending_key_update = Some(self.pending_key_update.unwrap_or(false) || request_peer);
    }

    /// The cipher suite, once the server has chosen it.
    pub fn negotiated_suite(&self) -> Option<SupportedCipherSuite> {
        match &self.phase {
            Phase::Client(conn) => conn.negotiated_cipher_suite(),
            Phase::Server(conn) => conn.negotiated_cipher_suite(),
            Phase::Traffic(traffic) => Some(traffic.suite),
            Phase::HandedOver => None,
        }
    }

    /// The peer's certificate chain, end entity first, once received (a client always gets
    /// the server's; a server gets none, squarepeg does not ask for client certificates; a
    /// resumed session has none).
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        match &self.phase {
            Phase::Client(conn) => conn.peer_certificates(),
            Phase::Server(conn) => conn.peer_certificates(),
            Phase::Traffic(_) | Phase::HandedOver => self
                .session
                .as_ref()
                .and_then(|s| s.peer_certificates.as_deref()),
        }
    }

    /// Whether the handshake was full or resumed a session, once known.
    pub fn handshake_kind(&self) -> Option<HandshakeKind> {
        match &self.phase {
            Phase::Client(conn) => conn.handshake_kind(),
            Phase::Server(conn) => conn.handshake_kind(),
            Phase::Traffic(_) | Phase::HandedOver => {
                self.session.as_ref().and_then(|s| s.handshake_kind)
            }
        }
    }

    /// The ALPN protocol agreed, if the configurations offered any.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match &self.phase {
            Phase::Client(conn) => conn.alpn_protocol(),
            Phase::Server(conn) => conn.alpn_protocol(),
            Phase::Traffic(_) | Phase::HandedOver => self
                .session
                .as_ref()
                .and_then(|s| s.alpn_protocol.as_deref()),
        }
    }

    /// Counters of the record layer.
    pub fn stats(&self) -> TlsStats {
        let mut stats = self.stats;
        stats.early_data_sent = self.early.sent as u64;
        stats.early_data_received = self.early.received;
        if let Some(padding) = &self.padding {
            let p = padding.stats();
            stats.padding_records = p.records;
            stats.padding_bytes = p.bytes;
            stats.padding_declined = p.declined;
        }
        stats
    }

    /// Most plaintext bytes per application data record [`Tls::seal`] makes (2^14 unless set).
    pub fn max_record_plaintext(&self) -> usize {
        self.max_record_plaintext
    }

    /// Sets [`Tls::max_record_plaintext`], clamped to 1..=2^14 (RFC 8446 §5.1).
    pub fn set_max_record_plaintext(&mut self, len: usize) {
        self.max_record_plaintext = len.clamp(1, MAX_PLAINTEXT_LEN);
    }

    /// Pads the inner plaintext of every record sealed from now on with zeros to a multiple of
    /// `granularity` bytes, at most 2^14 + 1 (RFC 8446 §5.4, to hide lengths); 0 or 1: none.
    pub fn set_padding_granularity(&mut self, granularity: usize) {
        self.padding_granularity = granularity;
    }

    /// Lowers the number of records sealed under one key before a KeyUpdate is sent on its own
    /// (by default the suite's confidentiality limit, RFC 8446 §5.5: 2^24 for AES-GCM, none
    /// for ChaCha20-Poly1305); the KeyUpdate is the last of them. Never above the suite's
    /// limit; at least 2. For tests, and for rekeying more often.
    pub fn set_key_update_threshold(&mut self, records: u64) {
        self.key_update_threshold = Some(records);
    }

    /// Test hook: while on, every record sealed is remembered as (transmit key epoch, nonce);
    /// the epoch is 0 for the first application traffic key and one more after each
    /// KeyUpdate sent. Turning it off forgets them.
    pub fn record_nonces(&mut self, on: bool) {
        self.nonces = on.then(|| self.nonces.take().unwrap_or_default());
        if let Some(padding) = &self.padding {
            padding.record_nonces(on);
        }
    }

    /// The (key epoch, nonce) of every record sealed while [`Tls::record_nonces`] was on,
    /// padding records sealed by the [`PaddingSealer`] last.
    pub fn sealed_nonces(&self) -> Vec<(u64, [u8; 12])> {
        let mut nonces = self.nonces.clone().unwrap_or_default();
        if let Some(padding) = &self.padding {
            nonces.extend(padding.sealed_nonces());
        }
        nonces
    }

    /// The sealer of padding records for inconsistent retransmissions (see
    /// [`crate::padding`]), shared with this connection: from now on, once records are
    /// numbered, [`Tls::poll_output`] keeps a few record numbers reserved for it.
    pub fn padding_sealer(&mut self) -> PaddingSealer {
        let padding = self.padding.get_or_insert_default();
        padding.set_wanted();
        if self.nonces.is_some() {
            padding.record_nonces(true);
        }
        padding.clone()
    }

    /// The stream ranges the padder filled since the last call: the receiver must hear of
    /// them (docs/wire.md §5.1), since a late copy of the original bytes may splice with the
    /// replacement there.
    pub fn take_replaced(&mut self) -> Vec<std::ops::Range<u64>> {
        self.padding
            .as_ref()
            .map_or_else(Vec::new, PaddingSealer::take_replaced)
    }

    /// Keeps numbers reserved for the padder: renewed before they grow stale, never within
    /// [`NUMBERED_KEY_UPDATE_MARGIN`] of the key's limit (the KeyUpdate stays the last record
    /// under a key). The numbers are skipped by this side's own records.
    fn reserve_padding_numbers(&mut self) {
        let Some(padding) = &self.padding else {
            return;
        };
        if !self.numbering.send_on || !padding.wanted() {
            return;
        }
        let threshold = match &self.phase {
            Phase::Traffic(traffic) => self.key_update_threshold_for(traffic),
            _ => return,
        };
        let Phase::Traffic(traffic) = &mut self.phase else {
            return;
        };
        let tx = &mut traffic.tx;
        if !padding.needs_numbers(tx.epoch, tx.seq)
            || tx.seq + RESERVED_NUMBERS + NUMBERED_KEY_UPDATE_MARGIN >= threshold
        {
            return;
        }
        let numbers = tx.seq..tx.seq + RESERVED_NUMBERS;
        tx.seq = numbers.end;
        padding.reserve(Arc::clone(&tx.keys), tx.epoch, numbers);
    }

    /// Accepts numbered records from the peer (docs/wire.md §5): its switch marker (an empty
    /// application-data record) turns them on. Call only when the peer is known to speak
    /// squarepeg's framing and after announcing it to the peer under encryption; a stock TLS
    /// peer never sends the switch.
    pub fn accept_numbered_records(&mut self) {
        self.numbering.accept = true;
    }

    /// The peer's retransmissions may carry other records than the originals (it said so
    /// under encryption; docs/wire.md §5.1): an out-of-order receiver of its numbered records
    /// then holds at bytes that do not authenticate, until the peer's announcement of the
    /// replaced range (a splice of original and replacement), instead of failing at once.
    pub fn expect_replacements(&mut self) {
        self.numbering.replacements_expected = true;
    }

    /// Switches this side's records to numbered ones (docs/wire.md §5) once the peer said it
    /// reads them: the switch marker goes out with the next [`Tls::poll_output`] or
    /// [`Tls::seal`], and every record after it carries its number. From then on the records
    /// one [`Tls::seal`] call makes are marked as one unit (a record is delivered out of order
    /// only if it holds a whole unit), and records may be put on the wire in any order
    /// (a KeyUpdate goes out through [`Tls::poll_output`] ahead of the key's limit, so that
    /// no write has to contain one). Several calls change nothing.
    pub fn send_numbered_records(&mut self) {
        if !self.numbering.send_on {
            self.numbering.send_requested = true;
        }
    }

    /// Whether this side seals numbered records now.
    pub fn is_sending_numbered(&self) -> bool {
        self.numbering.send_on
    }

    /// Turns on the out-of-order receive path (Minion §6): the stream then comes in through
    /// [`Tls::push_segment`] instead of [`Tls::push_ciphertext`]. Call before the first byte.
    pub fn enable_out_of_order(&mut self, config: OutOfOrderConfig) {
        self.ooo = Some(Box::new(OutOfOrder {
            config,
            store: SegmentStore::new(config.window.saturating_add(MAX_RECORD_LEN)),
            delivered: DeliveredRecords::default(),
            scratch: Vec::new(),
            seen_len: (0, 0),
            held: None,
            replaced: BTreeMap::new(),
            places: VecDeque::new(),
            recheck_hold: false,
        }));
    }

    /// Stream offset just past the bytes taken in order.
    pub fn in_order_offset(&self) -> u64 {
        self.inbox.consumed + self.inbox.unconsumed() as u64
    }

    /// Stream offset just past the last record read in order (opened, or passed as one
    /// delivered out of order or as a copy): [`Tls::in_order_offset`] less the part of a
    /// record still incomplete.
    pub fn in_order_records_end(&self) -> u64 {
        self.inbox.consumed
    }

    /// Bytes held ahead of the in-order stream.
    pub fn out_of_order_bytes_held(&self) -> usize {
        self.ooo.as_ref().map_or(0, |o| o.store.len())
    }

    /// A segment of the peer's stream at `offset` (out of order, more than once, overlapping:
    /// as the userspace TCP hands them up), with out-of-order receive enabled
    /// ([`Tls::enable_out_of_order`]). The stream's next bytes go through the in-order path
    /// (handshake, then records opened in order, their application data appended to
    /// `in_order`, KeyUpdates, alerts: as [`Tls::process`]). Ahead of a hole, every complete
    /// record found is opened on its own and, if it holds a whole unit of application data,
    /// handed to `deliver` at once; the in-order path later skips it. Bytes that did not
    /// authenticate are never handed out.
    ///
    /// Errors: as [`Tls::process`]; out-of-order receive not enabled is
    /// [`TlsError::Config`].
    pub fn push_segment(
        &mut self,
        offset: u64,
        data: &[u8],
        in_order: &mut Vec<u8>,
        deliver: &mut dyn FnMut(OutOfOrderRecord<'_>),
    ) -> Result<(), TlsError> {
        self.push_segment_with(
            offset,
            data,
            &mut |opened| in_order.extend_from_slice(opened),
            deliver,
        )
    }

    /// As [`Tls::push_segment`], handing the in-order application plaintext to `in_order`
    /// where it was opened (as [`Tls::process_with`]): a receiver with a buffer of its own
    /// saves a copy. A skip over a replaced range ([`Tls::can_skip_held`] true before the
    /// call) happens before any of it.
    pub fn push_segment_with(
        &mut self,
        offset: u64,
        data: &[u8],
        in_order: &mut dyn FnMut(&[u8]),
        deliver: &mut dyn FnMut(OutOfOrderRecord<'_>),
    ) -> Result<(), TlsError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.peer_closed {
            return Ok(());
        }
        if self.ooo.is_none() {
            return Err(TlsError::Config(
                "out-of-order receive is not enabled".into(),
            ));
        }
        // A skip only ever comes first, before any plaintext of this call: the caller's
        // frame reader restarts there (see `Tls::can_skip_held`).
        self.skip_held_range();
        if let Some(ooo) = &mut self.ooo
            && mem::take(&mut ooo.recheck_hold)
        {
            // Ranges were announced since the stream stopped on a record delivered from
            // elsewhere: its bytes, in the store, are read again and it may now be a copy.
            ooo.held = None;
        }
        let in_order_before = self.in_order_offset();
        let Some(ooo) = &mut self.ooo else {
            return Ok(());
        };
        let end = offset.saturating_add(data.len() as u64);
        // A segment that continues the in-order stream and overlaps nothing held ahead (all
        // held fragments lie above the in-order offset) goes straight in, not through the
        // store: one copy and no allocation less on the common path. Not while the stream
        // is held: then everything waits in the store, where the scan finds it.
        let direct = ooo.held.is_none()
            && offset <= in_order_before
            && end > in_order_before
            && ooo
                .store
                .fragments
                .first_key_value()
                .is_none_or(|(&first, _)| first >= end);
        if !direct {
            let refused = ooo.store.insert(in_order_before, offset, data);
            self.stats.segment_bytes_refused += refused as u64;
            if refused > 0 && ooo.held.is_some() {
                // The hold outgrew the store: the bytes it stopped at never authenticated.
                return Err(self.fail_with_alert(TlsError::Decrypt));
            }
        }
        // Fragments this segment did not touch are scanned again only when the in-order
        // stream moved (the handshake may have finished, keys may have changed).
        let mut touched = offset..end;
        if direct {
            self.feed_in_order(&data[(in_order_before - offset) as usize..], in_order)?;
        }
        // The stream's next bytes, in order.
        loop {
            if self.peer_closed {
                return Ok(());
            }
            let at = self.in_order_offset();
            let Some(ooo) = self.ooo.as_mut() else {
                break;
            };
            if ooo.held.is_some() {
                break;
            }
            let Some(bytes) = ooo.store.take_at(at) else {
                break;
            };
            self.feed_fragment(bytes, in_order)?;
        }
        let floor = self.in_order_offset();
        if floor != in_order_before {
            touched = 0..u64::MAX;
        }
        let consumed = self.inbox.consumed;
        if let Some(ooo) = &mut self.ooo {
            if floor != in_order_before {
                // Kept a window behind: a copy's original read later may need its range.
                let kept = floor.saturating_sub(ooo.reach());
                while let Some(first) = ooo.replaced.first_entry()
                    && *first.get() <= kept
                {
                    first.remove();
                }
            }
            ooo.store.drop_below(floor);
            // Records delivered out of order that the in-order path passed without meeting
            // them at a record boundary cannot be met any more.
            ooo.delivered.drop_below(consumed);
        }
        self.scan_out_of_order(touched, deliver);
        Ok(())
    }

    /// Opens `bytes`, the stream's next ciphertext, in order. If the stream gets held on the
    /// way (`hold_or_fail`), what is left goes back to the store with the bytes the hold
    /// returned. Stops at the peer's close_notify.
    fn feed_in_order(
        &mut self,
        mut rest: &[u8],
        in_order: &mut dyn FnMut(&[u8]),
    ) -> Result<(), TlsError> {
        while !rest.is_empty() && !self.peer_closed {
            let (taken, held) = self.feed_step(rest, usize::MAX, in_order)?;
            rest = &rest[taken..];
            if held {
                break;
            }
        }
        Ok(())
    }

    /// One step of [`Tls::feed_in_order`]: pushes at most `limit` bytes of `rest` and opens
    /// what is complete. Returns the bytes taken and whether the stream got held on the way
    /// (`hold_or_fail`), in which case the rest of `rest` went back to the store.
    fn feed_step(
        &mut self,
        rest: &[u8],
        limit: usize,
        in_order: &mut dyn FnMut(&[u8]),
    ) -> Result<(usize, bool), TlsError> {
        let rest_at = self.in_order_offset();
        let taken = self.push_ciphertext(&rest[..limit.min(rest.len())]);
        self.process_with(in_order)?;
        if let Some(ooo) = self.ooo.as_mut()
            && ooo.held.is_some()
        {
            let refused = ooo
                .store
                .insert(rest_at, rest_at + taken as u64, &rest[taken..]);
            if refused > 0 {
                return Err(self.fail_with_alert(TlsError::Decrypt));
            }
            return Ok((taken, true));
        }
        Ok((taken, false))
    }

    /// Opens `bytes`, a fragment taken from the store at the in-order offset, in order, as
    /// [`Tls::feed_in_order`] does, copying as little as it can: only what completes the
    /// record in progress goes through [`Tls::push_ciphertext`]; once no byte waits in the
    /// inbox, the fragment itself becomes the inbox's buffer and its records are opened (or,
    /// if delivered out of order already, skipped) where they lie. The record layer sees the
    /// same bytes in the same order either way. The buffer given up goes back to the store.
    fn feed_fragment(
        &mut self,
        mut bytes: Vec<u8>,
        in_order: &mut dyn FnMut(&[u8]),
    ) -> Result<(), TlsError> {
        let mut pos = 0;
        while pos < bytes.len() && !self.peer_closed {
            let traffic = matches!(self.phase, Phase::Traffic(_));
            if traffic && self.failed.is_none() && self.inbox.unconsumed() == 0 {
                debug_assert_eq!(self.inbox.exposed, 0);
                let len = bytes.len();
                let mut old = self.inbox.replace(bytes, pos, len);
                old.clear();
                let result = self.process_with(in_order);
                // A buffer that held a long fragment does not stay the inbox's: the record
                // in progress (the rest of it, less than a record) moves to the old one.
                let rest = self.inbox.unconsumed();
                if self.inbox.buf.capacity() > MAX_SPARE && rest <= MAX_RECORD_LEN {
                    old.extend_from_slice(self.inbox.data());
                    old = self.inbox.replace(old, 0, rest);
                }
                if let Some(ooo) = self.ooo.as_mut() {
                    ooo.store.recycle(old);
                }
                return result;
            }
            // Only what completes the record in progress (its header first), when the inbox
            // can tell; otherwise as much as it takes.
            let want = if traffic {
                self.inbox_wants()
            } else {
                usize::MAX
            };
            let (taken, held) = self.feed_step(&bytes[pos..], want, in_order)?;
            pos += taken;
            if held {
                break;
            }
        }
        bytes.clear();
        if let Some(ooo) = self.ooo.as_mut() {
            ooo.store.recycle(bytes);
        }
        Ok(())
    }

    /// Bytes that complete the header, else the record, in progress in the inbox; `usize::MAX`
    /// if that is not known (an invalid header: the record layer then fails or holds).
    fn inbox_wants(&self) -> usize {
        let have = self.inbox.unconsumed();
        if have < HEADER_LEN {
            return HEADER_LEN - have;
        }
        record::protected_record_len(self.inbox.data())
            .ok()
            .and_then(|len| len.checked_sub(have))
            .filter(|&n| n > 0)
            .unwrap_or(usize::MAX)
    }

    /// The peer replaced the stream range `range` (its announcement, docs/wire.md §5.1): an
    /// in-order stream held inside it may skip to its end — at the next
    /// [`Tls::push_segment`] (with no bytes, if none are coming: see
    /// [`Tls::can_skip_held`]); a stream held on a record delivered from elsewhere looks at it
    /// again ([`Tls::can_resume_held`]). Ranges more than a window behind are ignored; at most
    /// [`MAX_REPLACED_RANGES`] are kept.
    pub fn note_replaced(&mut self, range: std::ops::Range<u64>) {
        let consumed = self.inbox.consumed;
        let Some(ooo) = &mut self.ooo else {
            return;
        };
        // Ranges a window behind still count: a copy read there tells a record met later
        // at its original place from a replay.
        let floor = consumed.saturating_sub(ooo.reach());
        if range.end <= floor || range.start >= range.end {
            return;
        }
        if ooo.replaced.len() < MAX_REPLACED_RANGES {
            let end = ooo.replaced.entry(range.start).or_insert(range.end);
            *end = (*end).max(range.end);
            // A stream held on a copy may now see it is one.
            ooo.recheck_hold = ooo.held.is_some();
        } else {
            self.stats.replaced_ranges_dropped += 1;
        }
    }

    /// The transport ended: if the in-order stream is held on bytes that never authenticated
    /// (see [`Tls::note_replaced`]), that is a failure ([`TlsError::Decrypt`], with its
    /// alert queued if the transport can still carry it). Returns whether it was.
    pub fn ends_held(&mut self) -> bool {
        if self.failed.is_some() || self.ooo.as_ref().is_none_or(|o| o.held.is_none()) {
            return false;
        }
        self.fail_with_alert(TlsError::Decrypt);
        true
    }

    /// The transport ended: if it ended inside a record before the peer's close_notify —
    /// part of one waiting in order for the rest, or bytes held ahead of it — the stream
    /// was cut short, by the peer or by bytes put in it whose header claims more than ever
    /// came (their record can never complete, and every record after it would wait): a
    /// failure ([`TlsError::BadRecord`], with its alert queued if the transport can still
    /// carry it). Returns whether it was.
    pub fn ends_inside_record(&mut self) -> bool {
        if self.failed.is_some() || self.peer_closed || !matches!(self.phase, Phase::Traffic(_)) {
            return false;
        }
        let held_ahead = self.ooo.as_ref().is_some_and(|o| o.store.len() > 0);
        if self.inbox.unconsumed() == 0 && !held_ahead {
            return false;
        }
        self.fail_with_alert(TlsError::BadRecord);
        true
    }

    /// Whether the in-order stream is held on bytes that do not authenticate (see
    /// [`Tls::expect_replacements`]).
    pub fn is_held(&self) -> bool {
        self.ooo.as_ref().is_some_and(|o| o.held.is_some())
    }

    /// Whether the in-order stream is held inside a range the peer announced replaced: the
    /// next [`Tls::push_segment`] skips to the range's end before anything else, so the
    /// in-order plaintext it appends starts a new unit (a frame reader restarts there).
    pub fn can_skip_held(&self) -> bool {
        self.ooo
            .as_ref()
            .and_then(|o| o.held)
            .is_some_and(|at| self.in_replaced_range(at))
    }

    /// Whether the next [`Tls::push_segment`] (with no bytes, if none are coming) moves a held
    /// in-order stream on, or looks at it again: it is held inside a range the peer announced
    /// replaced ([`Tls::can_skip_held`]), or on a record delivered from elsewhere and ranges
    /// were announced since (the record may be a copy in one of them, docs/wire.md §5.1).
    pub fn can_resume_held(&self) -> bool {
        self.can_skip_held() || self.ooo.as_ref().is_some_and(|o| o.recheck_hold)
    }

    /// Looks for complete records ahead of the in-order stream in the fragments that overlap
    /// `touched` (the others did not change since they were last scanned) and delivers the
    /// whole application-data ones.
    fn scan_out_of_order(
        &mut self,
        touched: std::ops::Range<u64>,
        deliver: &mut dyn FnMut(OutOfOrderRecord<'_>),
    ) {
        let in_order_end = self.in_order_offset();
        let Phase::Traffic(traffic) = &mut self.phase else {
            return;
        };
        let Some(ooo) = self.ooo.as_deref_mut() else {
            return;
        };
        if ooo.store.fragments.is_empty() {
            return;
        }
        let numbering = self.numbering;
        let mean_record_len = match ooo.seen_len {
            (_, 0) => MAX_RECORD_LEN as u64,
            (sum, count) => (sum / count).max(MIN_RECORD as u64),
        };
        let mut scan = Scan {
            traffic,
            numbering,
            config: ooo.config,
            delivered: &mut ooo.delivered,
            scratch: &mut ooo.scratch,
            stats: &mut self.stats,
            in_order_end,
            in_order_record: self.inbox.consumed,
            mean_record_len,
        };
        // Fragments neither overlap nor touch: those overlapping the range are the last ones
        // starting before its end. Scanning changes no fragment's extent.
        let mut below = touched.end;
        while let Some((&start, fragment)) = ooo.store.fragments.range_mut(..below).next_back()
            && start + fragment.bytes.len() as u64 > touched.start
        {
            scan.fragment(start, fragment, deliver);
            if start <= touched.start {
                // Those before end before it.
                break;
            }
            below = start;
        }
    }

    /// The current (transmit, receive) key epochs: 0 for the first application traffic keys,
    /// one more after each KeyUpdate. `None` during the handshake.
    pub fn key_epochs(&self) -> Option<(u64, u64)> {
        match &self.phase {
            Phase::Traffic(traffic) => Some((traffic.tx.epoch, traffic.rx.epoch)),
            _ => None,
        }
    }
}

/// One pass of the out-of-order scan over the fragments ahead of the in-order stream.
struct Scan<'a> {
    traffic: &'a mut Traffic,
    numbering: Numbering,
    config: OutOfOrderConfig,
    delivered: &'a mut DeliveredRecords,
    scratch: &'a mut Vec<u8>,
    stats: &'a mut TlsStats,
    in_order_end: u64,
    /// Stream offset of the record the in-order stream reads next (number `rx.seq`).
    in_order_record: u64,
    mean_record_len: u64,
}

/// What a candidate record start turned out to be.
enum Candidate {
    /// Opened and delivered, with this number.
    Delivered(u64),
    /// A record (its number was found) that waits for the in-order stream.
    Record(u64),
    /// Not a record that authenticates here.
    NotARecord,
    /// Not tried: no number could be found or predicted (a stock sender's records with
    /// predictions off); not counted as rejected.
    Untried,
}

impl Scan<'_> {
    /// Scans `fragment` (at stream offset `start`) from its cursor.
    fn fragment(
        &mut self,
        start: u64,
        f: &mut Fragment,
        deliver: &mut dyn FnMut(OutOfOrderRecord<'_>),
    ) {
        loop {
            let pos = f.cursor;
            if f.bytes.len() < pos + HEADER_LEN {
                return;
            }
            let offset = start + pos as u64;
            if let Some(d) = self.delivered.get(offset) {
                f.cursor += d.wire_len;
                f.at = CursorAt::AfterOpened { next: d.number + 1 };
                continue;
            }
            let header = &f.bytes[pos..pos + HEADER_LEN];
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            let plausible = header[0] == content_type::APPLICATION_DATA
                && header[1..3] == record::LEGACY_RECORD_VERSION
                && (MIN_RECORD - HEADER_LEN..=record::MAX_CIPHERTEXT_LEN).contains(&len);
            if !plausible {
                // Not a record start: on to the next byte that could begin a header.
                f.at = CursorAt::Scan;
                f.cursor = find_byte(&f.bytes[pos + 1..], content_type::APPLICATION_DATA)
                    .map_or(f.bytes.len(), |i| pos + 1 + i);
                continue;
            }
            let wire_len = HEADER_LEN + len;
            if f.bytes.len() < pos + wire_len {
                // Wait for the rest of it.
                return;
            }
            if self.delivered.starts_inside(offset, wire_len) {
                // A record that authenticated starts inside: this header lies.
                self.stats.candidates_rejected += 1;
                f.at = CursorAt::Scan;
                f.cursor = pos + 1;
                continue;
            }
            // Opening a record where it lies overwrites its ciphertext, also when it does not
            // authenticate (ring zeroes it). Right after a record that authenticated, that
            // changes nothing: the in-order stream, should it get here, reads a record at the
            // same place with the same header and opens it where it lies just the same, or
            // fails. Not so from a peer that replaces records: the in-order stream, held on a
            // record whose header lies about its length, may skip a replaced range into the
            // middle of it and need the records behind, which this scan finds only after it.
            // After a pattern scan the candidate may straddle true records: a copy is opened.
            let in_place = matches!(f.at, CursorAt::AfterOpened { .. })
                && !self.numbering.replacements_expected;
            let record = &mut f.bytes[pos..pos + wire_len];
            match self.candidate(offset, record, f.at.hint(), in_place, deliver) {
                Candidate::Delivered(number) => {
                    f.cursor += wire_len;
                    f.at = CursorAt::AfterOpened { next: number + 1 };
                }
                Candidate::Record(number) => {
                    f.cursor += wire_len;
                    f.at = CursorAt::AfterNamed { next: number + 1 };
                }
                outcome @ (Candidate::NotARecord | Candidate::Untried) => {
                    if matches!(outcome, Candidate::NotARecord) {
                        self.stats.candidates_rejected += 1;
                    }
                    f.at = CursorAt::Scan;
                    f.cursor = pos + 1;
                }
            }
        }
    }

    /// Tries to open the complete candidate record `record` at `offset`; where it lies if
    /// `in_place` (a numbered record), else in a copy.
    fn candidate(
        &mut self,
        offset: u64,
        record: &mut [u8],
        hint: Option<u64>,
        in_place: bool,
        deliver: &mut dyn FnMut(OutOfOrderRecord<'_>),
    ) -> Candidate {
        if self.numbering.accept
            && let Some(found) = find_number(
                self.traffic,
                record,
                Some(hint.unwrap_or_else(|| self.estimate_number(offset))),
            )
        {
            return self.open_numbered(offset, record, found, in_place, deliver);
        }
        if !self.numbering.receive_on && self.config.predictions > 0 {
            return self.open_predicted(offset, record, hint, deliver);
        }
        if self.numbering.accept {
            // A number was looked for and none fitted.
            Candidate::NotARecord
        } else {
            Candidate::Untried
        }
    }

    /// The likely number of a record at `offset` found by a pattern scan (the first one after
    /// a hole): counted from the nearest record known before it (one delivered out of order,
    /// else the in-order stream's next), a record of mean length apart. Only the order in
    /// which numbers are tried depends on it.
    fn estimate_number(&self, offset: u64) -> u64 {
        let (next, known_end) = self.nearest_known(offset, self.in_order_record);
        next.saturating_add(offset.saturating_sub(known_end) / self.mean_record_len)
    }

    /// The number after the nearest record known before `offset` and where that record
    /// ends: the last one delivered out of order that ends between `in_order` (where the
    /// in-order stream's next record, number `rx.seq`, is taken to start) and `offset`, else
    /// the in-order stream's.
    fn nearest_known(&self, offset: u64, in_order: u64) -> (u64, u64) {
        self.delivered
            .before(offset)
            .map(|(at, d)| (d.number + 1, at + d.wire_len as u64))
            .filter(|&(_, end)| (in_order..=offset).contains(&end))
            .unwrap_or((self.traffic.rx.seq, in_order))
    }

    fn open_numbered(
        &mut self,
        offset: u64,
        record: &mut [u8],
        found: FoundNumber,
        in_place: bool,
        deliver: &mut dyn FnMut(OutOfOrderRecord<'_>),
    ) -> Candidate {
        if found.flags != 0 {
            // Part of a longer unit, or not application data: the in-order stream takes it.
            self.stats.candidates_left_in_order += 1;
            return Candidate::Record(found.number);
        }
        let (key, replay) = match found.epoch {
            NumberEpoch::Current => (&self.traffic.rx, &mut self.traffic.rx_replay),
            NumberEpoch::Previous => {
                let (prev, replay) = self.traffic.rx_prev.as_mut().expect("found under it");
                (&*prev, replay)
            }
            NumberEpoch::Next => {
                let (next, replay) = self.traffic.rx_next.as_mut().expect("found under it");
                (&*next, replay)
            }
        };
        let epoch = key.epoch;
        let wire_len = record.len();
        let sealed = if in_place {
            record
        } else {
            self.scratch.clear();
            self.scratch.extend_from_slice(record);
            self.scratch.as_mut_slice()
        };
        let Ok((kind, content)) = key.keys.open_in_place(found.number, sealed) else {
            return Candidate::NotARecord;
        };
        if kind != content_type::APPLICATION_DATA || content.len() < NUMBER_PREFIX_LEN {
            return Candidate::NotARecord;
        }
        replay.insert(found.number);
        let record = OutOfOrderRecord {
            offset,
            wire_len,
            number: found.number,
            content: &content[NUMBER_PREFIX_LEN..],
        };
        hand_out(self.stats, self.delivered, epoch, record, deliver)
    }

    /// A positional record (a stock sender): its number lies between what the bytes before
    /// it could hold; tries the most likely ones, each with a full open (Minion §6.1).
    fn open_predicted(
        &mut self,
        offset: u64,
        record: &[u8],
        hint: Option<u64>,
        deliver: &mut dyn FnMut(OutOfOrderRecord<'_>),
    ) -> Candidate {
        // Counted from the nearest record known before it: the last one delivered out of
        // order that ends before it, else the in-order stream. (From the in-order stream
        // alone, a record beyond a second hole is guessed across every record of the
        // fragments between, and misses.)
        let (next, known_end) = self.nearest_known(offset, self.in_order_end);
        let gap = offset.saturating_sub(known_end);
        // Records between here and the in-order stream: at least one per longest record, at
        // most one per shortest.
        let fewest = next + gap / MAX_RECORD_LEN as u64;
        let most = next + gap / MIN_RECORD as u64;
        // Guesses: the record after the one before it; records the size of this one since
        // the hole (a flow's records are often alike); records of the mean size seen.
        let mut guesses = Vec::with_capacity(3);
        guesses.extend(hint);
        guesses.push(next + gap / record.len() as u64);
        guesses.push(next + gap / self.mean_record_len);
        let budget = self.config.predictions as usize;
        let mut tries: Vec<u64> = Vec::with_capacity(budget);
        for (i, guess) in guesses.iter().enumerate() {
            let share = (budget - tries.len()) / (guesses.len() - i);
            let more: Vec<u64> = self
                .traffic
                .rx_replay
                .candidates((*guess).clamp(fewest, most))
                .filter(|n| (fewest..=most).contains(n) && !tries.contains(n))
                .take(share.max(1))
                .collect();
            tries.extend(more);
            if tries.len() >= budget {
                break;
            }
        }
        for n in tries {
            self.scratch.clear();
            self.scratch.extend_from_slice(record);
            let Ok((kind, content)) = self.traffic.rx.keys.open_in_place(n, self.scratch) else {
                continue;
            };
            if kind != content_type::APPLICATION_DATA || content.is_empty() {
                return Candidate::Record(n);
            }
            self.traffic.rx_replay.insert(n);
            let record = OutOfOrderRecord {
                offset,
                wire_len: record.len(),
                number: n,
                content,
            };
            let epoch = self.traffic.rx.epoch;
            return hand_out(self.stats, self.delivered, epoch, record, deliver);
        }
        Candidate::NotARecord
    }
}

/// What opening an in-order record gave.
enum InOrderRecord {
    /// Its content type, where its content starts after the header and its length; the key
    /// ([`KeyEpoch::epoch`]) and number it was opened under.
    Opened {
        kind: u8,
        skip: usize,
        len: usize,
        epoch: u64,
        number: u64,
    },
    /// A record whose number (this one, under the current key) was already delivered.
    Spent(u64),
}

/// Delivers a record opened out of order, counts it, and remembers it for the in-order path
/// to skip.
fn hand_out(
    stats: &mut TlsStats,
    delivered: &mut DeliveredRecords,
    epoch: u64,
    record: OutOfOrderRecord<'_>,
    deliver: &mut dyn FnMut(OutOfOrderRecord<'_>),
) -> Candidate {
    let len = record.content.len() as u64;
    stats.records_out_of_order += 1;
    stats.bytes_out_of_order += len;
    stats.bytes_opened += len;
    let number = record.number;
    delivered.insert(
        record.offset,
        Delivered {
            wire_len: record.wire_len,
            number,
            epoch,
        },
    );
    deliver(record);
    Candidate::Delivered(number)
}

/// Whether the first bytes of a peer's stream, `first` (as many as arrived), may begin a
/// TLS record of the first flight (RFC 8446 §5.1): a handshake record (ClientHello,
/// ServerHello) or an alert, legacy record version 3.0–3.4.
fn starts_like_tls(first: &[u8]) -> bool {
    let kind = first
        .first()
        .is_none_or(|&t| t == content_type::HANDSHAKE || t == content_type::ALERT);
    let major = first.get(1).is_none_or(|&v| v == 0x03);
    let minor = first.get(2).is_none_or(|&v| v <= 0x04);
    kind && major && minor
}

/// Index of the first byte of `bytes` equal to `needle`, eight bytes at a time.
fn find_byte(bytes: &[u8], needle: u8) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let pattern = ONES * u64::from(needle);
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().expect("8 bytes")) ^ pattern;
        // The lowest byte flagged is the first zero byte of `x` (a borrow only flags bytes
        // above a zero one).
        let zero = x.wrapping_sub(ONES) & !x & HIGHS;
        if zero != 0 {
            return Some(at + (zero.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == needle)
        .map(|i| at + i)
}

/// Opens the in-order record `record` (header included) as the stream's next positional
/// record.
fn open_positional(traffic: &mut Traffic, record: &mut [u8]) -> Result<InOrderRecord, TlsError> {
    let seq = traffic.rx.seq;
    if seq == u64::MAX {
        // RFC 8446 §5.3: sequence numbers do not wrap.
        return Err(TlsError::UnexpectedMessage);
    }
    if traffic.rx_replay.seen(seq) {
        // Delivered out of order already, from a copy elsewhere in the stream.
        return Ok(InOrderRecord::Spent(seq));
    }
    let (kind, content) = traffic.rx.keys.open_in_place(seq, record)?;
    let len = content.len();
    traffic.rx.seq += 1;
    traffic.rx_replay.insert(seq);
    Ok(InOrderRecord::Opened {
        kind,
        skip: 0,
        len,
        epoch: traffic.rx.epoch,
        number: seq,
    })
}

/// Opens the in-order numbered record `record`: its number is found from its prefix
/// (docs/wire.md §5) under the current receive key, or the one before a KeyUpdate.
fn open_numbered(traffic: &mut Traffic, record: &mut [u8]) -> Result<InOrderRecord, TlsError> {
    let Some(found) = find_number(traffic, record, None) else {
        return match spent_number(traffic, record) {
            Some(n) => Ok(InOrderRecord::Spent(n)),
            None => Err(TlsError::Decrypt),
        };
    };
    let (key, replay) = match found.epoch {
        NumberEpoch::Current => (&mut traffic.rx, &mut traffic.rx_replay),
        NumberEpoch::Previous => {
            let (prev, replay) = traffic.rx_prev.as_mut().expect("found under it");
            (prev, replay)
        }
        NumberEpoch::Next => {
            let (next, replay) = traffic.rx_next.as_mut().expect("found under it");
            (next, replay)
        }
    };
    let (kind, content) = key.keys.open_in_place(found.number, record)?;
    let len = content.len();
    if len < NUMBER_PREFIX_LEN
        || (found.flags & number_flag::CONTROL != 0) != (kind != content_type::APPLICATION_DATA)
    {
        return Err(TlsError::BadRecord);
    }
    replay.insert(found.number);
    key.seq = found.number + 1;
    Ok(InOrderRecord::Opened {
        kind,
        skip: NUMBER_PREFIX_LEN,
        len: len - NUMBER_PREFIX_LEN,
        epoch: key.epoch,
        number: found.number,
    })
}

/// The number already opened under the current key that `record`'s prefix names, if any (a
/// copy of a record delivered before: a replacement's copy, a record whose copy elsewhere was
/// delivered out of order first, or bytes replayed from elsewhere).
fn spent_number(traffic: &Traffic, record: &[u8]) -> Option<u64> {
    let ciphertext = prefix_ciphertext(record)?;
    traffic
        .rx_replay
        .seen_numbers()
        .find(|&n| names_number(&traffic.rx.keys, ciphertext, n).is_some())
}

/// The encrypted prefix of a numbered record (header included), if it is long enough to be one.
fn prefix_ciphertext(record: &[u8]) -> Option<[u8; NUMBER_PREFIX_LEN]> {
    if record.len() < MIN_NUMBERED_RECORD {
        return None;
    }
    record[HEADER_LEN..HEADER_LEN + NUMBER_PREFIX_LEN]
        .try_into()
        .ok()
}

/// If the prefix `ciphertext` decrypts, as record `n` under `keys`, to a prefix naming `n`:
/// its flags (one keystream block, no AEAD).
fn names_number(keys: &RecordKeys, ciphertext: [u8; NUMBER_PREFIX_LEN], n: u64) -> Option<u8> {
    let mut prefix = ciphertext;
    for (p, m) in prefix.iter_mut().zip(keys.keystream_prefix(n)) {
        *p ^= m;
    }
    prefix_flags(prefix, n)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumberEpoch {
    Current,
    Previous,
    Next,
}

#[derive(Debug, Clone, Copy)]
struct FoundNumber {
    epoch: NumberEpoch,
    number: u64,
    flags: u8,
}

/// The number whose keystream turns the first ciphertext bytes of `record` (header included,
/// at least [`MIN_NUMBERED_RECORD`] bytes) into a prefix naming that number: unseen numbers
/// of the current key nearest its next expected one first, then of the key before, then of
/// the key after the peer's next KeyUpdate.
fn find_number(traffic: &Traffic, record: &[u8], hint: Option<u64>) -> Option<FoundNumber> {
    let ciphertext = prefix_ciphertext(record)?;
    let try_key = |keys: &RecordKeys, replay: &ReplayWindow, hint: u64| {
        replay
            .candidates(hint)
            .find_map(|n| names_number(keys, ciphertext, n).map(|flags| (n, flags)))
    };
    if let Some((number, flags)) = try_key(
        &traffic.rx.keys,
        &traffic.rx_replay,
        hint.unwrap_or(traffic.rx.seq),
    ) {
        return Some(FoundNumber {
            epoch: NumberEpoch::Current,
            number,
            flags,
        });
    }
    let epochs = [
        (NumberEpoch::Previous, traffic.rx_prev.as_ref()),
        (NumberEpoch::Next, traffic.rx_next.as_ref()),
    ];
    epochs.into_iter().find_map(|(epoch, keys)| {
        let (key_epoch, replay) = keys?;
        try_key(&key_epoch.keys, replay, key_epoch.seq).map(|(number, flags)| FoundNumber {
            epoch,
            number,
            flags,
        })
    })
}

/// The receive key after the peer's next KeyUpdate (RFC 8446 §7.2), with its replay window.
fn next_rx_epoch(traffic: &mut Traffic) -> Result<(KeyEpoch, ReplayWindow), TlsError> {
    let (seq, secrets) = traffic
        .kernel
        .update_rx_secret()
        .map_err(TlsError::Handshake)?;
    let keys = RecordKeys::from_secrets(&secrets)?;
    let next = KeyEpoch {
        keys: Arc::new(keys),
        seq,
        epoch: traffic.rx.epoch + 1,
    };
    Ok((next, ReplayWindow::starting_at(seq)))
}

/// Shortest numbered record: header, prefix, content type, tag.
const MIN_NUMBERED_RECORD: usize = HEADER_LEN + NUMBER_PREFIX_LEN + 1 + TAG_LEN;
/// Shortest protected record: header, content type, tag.
const MIN_RECORD: usize = HEADER_LEN + 1 + TAG_LEN;

fn session_of<Data>(conn: &UnbufferedConnectionCommon<Data>) -> Session {
    Session {
        peer_certificates: conn.peer_certificates().map(<[_]>::to_vec),
        alpn_protocol: conn.alpn_protocol().map(<[u8]>::to_vec),
        handshake_kind: conn.handshake_kind(),
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = match &self.phase {
            Phase::Client(_) => "client handshake",
            Phase::Server(_) => "server handshake",
            Phase::Traffic(_) => "traffic",
            Phase::HandedOver => "handed over",
        };
        f.debug_struct("Tls")
            .field("phase", &phase)
            .field("suite", &self.negotiated_suite().map(|s| s.suite()))
            .field("peer_closed", &self.peer_closed)
            .field("close_sent", &self.close_sent)
            .field("failed", &self.failed)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivered_records_in_any_order() {
        let d = |number| Delivered {
            wire_len: 10,
            number,
            epoch: 0,
        };
        let mut r = DeliveredRecords::default();
        for at in [100, 110, 120, 300, 50, 115, 400, 110] {
            r.insert(at, d(at));
        }
        assert_eq!(r.len(), 7, "110 was replaced, not added");
        assert_eq!(r.others.len(), 2, "50 and 115 came out of order");
        for at in [50, 100, 110, 115, 120, 300, 400] {
            assert_eq!(r.get(at), Some(&d(at)));
        }
        for at in [0, 60, 111, 299, 401] {
            assert_eq!(r.get(at), None);
        }
        assert_eq!(r.before(50), None);
        assert_eq!(r.before(51), Some((50, &d(50))));
        assert_eq!(r.before(116), Some((115, &d(115))));
        assert_eq!(r.before(120), Some((115, &d(115))));
        assert_eq!(r.before(121), Some((120, &d(120))));
        assert_eq!(r.before(u64::MAX), Some((400, &d(400))));
        // The in-order stream takes them in order, forgetting those it passed.
        assert_eq!(r.take_at(100), Some(d(100)));
        assert_eq!(r.get(50), None);
        assert_eq!(r.take_at(112), None);
        assert_eq!(r.get(110), None);
        assert_eq!(r.take_at(115), Some(d(115)));
        assert_eq!(r.take_at(120), Some(d(120)));
        r.drop_below(350);
        assert_eq!(r.len(), 1);
        assert_eq!(r.take_at(400), Some(d(400)));
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn find_byte_finds_the_first() {
        let mut bytes = vec![0u8; 40];
        assert_eq!(find_byte(&bytes, 0x17), None);
        for at in [39, 17, 8, 7, 0] {
            bytes[at] = 0x17;
            assert_eq!(find_byte(&bytes, 0x17), Some(at));
            assert_eq!(find_byte(&bytes[..at], 0x17), None);
        }
        // Bytes one above or below the needle (borrows) are not taken for it.
        let near = [0x16, 0x18, 0x16, 0x97, 0x16, 0x18, 0x17, 0x16, 0x18, 0x17];
        assert_eq!(find_byte(&near, 0x17), Some(6));
        assert_eq!(find_byte(&near[7..], 0x17), Some(2));
        assert_eq!(find_byte(&[], 0x17), None);
        // Against a plain search, over bytes near the needle.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| [0x16, 0x17, 0x18, 0x97, 0x00, 0xff, 0x01][(x >> (i % 60)) as usize % 7])
                .collect();
            let plain = bytes.iter().position(|&b| b == 0x17);
            assert_eq!(find_byte(&bytes, 0x17), plain, "{bytes:x?}");
        }
    }

    #[test]
    fn tls_is_send() {
        fn send<T: Send>() {}
        send::<Tls>();
    }
}
