//! [`Tls`]: one TLS 1.3 connection over an in-order byte stream, sans-IO.

use std::fmt;
use std::mem;
use std::sync::Arc;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, UnbufferedConnectionCommon, UnbufferedStatus,
};
use rustls::{
    ClientConfig, ConnectionTrafficSecrets, HandshakeKind, ProtocolVersion, ServerConfig,
    SupportedCipherSuite,
};

use crate::TlsError;
use crate::error::alert;
use crate::record::{
    self, HEADER_LEN, MAX_INNER_PLAINTEXT_LEN, MAX_PLAINTEXT_LEN, MAX_RECORD_LEN, RecordKeys,
    content_type,
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
}

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
}

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
    suite: SupportedCipherSuite,
    /// Records one key may seal (the suite's confidentiality limit, RFC 8446 §5.5).
    confidentiality_limit: u64,
}

struct KeyEpoch {
    keys: RecordKeys,
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

/// The peer's bytes not yet consumed: `buf[head..]`.
#[derive(Default)]
struct Inbox {
    buf: Vec<u8>,
    head: usize,
    /// During the handshake: `buf[head..head + exposed]` has been given to rustls, which may
    /// keep part of it (handshake messages decrypted in place) until a message is complete.
    exposed: usize,
}

impl Inbox {
    fn unconsumed(&self) -> usize {
        self.buf.len() - self.head
    }

    fn consume(&mut self, n: usize) {
        self.head += n;
        self.exposed = self.exposed.saturating_sub(n);
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        }
    }

    fn compact(&mut self) {
        if self.head > 0 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
        self.exposed = 0;
    }

    /// Gives rustls the next complete record (or, if its header is invalid, everything, so
    /// that rustls reports the error). Returns whether anything new was exposed.
    fn expose_next_record(&mut self) -> bool {
        let start = self.head + self.exposed;
        let available = self.buf.len() - start;
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

/// The two sides' `process_tls_records`, which rustls defines per side.
trait ProcessTlsRecords<Data> {
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Data>;
}

impl ProcessTlsRecords<ClientConnectionData> for UnbufferedConnectionCommon<ClientConnectionData> {
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(incoming)
    }
}

impl ProcessTlsRecords<ServerConnectionData> for UnbufferedConnectionCommon<ServerConnectionData> {
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(incoming)
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
                encode(&mut encoder, control);
                Next::Continue
            }
            Ok(ConnectionState::TransmitTlsData(transmit)) => {
                // The encoded records are already queued in `control`, in order.
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
            Ok(ConnectionState::ReadEarlyData(_)) => {
                inbox.consume(discard);
                return Err(rustls::Error::General(
                    "early data received, which squarepeg never enables".into(),
                ));
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
        if !config.enable_secret_extraction {
            return Err(TlsError::Config(
                "the client configuration must enable secret extraction".into(),
            ));
        }
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|e| TlsError::Config(format!("server name {server_name:?}: {e}")))?;
        let conn = UnbufferedClientConnection::new(config, name)?;
        let mut tls = Tls::new(Phase::Client(Box::new(conn)));
        tls.process(&mut Vec::new())?;
        Ok(tls)
    }

