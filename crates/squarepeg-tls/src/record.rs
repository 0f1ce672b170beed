//! TLS 1.3 record protection (RFC 8446 §5.2–5.4), by record sequence number.
//!
//! A protected record on the wire is
//!
//! ```text
//! opaque_type = 23 ‖ legacy_record_version = 03 03 ‖ length (u16) ‖ AEAD(inner plaintext) ‖ tag
//! inner plaintext = content ‖ content type (u8) ‖ zero padding
//! nonce = iv XOR (64-bit sequence number, left-padded with zeros to the iv's length)
//! additional data = the 5-byte record header
//! ```
//!
//! [`RecordKeys`] holds one direction's key and iv for one key epoch and seals or opens any
//! record given its sequence number, so that a receiver handed records out of order (Minion
//! §6) can open each by number; [`crate::Tls`] keeps the sequence numbers of an in-order
//! connection.

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, quic};
use rustls::ConnectionTrafficSecrets;

use crate::TlsError;

/// Length of a record header: type, legacy version, length (RFC 8446 §5.1).
pub const HEADER_LEN: usize = 5;
/// Length of the AEAD tag of every TLS 1.3 suite.
pub const TAG_LEN: usize = 16;
/// Most content bytes one record may carry: 2^14 (RFC 8446 §5.1).
pub const MAX_PLAINTEXT_LEN: usize = 1 << 14;
/// Longest inner plaintext (content, type, padding): 2^14 + 1 (RFC 8446 §5.4).
pub const MAX_INNER_PLAINTEXT_LEN: usize = MAX_PLAINTEXT_LEN + 1;
/// Longest protected fragment, the header's length field at most: 2^14 + 256 (RFC 8446 §5.2).
pub const MAX_CIPHERTEXT_LEN: usize = MAX_PLAINTEXT_LEN + 256;
/// Longest record on the wire, header included.
pub const MAX_RECORD_LEN: usize = HEADER_LEN + MAX_CIPHERTEXT_LEN;
/// The legacy_record_version of every TLS 1.3 protected record (RFC 8446 §5.2).
pub const LEGACY_RECORD_VERSION: [u8; 2] = [0x03, 0x03];

/// Content types (RFC 8446 §5.1, §B.1).
pub mod content_type {
    /// change_cipher_spec: only as an unprotected compatibility record during the handshake.
    pub const CHANGE_CIPHER_SPEC: u8 = 20;
    /// alert.
    pub const ALERT: u8 = 21;
    /// handshake.
    pub const HANDSHAKE: u8 = 22;
    /// application_data; also the outer type of every protected record.
    pub const APPLICATION_DATA: u8 = 23;
}

/// Wire length of one protected record holding `content_len` content bytes and `padding`
/// zero bytes of padding: header, content, content type, padding, tag.
pub const fn sealed_record_len(content_len: usize, padding: usize) -> usize {
    HEADER_LEN + content_len + 1 + padding + TAG_LEN
}

/// Checks the header of a protected record and returns the record's whole length on the wire
/// (header included). Only the first [`HEADER_LEN`] bytes of `header` are read.
///
/// Errors: an outer type other than application_data is [`TlsError::UnexpectedMessage`]
/// (RFC 8446 §5: an unexpected record type; §5.2: the outer type is always 23); a length
/// above 2^14 + 256 is [`TlsError::RecordOverflow`] (RFC 8446 §5.2). The legacy version is not
/// checked here: it is part of the additional data, so a wrong one fails to decrypt.
///
/// # Panics
/// If `header` is shorter than [`HEADER_LEN`].
pub fn protected_record_len(header: &[u8]) -> Result<usize, TlsError> {
    if header[0] != content_type::APPLICATION_DATA {
        return Err(TlsError::UnexpectedMessage);
    }
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > MAX_CIPHERTEXT_LEN {
        return Err(TlsError::RecordOverflow);
    }
    Ok(HEADER_LEN + len)
}

/// The AEAD of a TLS 1.3 cipher suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Aead {
    /// AES-128-GCM (TLS_AES_128_GCM_SHA256).
    Aes128Gcm,
    /// AES-256-GCM (TLS_AES_256_GCM_SHA384).
    Aes256Gcm,
    /// ChaCha20-Poly1305 (TLS_CHACHA20_POLY1305_SHA256).
    ChaCha20Poly1305,
}

