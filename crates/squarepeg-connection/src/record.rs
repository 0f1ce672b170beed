//! The record layer: the place between the frame codec and the substrate where a connection's
//! bytes are protected.
//!
//! A cleartext connection passes bytes through untouched: on a byte stream the session's
//! frames are written straight into the driver's output, and the driver's reads go straight
//! into the frame reader. A TLS connection ([`TlsSetup`], `squarepeg-tls`) puts TLS 1.3
//! here, once, for every driver:
//!
//! - **handshake**: rustls's flights go out first; the session's frames wait in the session
//!   (where the scheduler still orders them) until the handshake is done;
//! - **send (byte stream)**: the session writes frames into the driver's output behind room
//!   for a record header, cut to the record's room, and the layer seals them there into TLS
//!   records (`0x17 0x03 0x03 len`; `Tls::begin_record`/`finish_record`, no copy): a batch of
//!   small messages becomes one small record (latency), bulk becomes 16 KiB records.
//!   Inside records, frames need no byte stuffing (records delimit, the AEAD authenticates),
//!   so both directions use plain frames from the first byte (docs/wire.md §4);
//! - **receive (byte stream)**: the driver's bytes are opened record by record and the
//!   plaintext goes to the frame reader. Bytes the AEAD did not authenticate never reach it;
//! - **close**: after the session's last frame, close_notify (RFC 8446 §6.1), then the FIN;
//! - **failure**: a handshake or record failure ends the session with
//!   [`TransportError::Tls`], after the alert that says why has gone out.
//!
//! Over the userspace TCP's uTCP interface (segments out of order, tagged writes) the same
//! slot takes the out-of-order record scanner (Minion §6) and whole records per tagged write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use squarepeg_session::{Session, TlsFailure, TransportError};
use squarepeg_tls::padding::MIN_PADDING_LEN;
use squarepeg_tls::{EarlyData, PaddingSealer, Tls, TlsError};

/// How a connection's bytes are protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Protection {
    /// No protection: frames go to the substrate as they are.
    #[default]
    Cleartext,
    /// TLS 1.3: squarepeg's record layer with keys from a rustls handshake.
    Tls,
}

/// The TLS side of a connection: a client (which checks the server's certificate against
/// `server_name`) or a server.
#[derive(Clone, Debug)]
pub enum TlsSetup {
    /// A TLS client.
    Client {
        /// From `squarepeg_tls::config::client_config` (or any rustls client config with
        /// TLS 1.3 and secret extraction on).
        config: Arc<rustls::ClientConfig>,
        /// The name the server's certificate must carry (a DNS name or an IP address).
        server_name: String,
    },
    /// A TLS server.
    Server {
        /// From `squarepeg_tls::config::server_config` (or any rustls server config with
        /// TLS 1.3 and secret extraction on).
        config: Arc<rustls::ServerConfig>,
    },
}

impl TlsSetup {
    /// Whether this is the client side.
    pub fn is_client(&self) -> bool {
        matches!(self, TlsSetup::Client { .. })
    }

    pub(crate) fn start(&self) -> Result<Tls, TlsError> {
        match self {
            TlsSetup::Client {
                config,
                server_name,
            } => Tls::client(config.clone(), server_name),
            TlsSetup::Server { config } => Tls::server(config.clone()),
        }
    }
}

/// The record layer of one connection.
#[derive(Debug)]
pub(crate) enum RecordLayer {
    Cleartext,
    Tls(Box<TlsLayer>),
}

