//! rustls configurations for squarepeg: TLS 1.3 only, ring as the crypto provider, secret
//! extraction on (the record layer needs the traffic secrets), no ALPN unless the caller sets
//! `alpn_protocols` on a clone; and self-signed certificates for labs and tests.

use std::fmt;
use std::sync::Arc;

use ring::digest;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms, ring as ring_provider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme, SupportedCipherSuite,
};

use crate::TlsError;

/// The TLS 1.3 cipher suites squarepeg's record layer implements, in rustls's order of
/// preference: AES-256-GCM, AES-128-GCM, ChaCha20-Poly1305 (RFC 8446 §B.4).
pub const TLS13_SUITES: [SupportedCipherSuite; 3] = [
    ring_provider::cipher_suite::TLS13_AES_256_GCM_SHA384,
    ring_provider::cipher_suite::TLS13_AES_128_GCM_SHA256,
    ring_provider::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
];

/// How a client decides to trust the server's certificate.
#[derive(Clone, PartialEq, Eq)]
pub enum Trust {
    /// The operating system's root certificates (read once, when the configuration is built),
    /// with the usual WebPKI checks: chain, validity dates and the server name.
    SystemRoots,
    /// The CA certificates in this PEM (one or more `CERTIFICATE` blocks), with the usual
    /// WebPKI checks: chain, validity dates and the server name.
    CaPem(Vec<u8>),
    /// Exactly the end-entity certificate whose DER has this SHA-256 (as
    /// [`SelfSigned::fingerprint`]); name, issuer and dates are not checked. The server must
    /// still prove it holds the certificate's key (the CertificateVerify signature is checked).
    PinnedSha256([u8; 32]),
    /// **Any certificate at all.** Gives no protection against an active attacker: for labs
    /// and tests only. (The CertificateVerify signature is still checked against whatever
    /// certificate the server presents.)
    Insecure,
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trust::SystemRoots => f.write_str("SystemRoots"),
            Trust::CaPem(pem) => write!(f, "CaPem({} bytes)", pem.len()),
            Trust::PinnedSha256(fp) => write!(f, "PinnedSha256({})", fingerprint_hex(fp)),
            Trust::Insecure => f.write_str("Insecure"),
        }
    }
}

/// A client configuration offering all of [`TLS13_SUITES`].
pub fn client_config(trust: Trust) -> Result<Arc<ClientConfig>, TlsError> {
    client_config_with_suites(trust, &TLS13_SUITES)
}