/// One direction's traffic key and iv for one key epoch (RFC 8446 §7.3).
pub struct RecordKeys {
    aead: Aead,
    key: LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    /// The raw block function (AES) or stream cipher (ChaCha20) under the same key, for
    /// [`RecordKeys::keystream_prefix`].
    keystream: quic::HeaderProtectionKey,
}

impl std::fmt::Debug for RecordKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordKeys")
            .field("aead", &self.aead)
            .finish_non_exhaustive()
    }
}

impl RecordKeys {
    /// Keys from the traffic secrets rustls derived (the `ExtractedSecrets` of the handshake,
    /// or a `KernelConnection` key update).
    pub fn from_secrets(secrets: &ConnectionTrafficSecrets) -> Result<Self, TlsError> {
        let (aead_kind, key, iv, aead_alg, block_alg) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                (Aead::Aes128Gcm, key, iv, &aead::AES_128_GCM, &quic::AES_128)
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                (Aead::Aes256Gcm, key, iv, &aead::AES_256_GCM, &quic::AES_256)
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (
                Aead::ChaCha20Poly1305,
                key,
                iv,
                &aead::CHACHA20_POLY1305,
                &quic::CHACHA20,
            ),
            _ => {
                return Err(TlsError::Config(
                    "traffic secrets of an AEAD this record layer does not implement".into(),
                ));
            }
        };
        let bad_key = |_| TlsError::Config("traffic key of the wrong length".into());
        let unbound = UnboundKey::new(aead_alg, key.as_ref()).map_err(bad_key)?;
        let keystream = quic::HeaderProtectionKey::new(block_alg, key.as_ref()).map_err(bad_key)?;
        let iv: [u8; aead::NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| TlsError::Config("traffic iv of the wrong length".into()))?;
        Ok(RecordKeys {
            aead: aead_kind,
            key: LessSafeKey::new(unbound),
            iv,
            keystream,
        })
    }

    /// The AEAD these keys are for.
    pub fn aead(&self) -> Aead {
        self.aead
    }

    /// The per-record nonce: the iv XOR the sequence number, big-endian in the last 8 bytes
    /// (RFC 8446 §5.3).
    pub fn nonce(&self, seq: u64) -> [u8; aead::NONCE_LEN] {
        let mut nonce = self.iv;
        for (n, s) in nonce[aead::NONCE_LEN - 8..]
            .iter_mut()
            .zip(seq.to_be_bytes())
        {
            *n ^= s;
        }
        nonce
    }

    /// Appends one whole protected record (header included) carrying `plaintext` as content of
    /// type `content_type`, sealed as record number `seq`, without padding.
    ///
    /// # Panics
    /// If `plaintext` is longer than 2^14 bytes.
    pub fn seal(&self, seq: u64, content_type: u8, plaintext: &[u8], out: &mut Vec<u8>) {
        self.seal_padded(seq, content_type, plaintext, 0, out);
    }

    /// Like [`RecordKeys::seal`], with `padding` zero bytes after the content type
    /// (RFC 8446 §5.4).
    ///
    /// # Panics
    /// If the inner plaintext (`plaintext`, the type byte and `padding`) is longer than
    /// 2^14 + 1 bytes.
    pub fn seal_padded(
        &self,
        seq: u64,
        content_type: u8,
        plaintext: &[u8],
        padding: usize,
        out: &mut Vec<u8>,
    ) {
        self.seal_prefixed(seq, content_type, &[], plaintext, padding, out);
    }

    /// Like [`RecordKeys::seal_padded`], with the content being `prefix` followed by
    /// `plaintext` (a numbered record's prefix, [`crate::unordered`]).
    ///
    /// # Panics
    /// If the inner plaintext is longer than 2^14 + 1 bytes.
    pub fn seal_prefixed(
        &self,
        seq: u64,
        content_type: u8,
        prefix: &[u8],
        plaintext: &[u8],
        padding: usize,
        out: &mut Vec<u8>,
    ) {
        let start = out.len();
        out.reserve(HEADER_LEN + prefix.len() + plaintext.len() + 1 + padding + TAG_LEN);
        out.extend_from_slice(&[0; HEADER_LEN]);
        out.extend_from_slice(prefix);
        out.extend_from_slice(plaintext);
        self.seal_in_place(seq, content_type, padding, out, start);
    }

    /// Seals the record that starts at `out[start]` where it is: `out[start..start + 5]` is
    /// room for its header (overwritten), everything after it the content; appends the
    /// content type, `padding` zero bytes and the tag. The record's plaintext is not copied.
    ///
    /// # Panics
    /// If `out` is shorter than `start + 5`, or the inner plaintext (the content, the type
    /// byte and `padding`) is longer than 2^14 + 1 bytes.
    pub fn seal_in_place(
        &self,
        seq: u64,
        content_type: u8,
        padding: usize,
        out: &mut Vec<u8>,
        start: usize,
    ) {
        let body_start = start + HEADER_LEN;
        let inner_len = out.len() - body_start + 1 + padding;
        assert!(
            inner_len <= MAX_INNER_PLAINTEXT_LEN,
            "TLS inner plaintext of {inner_len} bytes exceeds 2^14 + 1"
        );
        let fragment_len = inner_len + TAG_LEN;
        let len = u16::try_from(fragment_len).expect("fragment length fits the header");
        let header = [
            content_type::APPLICATION_DATA,
            LEGACY_RECORD_VERSION[0],
            LEGACY_RECORD_VERSION[1],
            len.to_be_bytes()[0],
            len.to_be_bytes()[1],
        ];
        out[start..body_start].copy_from_slice(&header);
        out.reserve(1 + padding + TAG_LEN);
        out.push(content_type);
        out.resize(out.len() + padding, 0);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(self.nonce(seq)),
                Aad::from(header),
                &mut out[body_start..],
            )
            .expect("AEAD input within limits");
        out.extend_from_slice(tag.as_ref());
    }

    /// Opens one whole protected record (header included) as record number `seq`, in place,
    /// and returns its content type and content (padding removed).
    ///
    /// Errors: header errors as [`protected_record_len`], and a length field that does not
    /// match `record.len()` is [`TlsError::BadRecord`]; a record that does not authenticate
    /// is [`TlsError::Decrypt`] (RFC 8446 §5.2); an inner plaintext longer than 2^14 + 1 is
    /// [`TlsError::RecordOverflow`]; one of only zeros is [`TlsError::UnexpectedMessage`]
    /// (RFC 8446 §5.4).
    pub fn open_in_place<'a>(
        &self,
        seq: u64,
        record: &'a mut [u8],
    ) -> Result<(u8, &'a [u8]), TlsError> {
        if record.len() < HEADER_LEN {
            return Err(TlsError::BadRecord);
        }
        if protected_record_len(record)? != record.len() {
            return Err(TlsError::BadRecord);
        }
        let (header, body) = record.split_at_mut(HEADER_LEN);
        let header: [u8; HEADER_LEN] = (*header).try_into().expect("5 bytes");
        let inner = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(self.nonce(seq)),
                Aad::from(header),
                body,
            )
            .map_err(|_| TlsError::Decrypt)?;
        if inner.len() > MAX_INNER_PLAINTEXT_LEN {
            return Err(TlsError::RecordOverflow);
        }
        let type_at = inner
            .iter()
            .rposition(|&b| b != 0)
            .ok_or(TlsError::UnexpectedMessage)?;
        let inner: &'a [u8] = inner;
        Ok((inner[type_at], &inner[..type_at]))
    }

    /// The first 5 bytes of the keystream that encrypts the first plaintext block of record
    /// `seq`: XORed with the first 5 ciphertext bytes after the header they give the first 5
    /// bytes of the inner plaintext, without the tag (to recognise a record's start before the
    /// whole record is there).
    ///
    /// AES-GCM encrypts the first block with counter block `nonce ‖ 00000002` (J0 + 1,
    /// J0 = `nonce ‖ 00000001`); ChaCha20-Poly1305 with block counter 1 (block 0 makes the
    /// Poly1305 key).
    pub fn keystream_prefix(&self, seq: u64) -> [u8; 5] {
        let nonce = self.nonce(seq);
        let mut sample = [0u8; 16];
        match self.aead {
            Aead::Aes128Gcm | Aead::Aes256Gcm => {
                sample[..12].copy_from_slice(&nonce);
                sample[12..].copy_from_slice(&2u32.to_be_bytes());
            }
            Aead::ChaCha20Poly1305 => {
                sample[..4].copy_from_slice(&1u32.to_le_bytes());
                sample[4..].copy_from_slice(&nonce);
            }
        }
        self.keystream
            .new_mask(&sample)
            .expect("sample is 16 bytes")
    }
}