    /// A server connection; it speaks once the ClientHello has been pushed and processed.
    pub fn server(config: Arc<ServerConfig>) -> Result<Tls, TlsError> {
        if !config.enable_secret_extraction {
            return Err(TlsError::Config(
                "the server configuration must enable secret extraction".into(),
            ));
        }
        if config.max_early_data_size > 0 {
            return Err(TlsError::Config(
                "early data is not supported: max_early_data_size must be 0".into(),
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
        }
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
        self.inbox.buf.extend_from_slice(&data[..taken]);
        taken
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
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // rustls hands out application data only from its own buffers during the handshake.
        let mut handshake_plaintext = Vec::new();
        let progress = match &mut self.phase {
            Phase::Client(conn) => drive_handshake(
                &mut ***conn,
                &mut self.inbox,
                &mut self.control,
                &mut handshake_plaintext,
            ),
            Phase::Server(conn) => drive_handshake(
                &mut ***conn,
                &mut self.inbox,
                &mut self.control,
                &mut handshake_plaintext,
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
                keys: tx,
                seq: secrets.tx.0,
                epoch: 0,
            },
            rx: KeyEpoch {
                keys: rx,
                seq: secrets.rx.0,
                epoch: 0,
            },
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
            let Phase::Traffic(traffic) = &mut self.phase else {
                return Ok(());
            };
            let available = &mut self.inbox.buf[self.inbox.head..];
            if available.len() < HEADER_LEN {
                break;
            }
            let record_len = match record::protected_record_len(available) {
                Ok(len) => len,
                Err(e) => return Err(self.fail_with_alert(e)),
            };
            if available.len() < record_len {
                break;
            }
            let seq = traffic.rx.seq;
            if seq == u64::MAX {
                // RFC 8446 §5.3: sequence numbers do not wrap.
                return Err(self.fail_with_alert(TlsError::UnexpectedMessage));
            }
            let (kind, content_len) = match traffic
                .rx
                .keys
                .open_in_place(seq, &mut available[..record_len])
            {
                Ok((kind, content)) => (kind, content.len()),
                Err(e) => return Err(self.fail_with_alert(e)),
            };
            traffic.rx.seq += 1;
            self.stats.records_opened += 1;
            let content_start = self.inbox.head + HEADER_LEN;
            let content = &self.inbox.buf[content_start..content_start + content_len];
            // RFC 8446 §5.1: handshake messages are not interleaved with other record types.
            if kind != content_type::HANDSHAKE && !self.handshake_message.is_empty() {
                return Err(self.fail_with_alert(TlsError::UnexpectedMessage));
            }
            match kind {
                content_type::APPLICATION_DATA => {
                    // Zero-length application data records are allowed (RFC 8446 §5.4).
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
                    // RFC 8446 §5.1: one alert per record, never fragmented.
                    let &[_level, description] = content else {
                        return Err(self.fail_with_alert(TlsError::BadRecord));
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
                    let (seq, secrets) = match traffic.kernel.update_rx_secret() {
                        Ok(updated) => updated,
                        Err(e) => {
                            let e = TlsError::Handshake(e);
                            return Err(self.fail(e, Some(alert::INTERNAL_ERROR)));
                        }
                    };
                    let keys = match RecordKeys::from_secrets(&secrets) {
                        Ok(keys) => keys,
                        Err(e) => return Err(self.fail(e, Some(alert::INTERNAL_ERROR))),
                    };
                    traffic.rx = KeyEpoch {
                        keys,
                        seq,
                        epoch: traffic.rx.epoch + 1,
                    };
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
            self.seal_record(content_type::ALERT, &[2, description], &mut sealed);
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
        out.append(&mut self.control);
        if self.failed.is_some() || self.close_sent || !matches!(self.phase, Phase::Traffic(_)) {
            return;
        }
        if let Some(request_peer) = self.pending_key_update
            && self.send_key_update(request_peer, out).is_err()
        {
            out.append(&mut self.control);
            return;
        }
        if self.close_requested {
            if self.needs_key_update() && self.send_key_update(false, out).is_err() {
                out.append(&mut self.control);
                return;
            }
            // RFC 8446 §6.1: close_notify (level is ignored in TLS 1.3; warning as usual).
            self.seal_record(content_type::ALERT, &[1, alert::CLOSE_NOTIFY], out);
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
        if self.failed.is_some() || self.close_requested || self.close_sent {
            return Err(TlsError::Closed);
        }
        if !matches!(self.phase, Phase::Traffic(_)) {
            return Err(TlsError::NotReady);
        }
        out.append(&mut self.control);
        if let Some(request_peer) = self.pending_key_update {
            self.send_key_update(request_peer, out)?;
        }
        for chunk in plaintext.chunks(self.max_record_plaintext) {
            if self.needs_key_update() {
                self.send_key_update(false, out)?;
            }
            self.seal_record(content_type::APPLICATION_DATA, chunk, out);
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
        let chunk = self.max_record_plaintext;
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
        record::sealed_record_len(content_len, self.padding_for(content_len))
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
    fn seal_record(&mut self, kind: u8, content: &[u8], out: &mut Vec<u8>) {
        let padding = self.padding_for(content.len());
        let Phase::Traffic(traffic) = &mut self.phase else {
            return;
        };
        let seq = traffic.tx.seq;
        if let Some(nonces) = &mut self.nonces {
            nonces.push((traffic.tx.epoch, traffic.tx.keys.nonce(seq)));
        }
        traffic
            .tx
            .keys
            .seal_padded(seq, kind, content, padding, out);
        traffic.tx.seq += 1;
        self.stats.records_sealed += 1;
    }

    /// Seals a KeyUpdate under the current key, then switches to the next one
    /// (RFC 8446 §4.6.3, §7.2).
    fn send_key_update(&mut self, request_peer: bool, out: &mut Vec<u8>) -> Result<(), TlsError> {
        let message = [handshake_type::KEY_UPDATE, 0, 0, 1, u8::from(request_peer)];
        self.seal_record(content_type::HANDSHAKE, &message, out);
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
                    keys,
                    seq,
                    epoch: traffic.tx.epoch + 1,
                };
                self.pending_key_update = None;
                self.stats.key_updates_sent += 1;
                Ok(())
            }
            // The peer cannot read anything after the KeyUpdate; no alert is possible.
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
        self.stats
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
    }

    /// The (key epoch, nonce) of every record sealed while [`Tls::record_nonces`] was on.
    pub fn sealed_nonces(&self) -> &[(u64, [u8; 12])] {
        self.nonces.as_deref().unwrap_or(&[])
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
    fn tls_is_send() {
        fn send<T: Send>() {}
        send::<Tls>();
    }
}