/// TLS with its scratch buffers.
pub(crate) struct TlsLayer {
    pub(crate) tls: Tls,
    /// The session's frames, on their way to be sealed: over a byte stream, what
    /// overflowed the last record, from `carry_pos` on.
    pub(crate) staging: Vec<u8>,
    /// Over a byte stream: where the carried bytes not yet sealed start in `staging`.
    pub(crate) carry_pos: usize,
    /// Over a byte stream: the carried bytes begin inside a frame (its start went in the
    /// last record).
    pub(crate) carry_cut: bool,
    /// close_notify was handed out (the FIN may follow).
    pub(crate) close_notify_out: bool,
    /// Over tagged writes: close_notify was asked of the TLS layer.
    pub(crate) close_notify_requested: bool,
    /// Over tagged writes: the record layer's own records, as one write.
    pub(crate) control: Vec<u8>,
    /// That write was handed out and not yet taken.
    pub(crate) control_pending: bool,
    /// The handshake or a record failed; the alert is on its way and nothing more is read.
    pub(crate) failed: bool,
    /// After a failure: the alert was handed out (the FIN may follow).
    pub(crate) alert_out: bool,
    /// Since when the in-order stream is held on bytes that do not authenticate
    /// (`Tls::is_held`): it fails after [`MAX_HOLD`].
    pub(crate) held_since: Option<Instant>,
    /// How long the handshake may take, from when the connection first ran.
    pub(crate) handshake_timeout: Duration,
    pub(crate) handshake_started: Option<Instant>,
    /// Client: the plaintext offered as early data, until the handshake says whether the
    /// server took it (how much went early is `Tls::early_data`'s); server: 0.5-RTT frames
    /// that could not be sealed yet.
    pub(crate) early: Option<Vec<u8>>,
}

/// How long the in-order stream may stay held on bytes that do not authenticate before the
/// connection fails: a peer announces each replaced range ahead of its data, so an honest
/// splice is resolved within about a round trip (a few, if the announcement is lost); a
/// forger's bytes end in a failure, not a stall.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(5);

impl std::fmt::Debug for TlsLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsLayer")
            .field("handshaking", &self.tls.is_handshaking())
            .field("suite", &self.tls.negotiated_suite())
            .field("stats", &self.tls.stats())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl TlsLayer {
    /// Whether the sending direction may end: close_notify, or after a failure the alert,
    /// was handed out.
    pub(crate) fn may_end(&self) -> bool {
        self.close_notify_out || self.alert_out
    }

    /// Over tagged writes, the session done: whether close_notify may be sealed now, given
    /// where the TCP queue put the messages written before it. It waits while some are
    /// neither sent nor dropped: its stream offset (docs/wire.md §5) is known only then (the
    /// session's drain timeout bounds the wait). Where that can no longer be learnt (the
    /// reports stopped), it goes without the offset.
    pub(crate) fn close_placement_due(&mut self, placement: crate::send::Placement) -> bool {
        match placement {
            crate::send::Placement::Known => true,
            crate::send::Placement::Pending => false,
            crate::send::Placement::Lost => {
                self.tls.set_output_in_order(false);
                true
            }
        }
    }

    /// Client, ClientHello not made yet: makes it, with the session's early frames (PARAMS
    /// and the messages marked safely replayable) offered as early data (0-RTT). They are
    /// the first bytes of this side's plaintext stream either way: what the server does not
    /// take (beyond the ticket's limit, or all of it if it rejects early data) is sealed
    /// first after the handshake (RFC 8446 §4.2.10, [`Self::early_not_taken`]).
    pub(crate) fn start_client_with_early_data(
        &mut self,
        now: Instant,
        session: &mut Session,
    ) -> Result<(), TlsError> {
        let mut early = Vec::new();
        session.poll_transmit_early(now, &mut early, crate::EARLY_DATA_GATHER);
        self.tls.start_client(&early)?;
        self.early = Some(early);
        Ok(())
    }

    /// After the handshake, once: the bytes offered as early data that the server did not
    /// take, to be sealed before anything else (`None` if there are none).
    pub(crate) fn early_not_taken(&mut self) -> Option<Vec<u8>> {
        if self.tls.is_handshaking() {
            return None;
        }
        let mut early = self.early.take()?;
        // A server's early data is never `Accepted` (it is `Received`): all of its is sealed.
        let taken = match self.tls.early_data() {
            EarlyData::Accepted(n) => n,
            _ => 0,
        };
        (taken < early.len()).then(|| early.split_off(taken))
    }

    pub(crate) fn new(tls: Tls, handshake_timeout: Duration) -> Self {
        Self {
            tls,
            handshake_timeout,
            handshake_started: None,
            staging: Vec::new(),
            carry_pos: 0,
            carry_cut: false,
            close_notify_out: false,
            close_notify_requested: false,
            control: Vec::new(),
            control_pending: false,
            failed: false,
            alert_out: false,
            held_since: None,
            early: None,
        }
    }
}