/// A client configuration offering only `suites` (TLS 1.3 suites, in order of preference).
pub fn client_config_with_suites(
    trust: Trust,
    suites: &[SupportedCipherSuite],
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider(suites)?;
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?;
    let mut config = match trust {
        Trust::SystemRoots => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsError::Config(format!(
                    "no usable system root certificates ({} errors reading them)",
                    found.errors.len()
                )));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Trust::CaPem(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                roots.add(cert.map_err(pem_error)?).map_err(config_error)?;
            }
            if roots.is_empty() {
                return Err(TlsError::Config("no CA certificate in the PEM".into()));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Trust::PinnedSha256(fingerprint) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyOrPinnedCertificate {
                pinned: Some(fingerprint),
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        Trust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyOrPinnedCertificate {
                pinned: None,
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
    };
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}

/// A server configuration presenting the certificate chain in `cert_chain_pem` (end entity
/// first) with the private key in `key_pem` (PKCS#8, PKCS#1 or SEC1), accepting all of
/// [`TLS13_SUITES`], no client authentication, no early data.
pub fn server_config(cert_chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with_suites(cert_chain_pem, key_pem, &TLS13_SUITES)
}

/// As [`server_config`], accepting only `suites`.
pub fn server_config_with_suites(
    cert_chain_pem: &[u8],
    key_pem: &[u8],
    suites: &[SupportedCipherSuite],
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if chain.is_empty() {
        return Err(TlsError::Config("no certificate in the PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(pem_error)?;
    let mut config = ServerConfig::builder_with_provider(provider(suites)?)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(config_error)?;
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}

/// `config` accepting TLS 1.3 early data (0-RTT, RFC 8446 §2.3), up to
/// `max_early_data_size` bytes per connection, from returning clients.
///
/// Only with single-use tickets: rustls accepts early data only from its stateful session
/// store (the default), which takes a ticket out when it is used, so a replayed ClientHello
/// with early data finds no ticket, gets a full handshake and has its early data skipped
/// (RFC 8446 §8.1). The store is per `ServerConfig` (and shared by its clones): servers that
/// share a name but not a configuration each refuse the other's tickets.
pub fn server_accepting_early_data(
    config: &ServerConfig,
    max_early_data_size: u32,
) -> Result<Arc<ServerConfig>, TlsError> {
    if config.ticketer.enabled() {
        return Err(TlsError::Config(
            "early data needs single-use (stateful) tickets, not a ticketer".into(),
        ));
    }
    let mut config = config.clone();
    config.max_early_data_size = max_early_data_size;
    // Tickets are single use: one per connection the client may open before it is back.
    config.send_tls13_tickets = config.send_tls13_tickets.max(2);
    // The answer to early data goes in the server's first flight (0.5-RTT, RFC 8446 §4.4.4;
    // no client certificates here, so it goes to whoever resumed the session).
    config.send_half_rtt_data = true;
    Ok(Arc::new(config))
}

/// `config` offering early data (0-RTT) to servers it holds a ticket from. Clones of a
/// configuration share its ticket store: reuse one configuration for every connection to
/// the same servers, or returning connections find no ticket.
pub fn client_offering_early_data(config: &ClientConfig) -> Arc<ClientConfig> {
    let mut config = config.clone();
    config.enable_early_data = true;
    Arc::new(config)
}

/// A self-signed certificate with its key, both PEM, and the SHA-256 of the certificate's DER
/// (what [`Trust::PinnedSha256`] pins).
#[derive(Clone)]
pub struct SelfSigned {
    /// The certificate, one PEM `CERTIFICATE` block.
    pub cert_pem: String,
    /// Its private key (ECDSA P-256), PEM PKCS#8.
    pub key_pem: String,
    /// SHA-256 of the certificate's DER.
    pub fingerprint: [u8; 32],
}

impl fmt::Debug for SelfSigned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelfSigned")
            .field("fingerprint", &fingerprint_hex(&self.fingerprint))
            .finish_non_exhaustive()
    }
}

/// A new self-signed certificate (ECDSA P-256, rcgen) for `names`: DNS names or IP addresses,
/// each a subject alternative name.
pub fn self_signed(names: &[String]) -> Result<SelfSigned, TlsError> {
    let certified = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| TlsError::Config(format!("self-signed certificate: {e}")))?;
    Ok(SelfSigned {
        cert_pem: certified.cert.pem(),
        key_pem: certified.signing_key.serialize_pem(),
        fingerprint: sha256(certified.cert.der()),
    })
}

/// SHA-256 of a DER certificate, as [`Trust::PinnedSha256`] compares it.
pub fn certificate_fingerprint(cert: &CertificateDer<'_>) -> [u8; 32] {
    sha256(cert.as_ref())
}

/// A fingerprint as lowercase hex bytes joined by colons, `ab:cd:…`.
pub fn fingerprint_hex(fingerprint: &[u8; 32]) -> String {
    let mut s = String::with_capacity(32 * 3);
    for (i, b) in fingerprint.iter().enumerate() {
        if i > 0 {
            s.push(':');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Reads a fingerprint written as 64 hex digits, with or without colons, in either case.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32], TlsError> {
    let digits: Vec<u8> = text.bytes().filter(|&b| b != b':').collect();
    let bad = || TlsError::Config(format!("not a SHA-256 fingerprint: {text:?}"));
    if digits.len() != 64 {
        return Err(bad());
    }
    let mut fingerprint = [0u8; 32];
    for (byte, pair) in fingerprint.iter_mut().zip(digits.chunks(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(fingerprint)
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    digest::digest(&digest::SHA256, bytes)
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

fn provider(suites: &[SupportedCipherSuite]) -> Result<Arc<CryptoProvider>, TlsError> {
    if suites.is_empty() {
        return Err(TlsError::Config("no cipher suite".into()));
    }
    if let Some(other) = suites.iter().find(|s| !TLS13_SUITES.contains(s)) {
        return Err(TlsError::Config(format!(
            "{:?} is not a TLS 1.3 suite of the ring provider",
            other.suite()
        )));
    }
    Ok(Arc::new(CryptoProvider {
        cipher_suites: suites.to_vec(),
        ..ring_provider::default_provider()
    }))
}

fn config_error(e: rustls::Error) -> TlsError {
    TlsError::Config(e.to_string())
}

fn pem_error(e: rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Config(format!("PEM: {e}"))
}

/// The verifier of [`Trust::PinnedSha256`] (`pinned: Some`) and [`Trust::Insecure`]
/// (`pinned: None`). Both check the handshake signature with the presented certificate's key
/// (RFC 8446 §4.4.3).
#[derive(Debug)]
struct AnyOrPinnedCertificate {
    pinned: Option<[u8; 32]>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyOrPinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.pinned {
            Some(pinned) if certificate_fingerprint(end_entity) != pinned => Err(
                rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure),
            ),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