/// How much of `unsealed` plaintext bytes to seal now for a byte stream that wants about
/// `wanted` bytes: all of it, unless more is coming (`more`) and there is at least a full
/// record, then only whole records (`record` bytes each). A stream chunk's frame is a little
/// longer than a record's plaintext, so sealing each batch whole would follow every full
/// record with one of a few bytes: twice the records to seal and open.
pub(crate) fn seal_len(unsealed: usize, wanted: usize, record: usize, more: bool) -> usize {
    if more && unsealed >= wanted.max(record) {
        unsealed / record * record
    } else {
        unsealed
    }
}

/// In-order ciphertext, opened record by record into the frame reader `r` (its frames are
/// the caller's to take). Records opened before an error were authenticated: they count.
pub(crate) fn open_into(
    tls: &mut Tls,
    r: &mut crate::Receiver,
    mut data: &[u8],
) -> Result<(), TlsError> {
    deliver_into(r, |deliver| {
        loop {
            let taken = tls.push_ciphertext(data);
            data = &data[taken..];
            let result = tls.process_with(deliver);
            if result.is_err() || data.is_empty() {
                break result;
            }
        }
    })
}

/// [`open_into`] for a read of `len` bytes into `buf`, opened where they lie where possible
/// ([`Tls::process_buffer`]: no copy into the record layer); `buf` is then a buffer for the
/// next read.
pub(crate) fn open_buffer_into(
    tls: &mut Tls,
    r: &mut crate::Receiver,
    buf: &mut Vec<u8>,
    len: usize,
) -> Result<(), TlsError> {
    deliver_into(r, |deliver| tls.process_buffer(buf, len, deliver))
}

/// Runs `open` with a sink that copies each opened record's plaintext from where it was
/// opened straight into the frame reader's buffer; the frame reader decodes once for all of
/// it: decoding after every record would move the partial frame at its end to a new chunk
/// each time.
fn deliver_into(
    r: &mut crate::Receiver,
    open: impl FnOnce(&mut dyn FnMut(&[u8])) -> Result<(), TlsError>,
) -> Result<(), TlsError> {
    let mut unread = 0;
    let result = open(&mut |plaintext: &[u8]| {
        if unread > 0 && r.buffer().len() - unread < plaintext.len() {
            r.filled(unread);
            unread = 0;
        }
        match r.buffer().get_mut(unread..unread + plaintext.len()) {
            Some(room) => {
                room.copy_from_slice(plaintext);
                unread += plaintext.len();
            }
            // A read buffer smaller than a record.
            None => r.push(plaintext),
        }
    });
    if unread > 0 {
        r.filled(unread);
    }
    result
}

/// What a TLS error means for the application.
pub(crate) fn tls_transport_error(e: &TlsError) -> TransportError {
    let failure = match e {
        TlsError::Handshake(
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented,
        ) => TlsFailure::Certificate,
        TlsError::Handshake(rustls::Error::PeerIncompatible(_)) => TlsFailure::Incompatible,
        TlsError::Alert { description } => TlsFailure::AlertReceived(*description),
        TlsError::Decrypt => TlsFailure::Decrypt,
        TlsError::NotTls => TlsFailure::NotTls,
        TlsError::BadRecord
        | TlsError::UnexpectedMessage
        | TlsError::RecordOverflow
        | TlsError::IllegalParameter => TlsFailure::Protocol,
        // The peer ended the stream inside the handshake.
        TlsError::Closed => return TransportError::PeerClosed,
        _ => TlsFailure::Handshake,
    };
    TransportError::Tls(failure)
}

/// The TCP send queue's padder under TLS: padding records (docs/wire.md §5.1).
struct TlsPadder(PaddingSealer);

impl squarepeg_tcp::Pad for TlsPadder {
    fn min_len(&self) -> usize {
        MIN_PADDING_LEN
    }

    fn pad(&self, range: std::ops::Range<u64>, len: usize, out: &mut Vec<u8>) -> bool {
        self.0.pad(range, len, out)
    }
}

/// A padder sealing under `tls`'s keys.
pub(crate) fn tls_padder(tls: &mut Tls) -> squarepeg_tcp::Padder {
    squarepeg_tcp::Padder::new(Arc::new(TlsPadder(tls.padding_sealer())))
}
